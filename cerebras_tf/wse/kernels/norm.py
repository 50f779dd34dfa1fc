"""fused_batch_norm and fused_batch_norm_grad with TF's CPU (FusedBatchNormV3) formulas.

fused_batch_norm(x, scale, offset, mean, variance) -> (y, batch_mean, batch_var,
saved_mean, saved_var, reserve[0]). Training: statistics over N, H, W in
float32; batch_var is the Bessel-corrected variance (blended with the input
running value when exponential_avg_factor != 1), saved_var the biased one.
Inference: normalises with the given mean/variance, which are passed through.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from cerebras_tf.wse.kernels._registry import KernelContext, register


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


@register("fused_batch_norm")
def fused_batch_norm(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x, scale, offset, mean, var = inputs
    eps = np.float32(attrs.get("epsilon", 1e-4))
    f = np.float32(attrs.get("exponential_avg_factor", 1.0))
    x2, nc = _layout(x, attrs)
    empty = np.zeros((0,), np.float32)
    if not attrs.get("is_training", True):
        sf = (1 / np.sqrt(np.asarray(var, np.float32) + eps)) * scale
        y = (x2 - mean) * sf + offset
        return [_restore(y, x, nc), np.array(mean, np.float32), np.array(var, np.float32),
                np.array(mean, np.float32), np.array(var, np.float32), empty]
    n = x2.shape[0]
    bmean = x2.sum(axis=0, dtype=np.float32) * np.float32(1.0 / n)
    xc = x2 - bmean
    bvar = np.square(xc).sum(axis=0, dtype=np.float32) * np.float32(1.0 / n)
    sf = (1 / np.sqrt(bvar + eps)) * scale
    y = xc * sf + offset
    adjust = np.float32(n / max(n - 1, 1))
    if f == 1:
        run_mean, run_var = bmean.copy(), bvar * adjust
    else:
        run_mean = (1 - f) * mean + f * bmean
        run_var = (1 - f) * var + f * bvar * adjust
    return [_restore(y, x, nc), run_mean.astype(np.float32), run_var.astype(np.float32), bmean, bvar, empty]


@register("fused_batch_norm_grad")
def fused_batch_norm_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """(dy, x, scale, saved_mean, saved_var, reserve) -> (dx, dscale, doffset, [0], [0])."""
    dy, x, scale, mean, var = inputs[:5]
    eps = np.float32(attrs.get("epsilon", 1e-4))
    dy2, nc = _layout(dy, attrs)
    x2, _ = _layout(x, attrs)
    inv = 1 / np.sqrt(np.asarray(var, np.float32) + eps)
    xc = x2 - mean
    doffset = dy2.sum(axis=0, dtype=np.float32)
    dyxc = (dy2 * xc).sum(axis=0, dtype=np.float32)
    dscale = dyxc * inv
    if attrs.get("is_training", True):
        n = np.float32(x2.shape[0])
        coef1 = (dyxc / n) * (inv * inv)
        dx = (scale * inv) * ((dy2 - doffset / n) - xc * coef1)
    else:
        dx = dy2 * (scale * inv)
    empty = np.zeros((0,), np.float32)
    return [_restore(dx, dy, nc), dscale, doffset, empty, empty]
