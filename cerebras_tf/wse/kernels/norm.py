"""fused_batch_norm and fused_batch_norm_grad with TF's CPU (FusedBatchNormV3) formulas.

fused_batch_norm(x, scale, offset, mean, variance) -> (y, batch_mean, batch_var,
saved_mean, saved_var, reserve[0]). Training: statistics over N, H, W in
float32; batch_var is the Bessel-corrected variance (blended with the input
running value when exponential_avg_factor != 1), saved_var the biased one.
Inference: normalises with the given mean/variance, which are passed through.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from cerebras_tf.wse.kernels._registry import KernelContext, register

_WIDE_ROW = 4096  # elements per row of the side-by-side view (_wide)


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
    xw, k = _wide(x2)
    bmean = _channel_sum(xw, k) * np.float32(1.0 / n)
    y = xw - np.tile(bmean, k)  # x - mean, then y in place
    bvar = _channel_dot(y, y, k) * np.float32(1.0 / n)
    sf = (1 / np.sqrt(bvar + eps)) * scale
    y *= np.tile(sf, k)
    y += np.tile(np.asarray(offset, np.float32), k)
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
