"""fused_batch_norm and fused_batch_norm_grad with TF's CPU (FusedBatchNormV3) formulas.

fused_batch_norm(x, scale, offset, mean, variance) -> (y, batch_mean, batch_var,
saved_mean, saved_var, reserve[0]). Training: statistics over N, H, W in
float32; batch_var is the Bessel-corrected variance (blended with the input
running value when exponential_avg_factor != 1), saved_var the biased one.
Inference: normalises with the given mean/variance, which are passed through.

With numba (`_jit.enabled()`), the passes over x run as numba loops over the
[rows, C] layout, split across the host's threads: the per-channel sums
(of x, then of (x - mean)^2: the two-pass variance; of dy and dy * (x - mean)
for the gradient) are float32 sums of fixed blocks of rows, the blocks' sums
then added up by numpy, so the result does not depend on the number of threads;
the elementwise passes apply the numpy code's formulas operation for operation.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from cerebras_tf.wse.kernels import _jit
from cerebras_tf.wse.kernels._registry import KernelContext, KernelFn, register
from cerebras_tf.wse.kernels._split import split_units
from cerebras_tf.wse.kernels.half import NO_ROUNDING, round_half, rounded, rounding_code
from cerebras_tf.wse.memory import empty_aligned

_WIDE_ROW = 4096  # elements per row of the side-by-side view (_wide)
_BLOCK_ROWS = 256  # rows per partial sum of the numba path (fixed: results never depend on the thread count)


@_jit.jit
def _block_sums(x2: np.ndarray, block: int, out: np.ndarray, lo: int, hi: int) -> None:
    """out[b] = the float32 per-channel sum of rows [b * block, (b + 1) * block) of x2, for b in [lo, hi)."""
    rows, c = x2.shape
    for b in range(lo, hi):
        acc = np.zeros(c, np.float32)
        for r in range(b * block, min(rows, (b + 1) * block)):
            for k in range(c):
                acc[k] += x2[r, k]
        out[b] = acc


@_jit.jit
def _block_centered_squares(x2: np.ndarray, mean: np.ndarray, block: int, out: np.ndarray, lo: int, hi: int) -> None:
    """out[b] = the per-channel sum of (x2 - mean)^2 over block b's rows, for b in [lo, hi)."""
    rows, c = x2.shape
    for b in range(lo, hi):
        acc = np.zeros(c, np.float32)
        for r in range(b * block, min(rows, (b + 1) * block)):
            for k in range(c):
                d = x2[r, k] - mean[k]
                acc[k] += d * d
        out[b] = acc


@_jit.jit
def _block_grad_sums(dy2: np.ndarray, x2: np.ndarray, mean: np.ndarray, block: int, dy_out: np.ndarray,
                     dyxc_out: np.ndarray, lo: int, hi: int) -> None:
    """dy_out[b], dyxc_out[b] = the per-channel sums of dy2 and of dy2 * (x2 - mean) over block b's rows."""
    rows, c = x2.shape
    for b in range(lo, hi):
        acc = np.zeros(c, np.float32)
        acc_xc = np.zeros(c, np.float32)
        for r in range(b * block, min(rows, (b + 1) * block)):
            for k in range(c):
                d = dy2[r, k]
                acc[k] += d
                acc_xc[k] += d * (x2[r, k] - mean[k])
        dy_out[b] = acc
        dyxc_out[b] = acc_xc


@_jit.jit
def _normalize(x2: np.ndarray, mean: np.ndarray, factor: np.ndarray, offset: np.ndarray, y: np.ndarray,
               lo: int, hi: int) -> None:
    """y = (x2 - mean) * factor + offset on rows [lo, hi)."""
    c = x2.shape[1]
    for r in range(lo, hi):
        for k in range(c):
            y[r, k] = (x2[r, k] - mean[k]) * factor[k] + offset[k]


@_jit.jit
def normalized_relu(x: Any, mean: Any, factor: Any, offset: Any, zero: Any) -> Any:  # pragma: no cover - numba
    """relu((x - mean) * factor + offset) of one value, relu as elementwise.relu (NaN kept, -0 -> `zero`, the
    dtype's +0): what a batch norm + relu writes (_normalize_relu), and what a max pool of it takes without
    it being stored (pool._max_pool_loop)."""
    v = (x - mean) * factor + offset
    return v if v > 0 or v != v else zero


