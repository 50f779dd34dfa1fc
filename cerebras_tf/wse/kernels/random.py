"""Stateful random kernels: random_uniform [0, 1), random_normal, truncated_normal (|x| <= 2).

Reproducibility: each call's sample is a pure function of (seed, seed2, step),
the global step from the context, through SeedSequence((seed, seed2, step)):
identical across runs and processes (a resumed run draws what the first one
would have), different every step. When seed == seed2 == 0 (TF: "no seed"),
the context's `salt` (the executor passes the kernel id) is mixed in so
unseeded kernels in one program do not share a stream.

random_uniform (dropout's masks: the random kernel the zoo's training steps
run) is TF's stateless uniform, bit for bit: Philox4x32-10 from a key and a 128-bit
counter that the SeedSequence gives (`stream`), its words turned into floats
as TF does (`philox_uniform` equals tf.raw_ops.StatelessRandomUniformV2 with
that key and counter). Its numba loop runs 64 counters at a time (vectorised:
1.2 ns a number on this project's 2-core VM, numpy's Philox generator 5.4) and
splits across the host's threads when big; every element depends on its index
alone, so the split never changes the bits. random_normal and truncated_normal
draw from numpy's Philox generator (its bits, not TF's: the distribution
matches); they serve initializers rather than steps. dtype "half" is drawn in
float32 and rounded to the selected half format; "float16" gives numpy float16.
TF's stateful RandomUniform continues one stream across a session's calls, so
its bits are not ours; the distribution is the same.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from cerebras_tf.amp.dtypes import round_to_half
from cerebras_tf.wse.kernels import _jit
from cerebras_tf.wse.kernels._registry import KernelContext, register
from cerebras_tf.wse.kernels._split import split_units
from cerebras_tf.wse.memory import empty_aligned

_MASK = (1 << 64) - 1
_LANES = 64  # counters the numba loop takes at a time (its inner loops, vectorised)
_MIN_PER_THREAD = 1 << 18  # numbers per thread before the loop splits (compute-bound: ~0.3 ms a part)

# Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; TF's PhiloxRandom)
_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # key schedule increments
_ROUNDS = 10
_WORD = 0xFFFFFFFF  # a 32-bit word of the counter, the key or the output
_MANTISSA, _ULP = 0x7FFFFF, 2.0 ** -23  # TF's Uint32ToFloat: a word's low 23 bits, times 2^-23


def _seed_sequence(attrs: Mapping[str, Any], ctx: KernelContext) -> np.random.SeedSequence:
    seed, seed2 = int(attrs.get("seed", 0)), int(attrs.get("seed2", 0))
    key = [seed & _MASK, seed2 & _MASK, int(ctx.step) & _MASK]
    if seed == 0 and seed2 == 0:
        key.append(int(ctx.salt) & _MASK)
    return np.random.SeedSequence(key)


def generator(attrs: Mapping[str, Any], ctx: KernelContext) -> np.random.Generator:
    """numpy's Philox generator for this kernel at this step (random_normal, truncated_normal)."""
    return np.random.Generator(np.random.Philox(_seed_sequence(attrs, ctx)))


def stream(attrs: Mapping[str, Any], ctx: KernelContext) -> tuple[int, tuple[int, int]]:
    """(key, (counter low 64 bits, counter high 64 bits)): random_uniform's Philox stream for this kernel at
    this step, in the form tf.raw_ops.StatelessRandomUniformV2 takes them."""
    key, low, high = (int(v) for v in _seed_sequence(attrs, ctx).generate_state(3, np.uint64))
    return key, (low, high)


