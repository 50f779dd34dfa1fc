"""Kernel pairs the executor runs as one kernel: a producer and the tail that is the only reader of its
first output: bias_add -> relu and fused_batch_norm -> relu (as TF's CPU graph fuses them too),
max_pool_grad -> relu_grad where the relu's output is what was pooled, and avg_pool_grad -> relu_grad
(the gradients through a conv block's relu + pool).

`FUSED[(producer kind, tail kind)]` is a `Fused`: `fn` takes the producer's inputs (then the tail's
`tail_takes` last inputs) and attrs and returns the producer's outputs with the first one passed through
the tail; `tail_reads` are the producer inputs (by index) the tail takes after that first output. Each gives
the same bits as the two kernels one after the other, in one pass over memory instead of two; other dtypes
and layouts compose the two kernels.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from cerebras_tf.wse.kernels import _jit
from cerebras_tf.wse.kernels._registry import KERNELS, KernelContext, KernelFn
from cerebras_tf.wse.kernels.elementwise_grad import bias_add_grad_and_rounding
from cerebras_tf.wse.kernels.half import NO_ROUNDING, round_half, rounding_code
from cerebras_tf.wse.kernels.norm import batch_norm, batch_norm_affine, rounded_batch_norm_grad
from cerebras_tf.wse.kernels.pool import WinningTaps, avg_pool_grad_relu_grad, max_pool_grad_relu_grad
from cerebras_tf.wse.memory import empty_aligned
from cerebras_tf.wse.threads import STREAMING_MIN_ELEMENTS_PER_THREAD, split_range


@_jit.jit
def _bias_relu(x2: np.ndarray, b: np.ndarray, out: np.ndarray, lo: int, hi: int) -> None:  # pragma: no cover
    """out = relu(x2 + b) on rows [lo, hi): relu as elementwise.relu (NaN kept, -0 -> +0)."""
    zero = x2.dtype.type(0)
    c = x2.shape[1]
    for r in range(lo, hi):
        for k in range(c):
            v = x2[r, k] + b[k]
            out[r, k] = v if v > 0 or v != v else zero


def bias_add_relu(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """relu(bias_add(x, b)) in one pass (NHWC-style: the bias along the last axis)."""
    x, b = inputs
    channels_first = str(attrs.get("data_format", "NHWC")).startswith("NC") and x.ndim >= 3
    if not (_jit.enabled() and not channels_first and x.ndim >= 1 and x.dtype == b.dtype
            and x.dtype in (np.float32, np.float64) and b.shape == x.shape[-1:]):
        return KERNELS["relu"](KERNELS["bias_add"](inputs, attrs, ctx), {}, ctx)
    x2 = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    out = empty_aligned(x.shape, x.dtype)
    out2, b = out.reshape(x2.shape), np.ascontiguousarray(b)
    rows = x2.shape[0]
    split_range(rows, lambda lo, hi: _bias_relu(x2, b, out2, lo, hi),
                max(1, STREAMING_MIN_ELEMENTS_PER_THREAD // max(x2.shape[1], 1)))
    return [out]


def fused_batch_norm_relu(inputs: list[np.ndarray], attrs: Mapping[str, Any],
                          ctx: KernelContext) -> list[np.ndarray]:
    """fused_batch_norm with relu applied to y as it is written."""
    return batch_norm(inputs, attrs, relu=True)


def batch_norm_relu_max_pool(taps: WinningTaps, pool_attrs: Mapping[str, Any],
                             half_dtype: str | None = None) -> KernelFn:
    """fused_batch_norm -> relu -> max_pool (fusion.batch_norm_relu_pools) as one kernel on the batch norm's
    inputs and attrs: its outputs, the pooled relu output first (the max pool of `pool_attrs`, keeping its
    winning taps in `taps` for its gradient). The pool takes the normalized values as it walks its windows
    (WinningTaps.max_pool_of_normalized): the batch norm's output, the relu's, is never stored, where
    numba runs the float32 NHWC pool; else the kernels one after the other. The same bits either way.
    With `half_dtype` (a to_half of the pooled output after it, BatchNormReluPool.rounding), the pooled output
    comes rounded to it, as round_half gives it: each max as the pool writes it (half.rounded; where it has no
    such rounding, the output rounded where it is) where the pool keeps taps (the gradient reads them, not the
    output); else into a new array (the gradient then takes the maxima from the unrounded output,
    max_pool_keeping_input)."""
    def kernel(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
        x = inputs[0]
        if not str(attrs.get("data_format", "NHWC")).startswith("NC") and taps.pools_normalized(x, pool_attrs):
            affine, others = batch_norm_affine(np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1]),
                                               inputs, attrs)
            code = NO_ROUNDING if half_dtype is None else rounding_code(half_dtype)
            pooled = taps.max_pool_of_normalized(x, affine, pool_attrs, None if code == NO_ROUNDING else code)
            if half_dtype is not None and code == NO_ROUNDING:
                round_half(pooled, half_dtype, out=pooled)
            return [pooled, *others]
        y, *others = batch_norm(inputs, attrs, relu=True)
        pooled = taps.max_pool_keeping_input(y, pool_attrs, ctx)
        return [pooled if half_dtype is None else round_half(pooled, half_dtype), *others]
    return kernel


@dataclasses.dataclass(frozen=True)
class Fused:
    fn: KernelFn
    tail_reads: tuple[int, ...] = ()  # producer input indices the tail reads after the producer's output
    tail_takes: int = 0  # tail inputs after those (made before the producer), fn's inputs after the producer's


FUSED: dict[tuple[str, str], Fused] = {
    ("bias_add", "relu"): Fused(bias_add_relu),
    ("fused_batch_norm", "relu"): Fused(fused_batch_norm_relu),
    ("max_pool_grad", "relu_grad"): Fused(max_pool_grad_relu_grad, tail_reads=(0,)),  # relu_grad(dx, x)
    ("avg_pool_grad", "relu_grad"): Fused(avg_pool_grad_relu_grad, tail_takes=1),  # relu_grad(dx, f)
}

# Producer kinds whose kernel can round its first output to the half dtype as it writes it, for a to_half after
# it (fusion.rounding_pairs): kind -> the kernel for a half dtype, the same bits as the producer then
# round_half. The zoo CNN's float16 batch-norm gradient: its 8 MB dx not read and written again.
ROUNDED_AS_WRITTEN: dict[str, Callable[[str], KernelFn]] = {
    "fused_batch_norm_grad": rounded_batch_norm_grad,
}

# Kinds whose kernel can also round its first input to the half dtype in the pass that reads it, for a to_half of
# that input beside it (fusion.roundings_beside_sums): kind -> the kernel for a half dtype, on (the kernel's
# inputs, the input again) -> (its outputs, the input rounded), the same bits as the kernel and round_half.
ROUNDED_BESIDE: dict[str, Callable[[str], KernelFn]] = {
    "bias_add_grad": bias_add_grad_and_rounding,
}
