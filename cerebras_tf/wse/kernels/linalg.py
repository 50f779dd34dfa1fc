"""Compute kernels: matmul, batch_matmul, einsum, conv2d (+ both backprops), depthwise conv (+ backprops).

Everything multiplies in float32 with float32 accumulation: inputs arrive
already rounded to the half dtype when the compiler inserted precision casts;
float16 arrays are upcast and the result cast back to the input dtype. That
contract is kept here; the arithmetic itself is the host-kernel provider's in
the context (`ctx.host_kernels`: numpy/OpenBLAS by default, see
host_kernels.py), so a faster library can take it over without changing the
numerics. einsum stays on numpy (no provider runs it).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from cerebras_tf.wse.kernels._registry import KernelContext, register


def _f32(x: np.ndarray) -> np.ndarray:
    """float32 operand (integer operands are kept: they multiply exactly in their own dtype)."""
    x = np.asarray(x)
    return x if x.dtype == np.float32 or x.dtype.kind in "iu" else x.astype(np.float32)


def _back(out: np.ndarray, like: np.ndarray) -> np.ndarray:
    return out if out.dtype == like.dtype or like.dtype.kind != "f" else out.astype(like.dtype)


def _provided(kind: str, result_like: int) -> None:
    """Register `kind` as the context provider's kernel of that name, with the dtype contract around it:
    float32 operands in, the result cast back to the dtype of operand `result_like`."""
    def kernel(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
        out = getattr(ctx.host_kernels, kind)([_f32(x) for x in inputs], attrs)
        return [_back(out, inputs[result_like])]
    kernel.__name__ = kernel.__qualname__ = kind
    register(kind)(kernel)


# kind -> the operand whose dtype the result takes: the data operand, never input_sizes-like attrs
_RESULT_LIKE = {"matmul": 0, "batch_matmul": 0, "conv2d": 0, "conv2d_backprop_input": 1, "conv2d_backprop_filter": 0,
                "depthwise_conv2d": 0, "depthwise_conv2d_backprop_input": 1, "depthwise_conv2d_backprop_filter": 0}
for _kind, _like in _RESULT_LIKE.items():
    _provided(_kind, _like)


def provided_together(members: Sequence[tuple[str, Sequence[np.ndarray], Mapping[str, Any]]],
                      ctx: KernelContext) -> list[np.ndarray]:
    """Several provider kernels, (kind, inputs, attrs) each, in one call of the provider's `together` (which may
    run them at once), each with its kind's dtype contract; one result each, as the kernels one by one give."""
    together = ctx.host_kernels.together
    if together is None:
        raise ValueError(f"the host kernels {ctx.host_kernels.name!r} take no kernels together")
    results = together([(kind, [_f32(x) for x in inputs], attrs) for kind, inputs, attrs in members])
    return [_back(out, inputs[_RESULT_LIKE[kind]]) for out, (kind, inputs, _) in zip(results, members)]


@register("einsum")
def einsum(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    eq = str(attrs["equation"]).replace(" ", "")
    out = np.einsum(eq, *[_f32(x) for x in inputs], optimize=True)
    return [_back(np.asarray(out, np.float32), inputs[0])]
