"""Reductions (axis attr: int, list or None = all; keep_dims), argmax/argmin, cumsum, band_part.

Integer mean truncates toward zero like TF; empty axis lists reduce nothing. A float sum or mean over a
contiguous array's leading axes adds its rows in one numba loop, in numpy's own order (outer_sum).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

from cerebras_tf.wse.kernels import _jit
from cerebras_tf.wse.kernels._registry import KernelContext, KernelFn, attr_ints, np_dtype, register
from cerebras_tf.wse.kernels.half import NO_ROUNDING, rounded
from cerebras_tf.wse.memory import empty_aligned


def _axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    return tuple(sorted({a + ndim if a < 0 else a for a in attr_ints(axis)}))


@_jit.jit
def _outer_sums(x2: np.ndarray, out: np.ndarray, x2_rounded: np.ndarray | None,
                rounding: int) -> None:  # pragma: no cover - compiled by numba
    """out[k] = the sum of x2[:, k], adding row after row (numpy's order for an outer-axis sum); with x2_rounded,
    each value of x2 also written there half.rounded (`rounding`) as it is added (None: a type of its own, numba
    compiles the loop without it)."""
    c = x2.shape[1]
    for k in range(c):
        out[k] = 0
    for r in range(x2.shape[0]):
        for k in range(c):
            v = x2[r, k]
            out[k] += v
            if x2_rounded is not None:
                x2_rounded[r, k] = rounded(v, rounding)


def _outer_applies(x: np.ndarray, axes: tuple[int, ...]) -> bool:
    return (_jit.enabled() and x.dtype in (np.float32, np.float64) and x.flags.c_contiguous
            and axes == tuple(range(len(axes))) and 0 < len(axes) < x.ndim and math.prod(x.shape[len(axes):]) >= 2)


def outer_sum(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray | None:
    """x.sum(axis=axes, dtype=x.dtype) where numba adds the rows in numpy's own order, the same bits: float x,
    C-contiguous, summed over its leading axes with at least two values kept (numpy sums one column
    pairwise). numpy's reduction over outer axes makes one short inner-loop call per row (the zoo CNN's
    batch-norm moments over 64x8x8x64: 0.054 ms hot, 0.017 in one loop). None where it does not apply."""
    if not _outer_applies(x, axes):
        return None
    out = np.empty(x.shape[len(axes):], x.dtype)
    _outer_sums(x.reshape(-1, out.size), out.reshape(-1), None, NO_ROUNDING)
    return out


def outer_sum_rounding(x: np.ndarray, axes: tuple[int, ...],
                       rounding: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(outer_sum(x, axes), x half.rounded as `rounding` says) in one pass over a float32 x, the same bits as
    the sum and round_half; None where outer_sum does not apply or there is no such rounding."""
    if rounding == NO_ROUNDING or x.dtype != np.float32 or not _outer_applies(x, axes):
        return None
    out = np.empty(x.shape[len(axes):], x.dtype)
    x_rounded = empty_aligned(x.shape, np.float32)
    _outer_sums(x.reshape(-1, out.size), out.reshape(-1), x_rounded.reshape(-1, out.size), rounding)
    return out, x_rounded


