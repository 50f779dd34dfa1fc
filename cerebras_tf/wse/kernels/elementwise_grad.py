"""Gradients of element-wise ops, in TF's operand order.

(gradients, features): relu_grad, relu6_grad, softplus_grad, leaky_relu_grad.
(gradients, outputs): elu_grad, selu_grad.
(y, dy) -- the forward *output* first: tanh_grad, sigmoid_grad, rsqrt_grad, sqrt_grad, reciprocal_grad.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from cerebras_tf.wse.kernels import _jit
from cerebras_tf.wse.kernels._registry import KernelContext, KernelFn, register
from cerebras_tf.wse.kernels._select import keep_where
from cerebras_tf.wse.kernels.elementwise import SELU_ALPHA, SELU_SCALE
from cerebras_tf.wse.kernels.half import round_half_in_layout, rounding_code
from cerebras_tf.wse.kernels.reduce import outer_sum_rounding, sum_over
from cerebras_tf.wse.threads import STREAMING_MIN_ELEMENTS_PER_THREAD, map_elementwise


def _zero(x: np.ndarray) -> np.ndarray:
    return np.zeros((), x.dtype)


@_jit.jit
def _relu_grad(g: np.ndarray, f: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    zero = g.dtype.type(0)
    for i in range(g.size):
        out[i] = g[i] if f[i] > 0 else zero


@register("relu_grad")
def relu_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """g where the feature is > 0 (NaN and inf included), +0 elsewhere."""
    g, f = inputs
    if g.shape != f.shape:
        return [keep_where(f > 0, g)]
    if _jit.enabled() and g.dtype == f.dtype and g.dtype in (np.float32, np.float64):
        return [map_elementwise(_relu_grad, g, f, min_per_thread=STREAMING_MIN_ELEMENTS_PER_THREAD)]
    return [map_elementwise(lambda g_, f_, out: keep_where(f_ > 0, g_, out), g, f)]


@register("relu6_grad")
def relu6_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    g, f = inputs
    return [np.where((f > 0) & (f < 6), g, _zero(g))]


@register("leaky_relu_grad")
def leaky_relu_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    g, f = inputs
    return [np.where(f > 0, g, g * np.asarray(attrs.get("alpha", 0.2), g.dtype))]


@register("softplus_grad")
def softplus_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    g, f = inputs
    with np.errstate(over="ignore"):
        return [g / (np.exp(-f) + np.ones((), f.dtype))]


@register("elu_grad")
def elu_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    g, y = inputs
    return [np.where(y < 0, g * (y + np.ones((), y.dtype)), g)]


@register("selu_grad")
def selu_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    g, y = inputs
    sa, s = np.asarray(SELU_SCALE * SELU_ALPHA, y.dtype), np.asarray(SELU_SCALE, y.dtype)
    return [np.where(y < 0, g * (y + sa), g * s)]


@register("tanh_grad")
def tanh_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    y, dy = inputs
    return [dy * (np.ones((), y.dtype) - y * y)]


@register("sigmoid_grad")
def sigmoid_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    y, dy = inputs
    return [dy * y * (np.ones((), y.dtype) - y)]


@register("rsqrt_grad")
def rsqrt_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    y, dy = inputs
    return [np.asarray(-0.5, y.dtype) * (dy * y) * (y * y)]


@register("sqrt_grad")
def sqrt_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    y, dy = inputs
    with np.errstate(divide="ignore", invalid="ignore"):
        return [np.asarray(0.5, y.dtype) * dy / y]


@register("reciprocal_grad")
def reciprocal_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    y, dy = inputs
    return [-y * y * dy]


@register("bias_add_grad")
def bias_add_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """Sum of the gradient over every axis but the channel axis. Channels last (and at least two of
    them: numpy sums a single column pairwise), numba adds the rows in numpy's order: the same bits."""
    g = inputs[0]
    ch = _channel_axis(g, attrs)
    return [sum_over(np.ascontiguousarray(g) if ch == g.ndim - 1 else g, tuple(a for a in range(g.ndim) if a != ch))]


def _channel_axis(g: np.ndarray, attrs: Mapping[str, Any]) -> int:
    return 1 if str(attrs.get("data_format", "NHWC")).startswith("NC") and g.ndim >= 3 else g.ndim - 1


def bias_add_grad_and_rounding(half_dtype: str) -> KernelFn:
    """bias_add_grad beside a to_half of its own input (fusion.roundings_beside_sums), for a half dtype: on
    inputs (g, g), [the bias gradient, g rounded to half_dtype]. One pass over g where numba adds its rows
    (channels last) and rounds it (half.rounding_code: float16, bfloat16), else the two kernels; the same bits
    either way (the zoo CNN's float16 conv block: its 4 MB gradient read once, not twice)."""
    rounding = rounding_code(half_dtype)

    def kernel(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
        g = inputs[0]
        if _channel_axis(g, attrs) == g.ndim - 1:
            both = outer_sum_rounding(g, tuple(range(g.ndim - 1)), rounding)
            if both is not None:
                return list(both)
        return [*bias_add_grad(inputs[:1], attrs, ctx), round_half_in_layout(inputs[1], half_dtype)]
    return kernel
