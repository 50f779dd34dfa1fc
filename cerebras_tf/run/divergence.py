"""Stop a training run on the simulated WSE that diverged, as the Estimator stops one on CPU.

tf.estimator adds a NanTensorHook to every training run: on a step whose loss
is NaN it logs "Model diverged with loss = NaN." and raises
NanLossDuringTrainingError ("NaN loss during training."), before a checkpoint
of that step (or of any step since the last one saved) is written. A run on
the simulated WSE raises NanLossError (that type, that message first, then
what happened) in two cases:

1. The step's loss is NaN, unless the step is an ordinary overflow that loss
   scaling handles: its gradients were not finite, so the executor's
   GradScaler skipped it (no weight changed), and the batch itself is finite. Then
   the NaN comes from the half-precision range (e.g. activations past
   float16's 65504; TF on CPU computes in float32 and would not see it), and
   the step is skipped in silence, as before. NaN or Inf in the batch (which
   make the loss NaN in float32 as well), a NaN loss on a step that updated
   the weights, or in a model doing its own loss scaling, stop the run as
   NanTensorHook stops it on CPU.
2. The steps keep overflowing at the minimum loss scale:
   OVERFLOW_STEPS_AT_MIN_SCALE consecutive steps whose gradients are not
   finite, each run at the lowest scale the scaler allows (a dynamic scale at
   its min_loss_scale, 2**-14 by default, where scaling shrinks gradients
   rather than amplifying them; or a static scale, which never changes). A
   step with finite gradients resets the count. Left alone, such a run would
   skip every step and train nothing.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from cerebras_tf.amp import GradScaler
from cerebras_tf.errors import CerebrasError
from cerebras_tf.wse.executor import StepResult

_log = tf.compat.v1.logging

# Consecutive non-finite steps at the minimum loss scale that stop a run (see the module docstring).
OVERFLOW_STEPS_AT_MIN_SCALE = 5

# tf.compat.v1.train.NanLossDuringTrainingError's message, and what NanTensorHook logs before raising it.
NAN_LOSS_MESSAGE = "NaN loss during training."
DIVERGED_LOG = "Model diverged with loss = NaN."

_FIX = ("Look for NaN/Inf in the input data (e.g. dataset.map with tf.debugging.check_numerics), lower the "
        "learning rate, or clip the gradients (amp.optimizer_step(..., max_gradient_norm=...)); then train again: "
        "training resumes from the last checkpoint.")


class NanLossError(tf.compat.v1.train.NanLossDuringTrainingError, CerebrasError):
    """tf.estimator's NaN-loss error (a NanLossDuringTrainingError, its message first) for a run on the
    simulated WSE, saying at which step and why, and what to do."""

    tag = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> "NanLossError":
        # TF wraps NanLossDuringTrainingError.__new__ in a deprecation notice; this error is not deprecated.
        return RuntimeError.__new__(cls, *args)

    def __init__(self, detail: str, fix: str = _FIX) -> None:
        CerebrasError.__init__(self, f"{NAN_LOSS_MESSAGE} {detail}", fix=fix)

    def __str__(self) -> str:
        return self.render()


class DivergenceGuard:
    """Checks each training step's result; raises NanLossError before the step is logged or saved.

    `scaler` is the executor's GradScaler (None when the model does its own loss scaling: then only the
    loss is checked, as NanTensorHook checks it on CPU).
    """

    def __init__(self, scaler: GradScaler | None) -> None:
        self._scaler = scaler
        self._overflows_at_min = 0

    def after_step(self, result: StepResult, step: int, last_saved: int, batch: Any = None) -> None:
        """Raise NanLossError if step `step` diverged (`last_saved`: the global step of the last checkpoint;
        `batch`: the step's (features, labels), read only when the loss is NaN)."""
        unsaved = f"nothing after global step {last_saved} was saved (no checkpoint of the diverged step)."
        loss = result.loss
        if loss is not None and math.isnan(loss) and not self._half_precision_overflow(result, batch):
            _log.error(DIVERGED_LOG)
            cause = " (the batch holds NaN or Inf values)" if not _finite(batch) else ""
            raise NanLossError(f"The loss was NaN at global step {step} on the simulated WSE{cause}; {unsaved}")
        if self._scaler is None or result.finite:
            self._overflows_at_min = 0
            return
        self._overflows_at_min = self._overflows_at_min + 1 if self._at_minimum(result.loss_scale) else 0
        if self._overflows_at_min >= OVERFLOW_STEPS_AT_MIN_SCALE:
            _log.error(DIVERGED_LOG)
            scale = "the static loss scale" if not self._scaler.dynamic else "the minimum loss scale"
            loss_text = "unknown" if loss is None else f"{loss:g}"
            raise NanLossError(
                f"The gradients were not finite on {self._overflows_at_min} consecutive steps (up to global step "
                f"{step}, loss {loss_text}) at {scale} {result.loss_scale:g}: loss scaling cannot recover, every step "
                f"would be skipped. {unsaved[0].upper()}{unsaved[1:]}",
                fix=_FIX + ("" if self._scaler.dynamic else " With a static loss scale, try a smaller one or "
                            "GradScaler('dynamic').")
            )

    def _half_precision_overflow(self, result: StepResult, batch: Any) -> bool:
        """A NaN loss that loss scaling handles: the loss scaler skipped the step (gradients not finite), and
        the batch is finite (so float32, as TF computes on CPU, would not give NaN). If it happens again and
        again at the lowest scale, the second rule stops the run."""
        return self._scaler is not None and not result.finite and _finite(batch)

    def _at_minimum(self, scale: float | None) -> bool:
        assert self._scaler is not None
        return not self._scaler.dynamic or (scale is not None and scale <= self._scaler.min_loss_scale)


def _finite(batch: Any) -> bool:
    """Whether every floating-point value of a batch (numpy arrays, nested in dicts/tuples/lists) is finite."""
    if isinstance(batch, dict):
        return all(_finite(value) for value in batch.values())
    if isinstance(batch, (tuple, list)):
        return all(_finite(value) for value in batch)
    if batch is None:
        return True
    array = np.asarray(batch)
    return not np.issubdtype(array.dtype, np.floating) or bool(np.isfinite(array).all())