def sum_over(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """x.sum(axis=axes, dtype=x.dtype), the sum kernel's bits: by outer_sum where it applies."""
    fast = outer_sum(x, axes)
    return fast if fast is not None else x.sum(axis=axes, dtype=x.dtype)


def _make(reducer):
    def kernel(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
        x = np.asarray(inputs[0])
        axes = _axes(attrs.get("axis"), x.ndim)
        out = reducer(x, axes)
        if attrs.get("keep_dims") and axes:
            out = np.asarray(out).reshape([1 if i in axes else d for i, d in enumerate(x.shape)])
        return [np.asarray(out)]
    return kernel


def _mean(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if x.dtype.kind in "iu":
        n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        s = x.sum(axis=axes, dtype=x.dtype)
        return (np.sign(s) * (np.abs(s) // n)).astype(x.dtype)
    return sum_over(x, axes) / x.dtype.type(math.prod(x.shape[a] for a in axes) or 1)


register("sum")(_make(sum_over))
register("mean")(_make(_mean))
register("max")(_make(lambda x, a: x.max(axis=a) if x.size else np.full(
    [d for i, d in enumerate(x.shape) if i not in a], -np.inf, x.dtype)))
register("min")(_make(lambda x, a: x.min(axis=a) if x.size else np.full(
    [d for i, d in enumerate(x.shape) if i not in a], np.inf, x.dtype)))
register("prod")(_make(lambda x, a: x.prod(axis=a, dtype=x.dtype)))
register("all")(_make(lambda x, a: np.all(x, axis=a)))
register("any")(_make(lambda x, a: np.any(x, axis=a)))


@_jit.jit
def _arg_rows(x2: np.ndarray, largest: bool, out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    """out[r] = the index of row r's first largest (or smallest) value, a NaN taken as -inf (+inf): what
    _arg's numpy code gives, in one pass over each row."""
    n = x2.shape[1]
    for r in range(x2.shape[0]):
        best, at = x2[r, 0], 0
        if best != best:
            best = -np.inf if largest else np.inf
        for j in range(1, n):
            v = x2[r, j]
            if (v > best) if largest else (v < best):
                best, at = v, j
        out[r] = at


@_jit.jit
def _picked_nan(x2: np.ndarray, index: np.ndarray) -> bool:  # pragma: no cover - compiled by numba
    """Whether any row r's value at index[r] is NaN."""
    for r in range(x2.shape[0]):
        v = x2[r, index[r]]
        if v != v:
            return True
    return False


def _arg(fn: Callable[..., np.ndarray], nan_as: float) -> KernelFn:
    """np.argmax/argmin as TF's: a NaN is never picked. numpy picks a line's first NaN, so only when a picked
    value is NaN are the NaNs replaced by `nan_as` and the lines searched again (a NaN check of the whole input
    first took longer than the search: 0.26 vs 0.18 ms at 160x8000). Along the last axis of a float array with
    numba, the picked values are checked in a numba loop (_picked_nan: the zoo CNN's [64, 10] logits 0.06 ->
    0.01 ms in its step), and a line with a NaN sends the whole array through one numba pass that skips NaNs
    (_arg_rows; numpy's vectorised search stays the first try: at 160x8000, the zoo transformer's predictions,
    0.06 ms against 0.86 for _arg_rows' one comparison after another)."""
    largest = nan_as < 0

    def kernel(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
        x = inputs[0]
        axis = int(np.asarray(attrs.get("axis", 0)).reshape(-1)[0])
        out_dtype = np_dtype(attrs.get("output_type", "int64"))
        if (_jit.enabled() and x.dtype in (np.float32, np.float64) and x.ndim and axis in (-1, x.ndim - 1)
                and x.size and x.flags.c_contiguous):
            x2 = x.reshape(-1, x.shape[-1])
            index = fn(x2, axis=1)
            if _picked_nan(x2, index):
                _arg_rows(x2, largest, index)
            return [index.reshape(x.shape[:-1]).astype(out_dtype, copy=False)]
        index = fn(x, axis=axis)
        if x.dtype.kind == "f" and x.size and np.isnan(np.take_along_axis(x, np.expand_dims(index, axis), axis)).any():
            index = fn(np.where(np.isnan(x), x.dtype.type(nan_as), x), axis=axis)
        return [index.astype(out_dtype)]
    return kernel


register("argmax")(_arg(np.argmax, -np.inf))  # first occurrence of the extreme value, as TF
register("argmin")(_arg(np.argmin, np.inf))


@register("cumsum")
def cumsum(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x = inputs[0]
    axis = int(np.asarray(attrs.get("axis", 0)).reshape(-1)[0])
    axis = axis + x.ndim if axis < 0 else axis
    if attrs.get("reverse"):
        x = np.flip(x, axis)
    out = np.cumsum(x, axis=axis, dtype=x.dtype)
    if attrs.get("exclusive"):
        out = np.concatenate([np.zeros_like(np.take(out, [0], axis=axis)),
                              np.take(out, np.arange(out.shape[axis] - 1), axis=axis)], axis=axis)
    if attrs.get("reverse"):
        out = np.flip(out, axis)
    return [np.ascontiguousarray(out)]


@register("band_part")
def band_part(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """MatrixBandPart: keep i - j <= num_lower and j - i <= num_upper (negative = unbounded)."""
    x = inputs[0]
    lo, up = int(attrs["num_lower"]), int(attrs["num_upper"])
    i = np.arange(x.shape[-2])[:, None]
    j = np.arange(x.shape[-1])[None, :]
    keep = ((lo < 0) | (i - j <= lo)) & ((up < 0) | (j - i <= up))
    return [np.where(keep, x, np.zeros((), x.dtype))]
