"""``cerebras_tensorflow.saver.checkpoint_reader``: the Cerebras checkpoint reader, over TF checkpoints.

Checkpoints of the simulated CS system are plain TF checkpoints. The reader
reads one as TF's own reader does (``get_tensor``, ``has_tensor``,
``get_variable_to_shape_map``, ``get_variable_to_dtype_map``; a directory
means its latest checkpoint), and has the class methods R1.8's ``eval_all``
mode uses: ``all_checkpoints(model_dir)`` and ``is_a_checkpoint(path)``.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorflow as tf

from cerebras_tf.tf_helper import GetWeights

__all__ = ["CheckpointReader"]


class CheckpointReader(GetWeights):
    """A TF checkpoint's variables (GetWeights' path rules: a prefix, or a model_dir's latest)."""

    def get_tensor(self, name: str) -> np.ndarray:
        return self[name]

    def has_tensor(self, name: str) -> bool:
        return name in self

    def get_variable_to_shape_map(self) -> dict[str, list[int]]:
        return self._reader.get_variable_to_shape_map()

    def get_variable_to_dtype_map(self) -> dict[str, Any]:
        return self._reader.get_variable_to_dtype_map()

    @staticmethod
    def all_checkpoints(model_dir: str) -> list[str]:
        """Every checkpoint prefix model_dir's `checkpoint` file lists, oldest first ([] when it has none), as
        tf.train.get_checkpoint_state(model_dir).all_model_checkpoint_paths."""
        state = tf.train.get_checkpoint_state(model_dir)
        return list(state.all_model_checkpoint_paths) if state is not None else []

    @staticmethod
    def is_a_checkpoint(path: str) -> bool:
        """Whether `path` is a checkpoint prefix whose index file exists."""
        return tf.io.gfile.exists(f"{os.fspath(path)}.index")
