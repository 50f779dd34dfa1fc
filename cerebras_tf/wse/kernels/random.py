"""Stateful random kernels: random_uniform [0, 1), random_normal, truncated_normal (|x| <= 2).

Reproducibility: each run draws from a fresh numpy Philox generator keyed by
SeedSequence((seed, seed2, step)) with the global step from the context, so a
kernel's sample is a pure function of (seed, seed2, step): identical across
runs and processes, different every step. When seed == seed2 == 0 (TF: "no
seed"), the context's `salt` (the executor passes the kernel id) is mixed in so
unseeded kernels in one program do not share a stream. The bits are not TF's:
only the distribution matches. dtype "half" is drawn in float32 and rounded to
the selected half format; "float16" gives numpy float16.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from cerebras_tf.amp.dtypes import round_to_half
from cerebras_tf.wse.kernels._registry import KernelContext, register

_MASK = (1 << 64) - 1


def generator(attrs: Mapping[str, Any], ctx: KernelContext) -> np.random.Generator:
    """The Philox generator for this kernel at this step."""
    seed, seed2 = int(attrs.get("seed", 0)), int(attrs.get("seed2", 0))
    key = [seed & _MASK, seed2 & _MASK, int(ctx.step) & _MASK]
    if seed == 0 and seed2 == 0:
        key.append(int(ctx.salt) & _MASK)
    return np.random.Generator(np.random.Philox(np.random.SeedSequence(key)))


def _shape(attrs: Mapping[str, Any]) -> list[int]:
    if not np.size(attrs["shape"]):
        return []
    return [int(v) for v in np.atleast_1d(np.asarray(attrs["shape"], np.int64)).tolist()]


def _finish(x: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    dtype = str(attrs.get("dtype", "float32"))
    if dtype in ("half", "bfloat16", "cbfloat16"):
        return round_to_half(x, None if dtype == "half" else dtype)
    return x.astype(np.dtype(dtype), copy=False)


@register("random_uniform")
def random_uniform(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x = generator(attrs, ctx).random(_shape(attrs), dtype=np.float32)
    out = _finish(x, attrs)
    if out.dtype.kind == "f":  # rounding to a narrower format may reach 1.0: keep [0, 1)
        out[out >= 1] = np.nextafter(out.dtype.type(1), out.dtype.type(0))
    return [out]


@register("random_normal")
def random_normal(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    return [_finish(generator(attrs, ctx).standard_normal(_shape(attrs), dtype=np.float32), attrs)]


@register("truncated_normal")
def truncated_normal(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """Standard normal, redrawing values with |x| > 2 (TF's rule)."""
    gen = generator(attrs, ctx)
    x = gen.standard_normal(_shape(attrs), dtype=np.float32)
    bad = np.abs(x) > 2
    while bad.any():
        x[bad] = gen.standard_normal(int(bad.sum()), dtype=np.float32)
        bad = np.abs(x) > 2
    return [_finish(x, attrs)]
