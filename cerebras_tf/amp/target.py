"""Which target a model_fn is being built for (TF-free): plain TensorFlow, or the CS system.

`cerebras_tf.precheck` captures the model for the CS system inside
:func:`capturing_for_cs_system`; :func:`cerebras_tf.amp.optimizer_step` (cerebras_tf/amp/tf_loss_scaling.py) then
emits a plain optimizer update and records its loss-scaling settings (as JSON)
in the graph collection :data:`LOSS_SCALING_COLLECTION`, which the compiler
copies into ``Program.loss_scaling`` for the executor's GradScaler.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

__all__ = ["LOSS_SCALING_COLLECTION", "capturing_for_cs_system", "is_capturing_for_cs_system"]

LOSS_SCALING_COLLECTION = "cerebras_tf_loss_scaling"

_CS_CAPTURE: contextvars.ContextVar[bool] = contextvars.ContextVar("cerebras_tf_cs_capture", default=False)


@contextlib.contextmanager
def capturing_for_cs_system() -> Iterator[None]:
    """Within this block, model_fns are being captured for the (simulated) CS system."""
    token = _CS_CAPTURE.set(True)
    try:
        yield
    finally:
        _CS_CAPTURE.reset(token)


def is_capturing_for_cs_system() -> bool:
    """True while a model is captured for the CS system (loss scaling is then the executor's)."""
    return _CS_CAPTURE.get()
