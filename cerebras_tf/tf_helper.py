"""Helpers Model Zoo scripts import from ``cerebras.tf.tf_helper``.

:class:`GetWeights` reads the weights of a TF checkpoint as numpy arrays (the
zoo's GPT-2/GPT-J scripts use it on resume to find the checkpoint's
global_step). Checkpoints of the simulated CS system are plain TF checkpoints,
so this is ``tf.train.load_checkpoint`` behind the zoo's interface.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import tensorflow as tf

__all__ = ["GetWeights"]


class GetWeights:
    """The variables of one checkpoint, by name, as numpy arrays.

    ``GetWeights(path)``: `path` is a checkpoint prefix (``model_dir/model.ckpt-100``)
    or a directory, whose latest checkpoint is read. ``for name, value in
    weights`` (sorted by name; each loop reads afresh), ``weights[name]``,
    ``name in weights`` and ``weights.var_names``. A path holding no checkpoint
    raises FileNotFoundError; an unknown name raises KeyError.
    """

    def __init__(self, ckpt_path: str) -> None:
        path = str(ckpt_path)
        if tf.io.gfile.isdir(path):
            latest = tf.train.latest_checkpoint(path)
            if latest is None:
                raise FileNotFoundError(
                    f"GetWeights({ckpt_path!r}): the directory holds no TF checkpoint (no 'checkpoint' index "
                    "file naming one). Pass a checkpoint prefix such as model_dir/model.ckpt-1000, or the "
                    "model_dir of a run that saved one.")
            path = latest
        try:
            self._reader = tf.train.load_checkpoint(path)
        except (tf.errors.NotFoundError, tf.errors.DataLossError, ValueError) as exc:
            raise FileNotFoundError(
                f"GetWeights({ckpt_path!r}): no readable TF checkpoint at this path ({type(exc).__name__}). Pass a "
                "checkpoint prefix such as model_dir/model.ckpt-1000 (the name before .index), or a model_dir; "
                "tf.train.latest_checkpoint(model_dir) gives the newest prefix.") from None
        self.path = path
        self._var_names = tuple(sorted(self._reader.get_variable_to_shape_map()))

    @property
    def var_names(self) -> tuple[str, ...]:
        """The checkpoint's variable names, sorted."""
        return self._var_names

    def __iter__(self) -> Iterator[tuple[str, np.ndarray]]:
        for name in self._var_names:
            yield name, self[name]

    def __getitem__(self, var_name: str) -> np.ndarray:
        if var_name not in self._var_names:
            raise KeyError(f"{var_name!r} is not a variable of checkpoint {self.path}.")
        return self._reader.get_tensor(var_name)

    def __contains__(self, var_name: object) -> bool:
        return var_name in self._var_names

    def __len__(self) -> int:
        return len(self._var_names)

    def __repr__(self) -> str:
        return f"GetWeights({self.path!r}: {len(self)} variables)"