@_jit.jit
def _normalize_relu(x2: np.ndarray, mean: np.ndarray, factor: np.ndarray, offset: np.ndarray, y: np.ndarray,
                    lo: int, hi: int) -> None:
    """y = relu((x2 - mean) * factor + offset) on rows [lo, hi) (normalized_relu)."""
    c = x2.shape[1]
    zero = y.dtype.type(0)
    for r in range(lo, hi):
        for k in range(c):
            y[r, k] = normalized_relu(x2[r, k], mean[k], factor[k], offset[k], zero)


@_jit.jit
def _grad_dx(dy2: np.ndarray, x2: np.ndarray, mean: np.ndarray, dy_mean: np.ndarray, coef: np.ndarray,
             factor: np.ndarray, dx: np.ndarray, rounding: int, lo: int, hi: int) -> None:
    """dx = ((dy2 - dy_mean) - (x2 - mean) * coef) * factor on rows [lo, hi), each value half.rounded."""
    c = x2.shape[1]
    for r in range(lo, hi):
        for k in range(c):
            dx[r, k] = rounded(((dy2[r, k] - dy_mean[k]) - (x2[r, k] - mean[k]) * coef[k]) * factor[k], rounding)


@_jit.jit
def _scaled(dy2: np.ndarray, factor: np.ndarray, dx: np.ndarray, rounding: int, lo: int, hi: int) -> None:
    """dx = dy2 * factor on rows [lo, hi), each value half.rounded."""
    c = dy2.shape[1]
    for r in range(lo, hi):
        for k in range(c):
            dx[r, k] = rounded(dy2[r, k] * factor[k], rounding)


def _f32(a: Any) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32)


