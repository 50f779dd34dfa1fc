"""Helpers Model Zoo scripts import from ``cerebras.tf.tf_helper`` (R1.8: ``cerebras_tensorflow.summary``).

:class:`GetWeights` reads the weights of a TF checkpoint as numpy arrays (the
zoo's GPT-2/GPT-J scripts use it on resume to find the checkpoint's
global_step). Checkpoints of the simulated CS system are plain TF checkpoints,
so this is ``tf.train.load_checkpoint`` behind the zoo's interface.

The layer helpers of the zoo's layers (``boundary_casting=True``,
``tf_summary=True``):

- :func:`boundary_cast` rounds a layer's output to the run's half dtype on the
  simulated system, and the gradient flowing back through it too (as a cast
  to half and back, and its gradient, would); where the numerics are float32
  (float32 numerics on the system, and on CPU/GPU) it is the identity.
- :func:`summary_layer` returns its input and records histograms of the
  layer's activations and of the gradient flowing back into them;
  :func:`summarize_tensor` records one tensor (or a gradient). They are
  tf.compat.v1 summaries: written by the Estimator on CPU/GPU, computed on the
  system and written by the host there (unless cs1_disable_summaries()).
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import tensorflow as tf

__all__ = ["BOUNDARY_CASTS", "GetWeights", "boundary_cast", "summarize_tensor", "summary_layer"]

# The graph collection naming the Identity ops that are boundary casts (the compiler rounds them to half).
BOUNDARY_CASTS = "cerebras_tf_boundary_casts"


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


def boundary_cast(x: tf.Tensor, name: str | None = None, back_cast: bool = True) -> tf.Tensor:
    """`x` at a layer boundary in half precision (see the module docstring).

    back_cast=True (the zoo's use): a float32 tensor equal to `x`, rounded to
    the run's half dtype on the simulated system, and whose gradient is
    rounded the same way; the identity where the numerics are float32.
    back_cast=False: `x` cast to float16 everywhere (a float16 tensor).
    """
    if not back_cast:
        return tf.cast(x, tf.float16, name=name)

    @tf.custom_gradient
    def cast(value: tf.Tensor) -> Any:
        rounded = _marked_identity(value, name or "boundary_cast")

        def gradient(upstream: tf.Tensor) -> tf.Tensor:
            return _marked_identity(upstream, "boundary_cast_grad")

        return rounded, gradient

    return cast(x)


def _marked_identity(x: tf.Tensor, name: str) -> tf.Tensor:
    out = tf.identity(x, name=name)
    tf.compat.v1.add_to_collection(BOUNDARY_CASTS, out.op.name)
    return out


def summary_layer(x: tf.Tensor) -> tf.Tensor:
    """`x`, with histograms of it (tag `<x's op name>/activation`) and of the gradient flowing back into it
    (`<x's op name>/gradient`)."""
    tag = x.op.name

    @tf.custom_gradient
    def layer(value: tf.Tensor) -> Any:
        _histogram(f"{tag}/activation", value)

        def gradient(upstream: tf.Tensor) -> tf.Tensor:
            _histogram(f"{tag}/gradient", upstream)
            return tf.identity(upstream)

        return tf.identity(value), gradient

    return layer(x)


def summarize_tensor(x: tf.Tensor, is_gradient_tensor: bool = False, op_name_if_grad: str | None = None) -> None:
    """A histogram of `x` under its op name; with is_gradient_tensor, of `x` as the gradient of op
    `op_name_if_grad`, tagged `<op_name_if_grad>/gradient`. Returns None, as the Cerebras helper does."""
    _histogram(f"{op_name_if_grad or x.op.name}/gradient" if is_gradient_tensor else x.op.name, x)


def _histogram(tag: str, values: tf.Tensor) -> None:
    """A tf.compat.v1 histogram summary under exactly `tag` (tf.compat.v1.summary.histogram would prefix the
    name scope, e.g. the gradient scope, and make repeated names unique)."""
    summary = tf.raw_ops.HistogramSummary(tag=tag, values=values)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SUMMARIES, summary)
