"""Mixed precision for the simulated WSE (numpy only; never imports TensorFlow).

Half dtypes (``float16`` default, ``bfloat16``, ``cbfloat16``; ``"float32"``
turns half rounding off for parity checks) with
:func:`set_half_dtype` / :func:`get_half_dtype` / :func:`round_to_half`, and
loss scaling with :class:`GradScaler` (static or dynamic, optional global
gradient clipping), following the Cerebras ``amp`` contract.
"""
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
    "round_to_half",
    "set_half_dtype",
]