def _channel_sums_jit(x2: np.ndarray, mean: np.ndarray | None = None) -> np.ndarray:
    """Per-channel float32 sums of x2 (mean None) or of (x2 - mean)^2, by blocks of rows."""
    rows, c = x2.shape
    blocks = -(-rows // _BLOCK_ROWS)
    partial = np.zeros((blocks, c), np.float32)
    if mean is None:
        split_units(blocks, _BLOCK_ROWS * c, lambda lo, hi: _block_sums(x2, _BLOCK_ROWS, partial, lo, hi))
    else:
        split_units(blocks, _BLOCK_ROWS * c,
                    lambda lo, hi: _block_centered_squares(x2, mean, _BLOCK_ROWS, partial, lo, hi))
    return partial.sum(axis=0, dtype=np.float32)


def _normalize_jit(x2: np.ndarray, mean: np.ndarray, factor: np.ndarray, offset: np.ndarray,
                   relu: bool) -> np.ndarray:
    y = empty_aligned(x2.shape, np.float32)
    loop = _normalize_relu if relu else _normalize
    split_units(x2.shape[0], x2.shape[1], lambda lo, hi: loop(x2, mean, factor, offset, y, lo, hi))
    return y


def _relu_numpy(y: np.ndarray, relu: bool) -> np.ndarray:
    return np.maximum(y, np.zeros((), y.dtype), out=y) if relu else y


def _layout(x: np.ndarray, attrs: Mapping[str, Any]) -> tuple[np.ndarray, bool]:
    """x as float32 [rest, C] rows and whether it was channels-first."""
    nc = str(attrs.get("data_format", "NHWC")).startswith("NC")
    xn = np.moveaxis(x, 1, -1) if nc else x
    return np.asarray(xn, np.float32).reshape(-1, xn.shape[-1]), nc


def _restore(y2: np.ndarray, x: np.ndarray, nc: bool) -> np.ndarray:
    shape = (x.shape[0],) + x.shape[2:] + (x.shape[1],) if nc else x.shape
    y = y2.reshape(shape)
    y = np.moveaxis(y, -1, 1) if nc else y
    return np.ascontiguousarray(y).astype(x.dtype, copy=False)


def _wide(x2: np.ndarray) -> tuple[np.ndarray, int]:
    """[rows, C] viewed as [rows/k, k*C] (k rows side by side), so per-channel arithmetic runs in long
    inner loops instead of one C-long numpy loop per row; with k."""
    rows, c = x2.shape
    k = math.gcd(rows, max(1, _WIDE_ROW // max(c, 1)))
    return x2.reshape(rows // k, k * c), k


def _channel_sum(xw: np.ndarray, k: int) -> np.ndarray:
    """Per-channel float32 sum of a _wide view."""
    return xw.sum(axis=0, dtype=np.float32).reshape(k, -1).sum(axis=0, dtype=np.float32)


def _channel_dot(aw: np.ndarray, bw: np.ndarray, k: int) -> np.ndarray:
    """Per-channel float32 sum of aw * bw (_wide views), without the product array."""
    return np.einsum("ij,ij->j", aw, bw).reshape(k, -1).sum(axis=0, dtype=np.float32)


@register("fused_batch_norm")
def fused_batch_norm(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    return batch_norm(inputs, attrs)


def batch_norm(inputs: list[np.ndarray], attrs: Mapping[str, Any], relu: bool = False) -> list[np.ndarray]:
    """fused_batch_norm's outputs; with `relu`, y is passed through relu as it is written (the same bits
    as the relu kernel on y)."""
    x, scale, offset, mean, var = inputs
    x2, nc = _layout(x, attrs)
    if _jit.enabled():
        x2 = np.ascontiguousarray(x2)
        affine, others = batch_norm_affine(x2, inputs, attrs)
        return [_restore(_normalize_jit(x2, affine[0], affine[1], affine[2], relu), x, nc), *others]
    eps = np.float32(attrs.get("epsilon", 1e-4))
    if not attrs.get("is_training", True):
        sf = (1 / np.sqrt(np.asarray(var, np.float32) + eps)) * scale
        y = _relu_numpy((x2 - mean) * sf + offset, relu)
        return [_restore(y, x, nc), *_inference_statistics(mean, var)]
    n = x2.shape[0]
    xw, k = _wide(x2)
    bmean = _channel_sum(xw, k) * np.float32(1.0 / n)
    y = xw - np.tile(bmean, k)  # x - mean, then y in place
    bvar = _channel_dot(y, y, k) * np.float32(1.0 / n)
    sf = (1 / np.sqrt(bvar + eps)) * scale
    y *= np.tile(sf, k)
    y += np.tile(np.asarray(offset, np.float32), k)
    y = _relu_numpy(y, relu)
    return [_restore(y, x, nc), *_training_statistics(mean, var, bmean, bvar, n, attrs)]


def batch_norm_affine(x2: np.ndarray, inputs: list[np.ndarray],
                      attrs: Mapping[str, Any]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The numba path's (3, C) float32 rows mean, factor, offset that y = (x - mean) * factor + offset takes
    (_normalize_relu), of x2 (C-contiguous float32 [rows, C]: _layout's) and fused_batch_norm's other inputs
    and attrs; with fused_batch_norm's outputs after y."""
    _, scale, offset, mean, var = inputs
    eps = np.float32(attrs.get("epsilon", 1e-4))
    if not attrs.get("is_training", True):
        sf = (1 / np.sqrt(np.asarray(var, np.float32) + eps)) * scale
        return np.stack([_f32(mean), _f32(sf), _f32(offset)]), _inference_statistics(mean, var)
    n = x2.shape[0]
    bmean = _channel_sums_jit(x2) * np.float32(1.0 / n)
    bvar = _channel_sums_jit(x2, bmean) * np.float32(1.0 / n)
    sf = (1 / np.sqrt(bvar + eps)) * scale
    return (np.stack([_f32(bmean), _f32(sf), _f32(offset)]),
            _training_statistics(mean, var, bmean, bvar, n, attrs))


def _inference_statistics(mean: np.ndarray, var: np.ndarray) -> list[np.ndarray]:
    """fused_batch_norm's outputs after y when not training: the given mean and variance, twice."""
    return [np.array(mean, np.float32), np.array(var, np.float32), np.array(mean, np.float32),
            np.array(var, np.float32), np.zeros((0,), np.float32)]


def _training_statistics(mean: np.ndarray, var: np.ndarray, bmean: np.ndarray, bvar: np.ndarray, n: int,
                         attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """fused_batch_norm's outputs after y when training: the running mean and variance (Bessel-corrected),
    then the batch's."""
    f = np.float32(attrs.get("exponential_avg_factor", 1.0))
    adjust = np.float32(n / max(n - 1, 1))
    if f == 1:
        run_mean, run_var = bmean.copy(), bvar * adjust
    else:
        run_mean = (1 - f) * mean + f * bmean
        run_var = (1 - f) * var + f * bvar * adjust
    return [run_mean.astype(np.float32), run_var.astype(np.float32), bmean, bvar, np.zeros((0,), np.float32)]


@register("fused_batch_norm_grad")
def fused_batch_norm_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """(dy, x, scale, saved_mean, saved_var, reserve) -> (dx, dscale, doffset, [0], [0])."""
    return _batch_norm_grad(inputs, attrs)


def rounded_batch_norm_grad(half_dtype: str) -> KernelFn:
    """fused_batch_norm_grad with dx rounded to `half_dtype` (a to_half after it, fusion.rounding_pairs): as
    dx is written where the numba loop can round it so (half.rounding_code), else by round_half after. The
    same bits as the two kernels one after the other."""
    def kernel(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
        rounding = rounding_code(half_dtype) if inputs[0].dtype == np.float32 else NO_ROUNDING
        dx, *others = _batch_norm_grad(inputs, attrs, rounding)
        return [dx if rounding != NO_ROUNDING else round_half(dx, half_dtype), *others]
    return kernel


def _batch_norm_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any],
                     rounding: int = NO_ROUNDING) -> list[np.ndarray]:
    """fused_batch_norm_grad's outputs; dx rounded as it is written (half.rounded) by the numba path."""
    dy, x, scale, mean, var = inputs[:5]
    eps = np.float32(attrs.get("epsilon", 1e-4))
    dy2, nc = _layout(dy, attrs)
    x2, _ = _layout(x, attrs)
    if _jit.enabled():
        return _batch_norm_grad_jit(dy2, x2, dy, nc, scale, mean, var, eps, bool(attrs.get("is_training", True)),
                                    rounding)
    assert rounding == NO_ROUNDING, "rounding as written is the numba loops'"
    dyw, k = _wide(dy2)
    xw, _ = _wide(x2)
    inv = 1 / np.sqrt(np.asarray(var, np.float32) + eps)
    xc: np.ndarray = xw - np.tile(np.asarray(mean, np.float32), k)
    doffset = _channel_sum(dyw, k)
    dyxc = _channel_dot(dyw, xc, k)
    dscale = dyxc * inv
    if attrs.get("is_training", True):
        n = np.float32(x2.shape[0])
        coef1 = (dyxc / n) * (inv * inv)
        dx = dyw - np.tile(doffset / n, k)
        xc *= np.tile(coef1, k)
        dx -= xc
        dx *= np.tile(scale * inv, k)
    else:
        dx = dyw * np.tile(scale * inv, k)
    empty = np.zeros((0,), np.float32)
    return [_restore(dx, dy, nc), dscale, doffset, empty, empty]


def _batch_norm_grad_jit(dy2: np.ndarray, x2: np.ndarray, dy: np.ndarray, nc: bool, scale: np.ndarray,
                         mean: np.ndarray, var: np.ndarray, eps: np.float32, training: bool,
                         rounding: int) -> list[np.ndarray]:
    """fused_batch_norm_grad's numba path: one pass for the two per-channel sums, one for dx (rounded as
    written: half.rounded)."""
    dy2, x2 = np.ascontiguousarray(dy2), np.ascontiguousarray(x2)
    rows, c = x2.shape
    inv = 1 / np.sqrt(np.asarray(var, np.float32) + eps)
    mean32 = _f32(mean)
    blocks = -(-rows // _BLOCK_ROWS)
    partial_dy, partial_dyxc = np.zeros((blocks, c), np.float32), np.zeros((blocks, c), np.float32)
    split_units(blocks, 2 * _BLOCK_ROWS * c, lambda lo, hi: _block_grad_sums(
        dy2, x2, mean32, _BLOCK_ROWS, partial_dy, partial_dyxc, lo, hi))
    doffset = partial_dy.sum(axis=0, dtype=np.float32)
    dyxc = partial_dyxc.sum(axis=0, dtype=np.float32)
    dscale = dyxc * inv
    factor = _f32(scale * inv)
    dx = empty_aligned((rows, c), np.float32)
    if training:
        n = np.float32(rows)
        coef1 = _f32((dyxc / n) * (inv * inv))
        dy_mean = _f32(doffset / n)
        split_units(rows, 2 * c, lambda lo, hi: _grad_dx(dy2, x2, mean32, dy_mean, coef1, factor, dx, rounding,
                                                          lo, hi))
    else:
        split_units(rows, c, lambda lo, hi: _scaled(dy2, factor, dx, rounding, lo, hi))
    empty = np.zeros((0,), np.float32)
    return [_restore(dx, dy, nc), dscale, doffset, empty, empty]
