"""Pooling kernels (NHWC; NCHW is transposed): max_pool, avg_pool and their gradients.

Loops run over the window taps (kh*kw strided views), never over pixels.
max_pool_grad routes each output's gradient to the first maximum of its window
in row-major tap order (TF's CPU kernel: strict `<` while scanning), padding
never wins (implemented as "first tap equal to the window max"; a window holding a NaN
routes no gradient, where TF's scan would). avg_pool divides by the number of non-padding elements (TF's SAME).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from cerebras_tf.wse.kernels._registry import KernelContext, register
from cerebras_tf.wse.kernels._select import keep_where
from cerebras_tf.wse.kernels.conv_geometry import Geom


def _geom(attrs: Mapping[str, Any], shape: Sequence[int]) -> Geom:
    fmt = str(attrs.get("data_format", "NHWC"))
    ks = list(attrs["ksize"])
    k = (ks[2], ks[3]) if fmt.startswith("NC") else (ks[1], ks[2])
    return Geom({**attrs, "dilations": None}, shape, (int(k[0]), int(k[1])))


def _nhwc(x: np.ndarray, g: Geom) -> np.ndarray:
    return x.transpose(0, 2, 3, 1) if g.nchw else x


def _back(x: np.ndarray, g: Geom) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if g.nchw else x


def _padded(x: np.ndarray, g: Geom, value: float) -> np.ndarray:
    if not (g.pt or g.pb or g.pl or g.pr):
        return x
    return np.pad(x, ((0, 0), (g.pt, g.pb), (g.pl, g.pr), (0, 0)), constant_values=value)


def _max(xn: np.ndarray, g: Geom) -> tuple[np.ndarray, np.ndarray]:
    """(padded input, window max) of an NHWC input; padding is the dtype's lowest value."""
    low = -np.inf if xn.dtype.kind == "f" else np.iinfo(xn.dtype).min
    xp = _padded(xn, g, low)
    out: np.ndarray | None = None
    for _, _, rs, cs in g.taps():
        v = xp[:, rs, cs, :]
        out = v.copy() if out is None else np.maximum(out, v, out=out)
    assert out is not None  # a window has at least one tap
    return xp, out


@register("max_pool")
def max_pool(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x = inputs[0]
    g = _geom(attrs, x.shape)
    return [_back(_max(_nhwc(x, g), g)[1], g)]


@register("max_pool_grad")
def max_pool_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """MaxPoolGrad(orig_input, orig_output, grad): each window's gradient goes to the first tap
    (row-major) equal to the window max, recomputed from orig_input as TF does; padding never wins."""
    x, _, grad = inputs
    g = _geom(attrs, x.shape)
    xp, best = _max(_nhwc(x, g), g)
    padded = bool(g.pt or g.pb or g.pl or g.pr)
    valid = _padded(np.ones((1, g.h, g.w, 1), bool), g, False) if padded else None
    gn = _nhwc(grad, g)
    dxp = np.zeros(g.padded_shape(), grad.dtype)
    found = np.zeros(best.shape, bool)
    hit = np.empty(best.shape, bool)
    overlap = g.kh > g.sh or g.kw > g.sw
    for _, _, rs, cs in g.taps():
        np.equal(xp[:, rs, cs, :], best, out=hit)
        if valid is not None:
            hit &= valid[:, rs, cs, :]
        np.greater(hit, found, out=hit)  # a hit, and no earlier tap of its window was
        found |= hit
        if overlap:
            dxp[:, rs, cs, :] += keep_where(hit, gn)
        else:  # each input element belongs to one window at most
            dxp[:, rs, cs, :] = keep_where(hit, gn)
    return [_back(g.unpad(dxp), g)]


def _counts(g: Geom) -> np.ndarray:
    ones = _padded(np.ones((1, g.h, g.w, 1), np.float32), g, 0)
    cnt = np.zeros((1, g.oh, g.ow, 1), np.float32)
    for _, _, rs, cs in g.taps():
        cnt += ones[:, rs, cs, :]
    return cnt


@register("avg_pool")
def avg_pool(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x = inputs[0]
    g = _geom(attrs, x.shape)
    xp = _padded(_nhwc(x, g), g, 0)
    out = np.zeros((g.n, g.oh, g.ow, g.c), x.dtype)
    for _, _, rs, cs in g.taps():
        out += xp[:, rs, cs, :]
    out /= _counts(g).astype(x.dtype)
    return [_back(out, g)]


@register("avg_pool_grad")
def avg_pool_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """AvgPoolGrad(grad) with attr orig_input_shape."""
    grad = inputs[0]
    g = _geom(attrs, list(attrs["orig_input_shape"]))
    share = _nhwc(grad, g) / _counts(g).astype(grad.dtype)
    dxp = np.zeros(g.padded_shape(), grad.dtype)
    for _, _, rs, cs in g.taps():
        dxp[:, rs, cs, :] += share
    return [_back(g.unpad(dxp), g)]
