"""Loss scaling for the simulated WSE, following the Cerebras ``GradScaler`` contract.

One training step on the executor::

    loss_for_backward = scaler.scale_loss(loss)          # or seed dloss = scaler.scale
    grads = backward(loss_for_backward)                  # float32 arrays, scaled
    res = scaler.unscale_and_check(grads)                # unscale, finiteness, clipping
    if res.finite:                                       # non-finite step: skip the
        optimizer.apply(res.grads)                       # update; weights, slots and
    scaler.update(res.finite)                            # counters stay as they were

(:meth:`GradScaler.step` does the last three lines given an ``apply`` callback.)

Semantics (the Cerebras ``cstorch.amp.GradScaler`` ones unless said otherwise):

* ``loss_scale=None`` means no scaling (static scale 1.0); a number is a static
  scale that never changes; ``"dynamic"`` enables dynamic loss scaling.
* Defaults (Cerebras): ``init_scale = max_loss_scale = 2**15`` (``2**31`` when the
  half dtype is cbfloat16: the selected one at construction, or the
  ``half_dtype`` argument), ``steps_per_increase = 2000``, ``min_loss_scale = 2**-14``
  (smaller is refused), ``overflow_tolerance = 0``.
  2**15 and 2000 are also the PyTorch/fairseq conventions (TF's
  LossScaleOptimizer uses the same 2000 growth steps).
* Dynamic update, once per step: counters ``steps_since_rescale`` and
  ``overflows_since_rescale`` count steps (finite or not) and non-finite steps
  since the scale last changed. After counting the current step, if
  ``overflows_since_rescale / steps_since_rescale > overflow_tolerance`` the scale
  halves and both counters reset; otherwise, once ``steps_since_rescale`` reaches
  ``steps_per_increase`` the scale doubles and the counters reset. The scale is
  then clamped to ``[min_loss_scale, max_loss_scale]``. With the default
  tolerance 0 every non-finite step halves the scale and the scale doubles after
  ``steps_per_increase`` consecutive finite steps. With tolerance ``t > 0`` an
  overflow is tolerated while overflows make up at most a fraction ``t`` of the
  steps since the last rescale (so the first step after a rescale overflowing
  always halves, for ``t < 1``); tolerated overflow steps are still skipped and
  still count towards ``steps_per_increase``.
  (Difference: cstorch doubles when the counter *exceeds* steps_per_increase,
  i.e. one step later; we double on reaching it, as TF and PyTorch do.)
* Every mode skips a non-finite step (cstorch's static mode would apply it; a
  NaN update ruins the weights, and the WSE design forbids it).
* ``max_gradient_norm`` (global clipping, "GCC") applies in dynamic mode only,
  as documented by Cerebras; it uses ``tf.clip_by_global_norm``'s formula so the
  CPU path (real TF ops) and the executor agree. ``max_gradient_value`` clips
  every element to ``[-v, v]`` after that, in every mode. ``optimizer_step``'s
  own clipping arguments apply in every mode (:meth:`GradScaler.for_optimizer_step`).

Gradients are unscaled by multiplying with the float32 reciprocal of the scale
(as TF's LossScaleOptimizer does). ``finite`` means every unscaled gradient
element is finite; the global norm is computed in float32 like TF (falling back
to float64 accumulation if only the float32 sum of squares overflowed).
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from cerebras_tf.amp.dtypes import get_half_dtype

__all__ = [
    "GradScaler",
    "UnscaleResult",
    "clip_by_global_norm",
    "clip_by_value",
    "global_norm",
]

MIN_LOSS_SCALE = 2.0 ** -14


class UnscaleResult(NamedTuple):
    """What :meth:`GradScaler.unscale_and_check` returns.

    ``grads``: unscaled (and, if enabled, clipped) float32 gradients.
    ``finite``: False means the caller must skip the optimizer update.
    ``global_norm``: global L2 norm of the unscaled gradients before clipping
    (inf/nan when not finite).
    """

    grads: list[np.ndarray]
    finite: bool
    global_norm: float


def _f32(g: Any) -> np.ndarray:
    return np.asarray(g, dtype=np.float32)


def _norm_and_finite(grads: Sequence[np.ndarray]) -> tuple[np.float32, bool]:
    """Global L2 norm (float32) and whether every element is finite, in one BLAS pass."""
    sq = [np.dot(g.ravel(), g.ravel()) for g in grads]  # float32 sdot; inf/nan propagate
    total = np.float32(np.sum(np.asarray(sq, dtype=np.float32))) if sq else np.float32(0.0)
    if np.isfinite(total):
        return np.sqrt(total), True
    finite = all(bool(np.isfinite(g).all()) for g in grads)
    if not finite:
        return np.float32(np.inf if not np.isnan(total) else np.nan), False
    # Finite but huge gradients: the float32 sum of squares overflowed.
    total64 = sum(float(np.dot(g.ravel().astype(np.float64), g.ravel().astype(np.float64))) for g in grads)
    return np.float32(math.sqrt(total64)), True


def global_norm(grads: Sequence[Any]) -> float:
    """Global L2 norm of a list of arrays (``tf.linalg.global_norm``), as a float."""
    return float(_norm_and_finite([_f32(g) for g in grads])[0])


def _clip_scale(norm: np.float32, clip_norm: float) -> np.float32:
    """``tf.clip_by_global_norm``'s factor, computed in float32 exactly as TF does."""
    c = np.float32(clip_norm)
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = c * np.minimum(np.float32(1.0) / norm, np.float32(1.0) / c)
        return np.float32(factor + (norm - norm))  # nan when the norm is not finite