@_jit.jit
def _philox_uniform_loop(key: np.uint64, low: np.uint64, high: np.uint64, out: np.ndarray, lo: int, hi: int) -> None:
    """out[4b:4b + 4] = the floats of Philox4x32-10's block for counter (high:low) + b, for b in [lo, hi):
    _LANES counters at a time, each round over all lanes (loops LLVM vectorises)."""
    m0, m1, w0, w1 = np.uint64(_M0), np.uint64(_M1), np.uint64(_W0), np.uint64(_W1)
    mask, s32, mantissa, ulp = np.uint64(_WORD), np.uint64(32), np.uint64(_MANTISSA), np.float32(_ULP)
    a0, a1 = np.empty(_LANES, np.uint64), np.empty(_LANES, np.uint64)
    a2, a3 = np.empty(_LANES, np.uint64), np.empty(_LANES, np.uint64)
    for start in range(lo, hi, _LANES):
        n = min(_LANES, hi - start)
        for j in range(n):
            c_low = low + np.uint64(start + j)  # the 128-bit counter plus the block's index, wrapping
            c_high = high + np.uint64(c_low < low)
            a0[j], a1[j], a2[j], a3[j] = c_low & mask, c_low >> s32, c_high & mask, c_high >> s32
        k0, k1 = key & mask, key >> s32
        for _ in range(_ROUNDS):
            for j in range(n):
                p0, p1 = m0 * a0[j], m1 * a2[j]
                c1, c3 = a1[j], a3[j]
                a0[j], a1[j] = (p1 >> s32) ^ c1 ^ k0, p1 & mask
                a2[j], a3[j] = (p0 >> s32) ^ c3 ^ k1, p0 & mask
            k0, k1 = (k0 + w0) & mask, (k1 + w1) & mask
        for j in range(n):  # TF's Uint32ToFloat: 23 random mantissa bits under 1.0, minus 1 (exact)
            b = 4 * (start + j)
            out[b] = np.float32(a0[j] & mantissa) * ulp
            out[b + 1] = np.float32(a1[j] & mantissa) * ulp
            out[b + 2] = np.float32(a2[j] & mantissa) * ulp
            out[b + 3] = np.float32(a3[j] & mantissa) * ulp


def _philox_uniform_numpy(key: int, low: int, high: int, blocks: int) -> np.ndarray:
    """_philox_uniform_loop's numbers for blocks [0, blocks), by numpy (uint64 arrays, one per word)."""
    mask, s32 = np.uint64(_WORD), np.uint64(32)
    with np.errstate(over="ignore"):
        c_low = np.uint64(low) + np.arange(blocks, dtype=np.uint64)
        c_high = np.uint64(high) + (c_low < np.uint64(low)).astype(np.uint64)
        c0, c1, c2, c3 = c_low & mask, c_low >> s32, c_high & mask, c_high >> s32
        k0, k1 = key & _WORD, key >> 32
        for _ in range(_ROUNDS):
            p0, p1 = np.uint64(_M0) * c0, np.uint64(_M1) * c2
            c0, c1, c2, c3 = (p1 >> s32) ^ c1 ^ np.uint64(k0), p1 & mask, (p0 >> s32) ^ c3 ^ np.uint64(k1), p0 & mask
            k0, k1 = (k0 + _W0) & _WORD, (k1 + _W1) & _WORD
    words = np.stack([c0, c1, c2, c3], axis=1).reshape(-1)
    return (words & np.uint64(_MANTISSA)).astype(np.float32) * np.float32(_ULP)


def philox_uniform(size: int, key: int, counter: tuple[int, int]) -> np.ndarray:
    """`size` float32 numbers in [0, 1): tf.raw_ops.StatelessRandomUniformV2(shape=[size], key=[key],
    counter=counter, alg=1 (Philox)), bit for bit. `counter` is (low, high) 64-bit halves."""
    blocks = -(-size // 4)
    low, high = counter[0] & _MASK, counter[1] & _MASK
    if not _jit.enabled():
        return _philox_uniform_numpy(key & _MASK, low, high, blocks)[:size]
    out = empty_aligned(4 * blocks, np.float32)
    k, lo64, hi64 = np.uint64(key & _MASK), np.uint64(low), np.uint64(high)
    split_units(blocks, 4, lambda lo, hi: _philox_uniform_loop(k, lo64, hi64, out, lo, hi), _MIN_PER_THREAD)
    return out[:size]


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
    shape = _shape(attrs)
    key, counter = stream(attrs, ctx)
    out = _finish(philox_uniform(int(np.prod(shape, dtype=np.int64)), key, counter).reshape(shape), attrs)
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
