"""Mixed precision for the simulated WSE (importing it never imports TensorFlow).

Half dtypes (``float16`` default, ``bfloat16``, ``cbfloat16``; ``"float32"``
turns half rounding off for parity checks) with
:func:`set_half_dtype` / :func:`get_half_dtype` / :func:`round_to_half`, and
loss scaling with :class:`GradScaler` (static or dynamic, optional global
gradient clipping), following the Cerebras ``amp`` contract.

:func:`optimizer_step` (loss scaling from a model_fn, on CPU/GPU and on the
simulated WSE) needs TensorFlow: it lives in ``tf_loss_scaling``, the one
module here that imports TF, imported on first use.
"""
from typing import Any

from cerebras_tf.amp.dtypes import (
    FLOAT32_MODE,
    HALF_DTYPES,
    HalfFormat,
    get_half_dtype,
    half_format,
    round_to_half,
    set_half_dtype,
)
from cerebras_tf.amp.grad_scaler import (
    GradScaler,
    UnscaleResult,
    clip_by_global_norm,
    clip_by_value,
    global_norm,
)

__all__ = [
    "FLOAT32_MODE",
    "HALF_DTYPES",
    "GradScaler",
    "HalfFormat",
    "UnscaleResult",
    "clip_by_global_norm",
    "clip_by_value",
    "get_half_dtype",
    "global_norm",
    "half_format",
    "optimizer_step",
    "round_to_half",
    "set_half_dtype",
]


def __getattr__(name: str) -> Any:
    if name == "optimizer_step":
        from cerebras_tf.amp.tf_loss_scaling import optimizer_step  # imports TF

        globals()[name] = optimizer_step
        return optimizer_step
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