def clip_by_global_norm(
    grads: Sequence[Any], clip_norm: float, use_norm: float | None = None
) -> tuple[list[np.ndarray], float]:
    """numpy ``tf.clip_by_global_norm``: ``(clipped grads, global norm before clipping)``.

    Each gradient is multiplied by ``clip_norm * min(1/norm, 1/clip_norm)``
    (float32); a non-finite norm makes every value NaN, as in TF.
    """
    if clip_norm <= 0 or not math.isfinite(clip_norm):
        raise ValueError(f"clip_norm must be a positive finite number, got {clip_norm!r}")
    arrays = [_f32(g) for g in grads]
    norm = np.float32(use_norm) if use_norm is not None else _norm_and_finite(arrays)[0]
    factor = _clip_scale(norm, clip_norm)
    if factor == np.float32(1.0):
        return [a.copy() for a in arrays], float(norm)
    return [a * factor for a in arrays], float(norm)


def clip_by_value(grads: Sequence[Any], max_value: float) -> list[np.ndarray]:
    """Clip every gradient element to ``[-max_value, max_value]`` (NaN stays NaN)."""
    if max_value <= 0 or not math.isfinite(max_value):
        raise ValueError(f"max_value must be a positive finite number, got {max_value!r}")
    m = np.float32(max_value)
    return [np.clip(_f32(g), -m, m) for g in grads]


def _positive_or_none(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if not (isinstance(value, (int, float, np.floating, np.integer)) and value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


class GradScaler:
    """Static or dynamic loss scaling with optional global gradient clipping (numpy).

    Args (Cerebras ``cstorch.amp.GradScaler`` names and meaning; see the module
    docstring for the exact update rule and defaults):
        loss_scale: ``"dynamic"``, a positive static scale, or None (no scaling).
        init_scale: initial dynamic scale (default ``max_loss_scale``).
        steps_per_increase: steps without a rescale after which the scale doubles.
        min_loss_scale / max_loss_scale: bounds of the dynamic scale.
        overflow_tolerance: maximum fraction of non-finite steps (since the last
            rescale) tolerated before the scale is halved.
        max_gradient_norm: global-norm clipping of the unscaled gradients
            (dynamic mode only).
        max_gradient_value: clip every unscaled (norm-clipped) gradient element
            to ``[-max_gradient_value, max_gradient_value]`` (every mode).
        half_dtype: the half dtype the default ``max_loss_scale`` is chosen for
            (default: the selected one, :func:`get_half_dtype`).

    cstorch's ``scale(loss)`` is :meth:`scale_loss` here (``scale`` is the value);
    ``state_dict()`` has the same four keys in every mode.
    """

    def __init__(
        self,
        loss_scale: str | float | None = None,
        init_scale: float | None = None,
        steps_per_increase: int | None = None,
        min_loss_scale: float | None = None,
        max_loss_scale: float | None = None,
        overflow_tolerance: float = 0.0,
        max_gradient_norm: float | None = None,
        max_gradient_value: float | None = None,
        half_dtype: str | None = None,
    ) -> None:
        default_max = 2.0 ** 31 if (half_dtype or get_half_dtype()) == "cbfloat16" else 2.0 ** 15
        self.max_loss_scale = float(max_loss_scale) if max_loss_scale else default_max
        self.min_loss_scale = float(min_loss_scale) if min_loss_scale else MIN_LOSS_SCALE
        self.steps_per_increase = int(steps_per_increase) if steps_per_increase else 2000
        self.overflow_tolerance = float(overflow_tolerance)
        self.steps_since_rescale = 0
        self.overflows_since_rescale = 0
        self.num_skipped_steps = 0
        self.max_gradient_value = _positive_or_none(max_gradient_value, "max_gradient_value")

        if isinstance(loss_scale, str):
            if loss_scale != "dynamic":
                raise ValueError(f"loss_scale must be 'dynamic', a positive number or None, got {loss_scale!r}")
            if self.min_loss_scale < MIN_LOSS_SCALE:
                raise ValueError(f"min_loss_scale too small: {self.min_loss_scale!r} < 2**-14")
            if self.max_loss_scale < self.min_loss_scale:
                raise ValueError(
                    f"max_loss_scale ({self.max_loss_scale!r}) < min_loss_scale ({self.min_loss_scale!r})"
                )
            if self.overflow_tolerance < 0 or math.isnan(self.overflow_tolerance):
                raise ValueError(f"overflow_tolerance must be >= 0, got {overflow_tolerance!r}")
            if self.steps_per_increase < 1:
                raise ValueError(f"steps_per_increase must be >= 1, got {steps_per_increase!r}")
            if max_gradient_norm is not None and not (max_gradient_norm > 0 and math.isfinite(max_gradient_norm)):
                raise ValueError(f"max_gradient_norm must be a positive finite number, got {max_gradient_norm!r}")
            self.dynamic = True
            init = float(init_scale) if init_scale else self.max_loss_scale
            self._scale = min(max(init, self.min_loss_scale), self.max_loss_scale)
            self.init_scale = self._scale
            self.max_gradient_norm = float(max_gradient_norm) if max_gradient_norm else None
        else:
            value = 1.0 if loss_scale is None else float(loss_scale)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"static loss_scale must be a positive finite number, got {loss_scale!r}")
            self.dynamic = False
            self._scale = self.init_scale = value
            if max_gradient_norm:
                warnings.warn(
                    "GradScaler(max_gradient_norm=...) only applies with loss_scale='dynamic' "
                    "(as on the CS system); use optimizer_step(max_gradient_norm=...) instead.",
                    stacklevel=2,
                )
            self.max_gradient_norm = None

    # -- the scale ---------------------------------------------------------
    @property
    def scale(self) -> float:
        """Current loss scale (float)."""
        return self._scale

    def get_scale(self) -> float:
        """Current loss scale (cstorch name)."""
        return self._scale

    def scale_loss(self, loss: Any) -> np.ndarray:
        """``loss * scale`` in float32 (the value to backpropagate)."""
        return np.asarray(loss, dtype=np.float32) * np.float32(self._scale)

    @property
    def reciprocal(self) -> np.float32 | None:
        """The float32 reciprocal of the current scale: unscaled gradients are the scaled ones times this; None
        at a scale of 1, where they are copied as they are (a product would flush denormals)."""
        return np.float32(1.0) / np.float32(self._scale) if self._scale != 1.0 else None

    @property
    def clips(self) -> bool:
        """Whether unscale_and_check clips the gradients (by global norm or by value); without clipping, a
        caller may unscale and check them itself: each times `reciprocal` (a copy when it is None), finite when
        every product is."""
        return self.max_gradient_norm is not None or self.max_gradient_value is not None

    # -- per step ----------------------------------------------------------
    def unscale_and_check(self, grads: Sequence[Any]) -> UnscaleResult:
        """Unscale ``grads`` (new float32 arrays), test finiteness, clip if enabled.

        When ``finite`` is False the returned gradients are unscaled but not
        clipped, and the caller must skip the optimizer update for this step.
        """
        arrays = [_f32(g) for g in grads]
        inv = self.reciprocal
        if inv is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                arrays = [a * inv for a in arrays]
        else:
            arrays = [a.copy() for a in arrays]
        norm, finite = _norm_and_finite(arrays)
        if finite and self.max_gradient_norm is not None:
            factor = _clip_scale(norm, self.max_gradient_norm)
            if factor != np.float32(1.0):
                for a in arrays:
                    a *= factor
        if finite and self.max_gradient_value is not None:
            m = np.float32(self.max_gradient_value)
            for a in arrays:
                np.clip(a, -m, m, out=a)
        return UnscaleResult(arrays, finite, float(norm))

    def update(self, finite: bool) -> float:
        """Advance the dynamic scale after a step (see module docstring); returns the new scale.

        Static scales never change. Counts skipped (non-finite) steps in every mode.
        """
        finite = bool(finite)
        if not finite:
            self.num_skipped_steps += 1
        if not self.dynamic:
            return self._scale
        self.steps_since_rescale += 1
        if not finite:
            self.overflows_since_rescale += 1
        scale = self._scale
        if self.overflows_since_rescale / self.steps_since_rescale > self.overflow_tolerance:
            scale /= 2.0
            self.steps_since_rescale = self.overflows_since_rescale = 0
        elif self.steps_since_rescale >= self.steps_per_increase:
            scale *= 2.0
            self.steps_since_rescale = self.overflows_since_rescale = 0
        self._scale = min(max(scale, self.min_loss_scale), self.max_loss_scale)
        return self._scale

    def step(self, grads: Sequence[Any], apply: Callable[[list[np.ndarray]], Any]) -> UnscaleResult:
        """Unscale/check/clip ``grads``, call ``apply(grads)`` only if finite, then update."""
        res = self.unscale_and_check(grads)
        if res.finite:
            apply(res.grads)
        self.update(res.finite)
        return res

    # -- configuration -----------------------------------------------------
    def config(self) -> dict[str, Any]:
        """JSON-able settings that rebuild this scaler with :meth:`from_config` (its state excluded)."""
        return {
            "loss_scale": "dynamic" if self.dynamic else float(self.init_scale),
            "init_scale": float(self.init_scale) if self.dynamic else None,
            "steps_per_increase": int(self.steps_per_increase),
            "min_loss_scale": float(self.min_loss_scale),
            "max_loss_scale": float(self.max_loss_scale),
            "overflow_tolerance": float(self.overflow_tolerance),
            "max_gradient_norm": self.max_gradient_norm,
            "max_gradient_value": self.max_gradient_value,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "GradScaler":
        """A fresh scaler from :meth:`config`; here ``max_gradient_norm`` applies in every mode."""
        settings = dict(config)
        norm = _positive_or_none(settings.pop("max_gradient_norm", None), "max_gradient_norm")
        scaler = cls(**settings)
        scaler.max_gradient_norm = norm
        return scaler

    @classmethod
    def for_optimizer_step(
        cls,
        grad_scaler: "GradScaler | None",
        max_gradient_norm: float | None = None,
        max_gradient_value: float | None = None,
    ) -> "GradScaler":
        """The scaler ``optimizer_step`` runs: ``grad_scaler``'s settings (None: no scaling) plus its clipping.

        ``max_gradient_norm`` and ``max_gradient_value`` are mutually exclusive
        (one clipping rule per call) and apply in every mode; with the scaler's own
        ``max_gradient_norm`` / ``max_gradient_value`` the smaller bound wins.
        """
        if max_gradient_norm is not None and max_gradient_value is not None:
            raise ValueError(
                f"Gradient clipping by norm ({max_gradient_norm}) and by value ({max_gradient_value}) are "
                "mutually exclusive: pass only one of max_gradient_norm and max_gradient_value.")
        if grad_scaler is not None and not isinstance(grad_scaler, GradScaler):
            raise TypeError(f"grad_scaler must be a cerebras_tf.amp.GradScaler or None, got {grad_scaler!r}")
        config = (grad_scaler if grad_scaler is not None else cls()).config()
        for key, value in (("max_gradient_norm", max_gradient_norm), ("max_gradient_value", max_gradient_value)):
            bounds = [b for b in (config[key], _positive_or_none(value, key)) if b is not None]
            config[key] = min(bounds) if bounds else None
        return cls.from_config(config)

    # -- checkpointing -----------------------------------------------------
    def state_dict(self) -> dict[str, float | int]:
        """Plain float/int state (checkpointable as TF variables)."""
        return {
            "loss_scale": float(self._scale),
            "steps_since_rescale": int(self.steps_since_rescale),
            "overflows_since_rescale": int(self.overflows_since_rescale),
            "num_skipped_steps": int(self.num_skipped_steps),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` (numpy scalars accepted; missing keys are kept).

        A static scaler keeps its configured scale (a checkpointed static scale is ignored).
        """
        if self.dynamic and "loss_scale" in state:
            value = float(state["loss_scale"])
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"invalid loss_scale in state: {value!r}")
            self._scale = value
        for key in ("steps_since_rescale", "overflows_since_rescale", "num_skipped_steps"):
            if key in state:
                setattr(self, key, int(state[key]))

    def __repr__(self) -> str:
        mode = "dynamic" if self.dynamic else "static"
        return f"GradScaler({mode}, scale={self._scale!r}, steps_since_rescale={self.steps_since_rescale})"
