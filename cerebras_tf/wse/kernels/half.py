"""Rounding float32 values to the half dtype in one pass: the executor's `to_half` and `cast` to half.

`cerebras_tf.amp.round_to_half` is the reference (numpy, several passes over
uint32 views); the numba loops here compute the same bits element by element,
on one thread below threads.STREAMING_MIN_ELEMENTS_PER_THREAD. `round_half`
picks the loop or the reference (`_jit.enabled()`).

IEEE float16 takes the hardware's own conversion (`to_float16`: LLVM's
fptrunc to half and fpext back, F16C's vcvtps2ph/vcvtph2ps on x86-64): the
reference's rounding is IEEE's (to nearest even, subnormals kept, overflow to
inf), so it gives the same bits for every float32 (checked over all 2**32,
with and without denormal flushing; NaNs keep their quieted float32 payload, as
in the reference): 2M elements 0.83 -> 0.61 ms, the zoo transformer's
roundings 9.6 -> 6.8 ms a step.
The other formats (bfloat16, cbfloat16) keep the arithmetic loops.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from cerebras_tf.amp import FLOAT32_MODE, half_format, round_to_half
from cerebras_tf.wse.kernels import _jit
from cerebras_tf.wse.kernels._scratch import scratch
from cerebras_tf.wse.memory import aligned_copy, empty_aligned
from cerebras_tf.wse.threads import STREAMING_MIN_ELEMENTS_PER_THREAD as STREAMING
from cerebras_tf.wse.threads import split_range

_MANTISSA_BITS = 23
_EXPONENT_MASK = np.uint32(0x7F800000)
_SIGN_MASK = np.uint32(0x80000000)


_BLOCK = 2048  # elements per block: the three passes of a block stay in L1
_QUIET = np.uint32(0x00400000)  # a float32 NaN's quiet bit


def _to_float16_py(x: Any) -> Any:  # pragma: no cover - only without numba, where no loop runs
    return np.float32(np.float16(x)) if x == x else (np.asarray(x, np.float32).view(np.uint32) | _QUIET).view(
        np.float32)


to_float16: Callable[..., Any] = _to_float16_py
if _jit._numba is not None:  # pragma: no branch
    from llvmlite import ir as _llvm
    from numba.core import types as _types
    from numba.extending import intrinsic as _intrinsic

    @_intrinsic
    def to_float16(typingctx: Any, x: Any) -> Any:  # pragma: no cover - compiled by numba
        """A float32 rounded to IEEE float16 and back (one float32 -> float32; `round_to_half`'s bits); a NaN
        keeps its payload with the quiet bit set (the conversion would cut the payload to 10 bits)."""
        if x != _types.float32:
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            value = args[0]
            rounded = builder.fpext(builder.fptrunc(value, _llvm.HalfType()), _llvm.FloatType())
            i32 = _llvm.IntType(32)
            quiet = builder.bitcast(builder.or_(builder.bitcast(value, i32), _llvm.Constant(i32, int(_QUIET))),
                                    _llvm.FloatType())
            return builder.select(builder.fcmp_unordered("uno", value, value), quiet, rounded)
        return _types.float32(_types.float32), codegen


@_jit.jit
def _round_float16(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    """out = x rounded to IEEE float16 (to_float16), element by element."""
    for i in range(x.size):
        out[i] = to_float16(x[i])


@_jit.jit
def _round_float16_in_place(x: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    """x = x rounded to IEEE float16: one array, so the loop is vectorised (`_round_float16(x, x)` fails LLVM's
    run-time overlap check and runs its scalar loop: 2M elements 2.9 ms instead of 0.35)."""
    for i in range(x.size):
        x[i] = to_float16(x[i])


@_jit.jit
def _bfloat16_bits(u: Any) -> Any:  # pragma: no cover - compiled by numba
    """The bits of the float32 whose bits are u rounded to bfloat16 (to nearest even on the top 16 bits), from
    the bits alone; a NaN's as they are (its payload could round to inf or wrap)."""
    return u if (u & 0x7FFFFFFF) > 0x7F800000 else (((u >> 16) & 1) + u + 0x7FFF) & 0xFFFF0000


@_jit.jit
def _round_bfloat16_in_place(xu: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    """_round_bfloat16 on the bits of x, in place, from the bits alone (one array: vectorised)."""
    for i in range(xu.size):
        xu[i] = _bfloat16_bits(xu[i])


# How a loop rounds each value it writes (`rounded`): not at all, to IEEE float16, or to bfloat16's 16 bits (every
# format of 8 exponent bits, as round_half). The other formats keep round_half's pass after the loop.
NO_ROUNDING, FLOAT16_ROUNDING, BFLOAT16_ROUNDING = 0, 1, 2


def rounding_code(dtype: str) -> int:
    """How a numba loop rounds the values it writes to `dtype` (`rounded`): FLOAT16_ROUNDING or
    BFLOAT16_ROUNDING where the loops run and round_half rounds the format so; NO_ROUNDING otherwise (float32
    numerics, no numba, the other formats), where a caller rounds its output after the loop (round_half)."""
    if dtype == FLOAT32_MODE or not _jit.enabled():
        return NO_ROUNDING
    fmt = half_format(dtype)
    if fmt.name == "float16":
        return FLOAT16_ROUNDING
    return BFLOAT16_ROUNDING if fmt.exponent_bits == 8 else NO_ROUNDING


@_jit.jit
def rounded(x: Any, rounding: int) -> Any:  # pragma: no cover - compiled by numba
    """One float32 value as round_half rounds it (`rounding` from rounding_code): to_float16, or bfloat16's
    round-to-nearest-even on the top 16 bits with a NaN kept; x itself for NO_ROUNDING. A loop writing its
    output through this rounds it in the same pass, with round_half's bits."""
    if rounding == FLOAT16_ROUNDING:
        return to_float16(x)
    if rounding == BFLOAT16_ROUNDING:
        return _jit.u2f(_bfloat16_bits(_jit.f2u(x)))
    return x


def rounds_in_place(dtype: str) -> bool:
    """Whether `round_half(x, dtype, out=x)` takes a loop of its own (one array, vectorised) and so costs less
    than a new array: float16 and bfloat16; the other formats' blocked loops run scalar in place."""
    fmt = half_format(dtype)
    return _jit.enabled() and (fmt.name == "float16" or fmt.exponent_bits == 8)


@_jit.jit
def _round_narrow(x: np.ndarray, xu: np.ndarray, ru: np.ndarray, block: np.ndarray, block_bits: np.ndarray,
                  lo: np.uint32, hi: np.uint32, step: np.uint32, up: np.float32,
                  down: np.float32) -> None:  # pragma: no cover - compiled by numba
    """amp.dtypes._round_narrow block by block (xu: x's bits, ru: the output's bits; block and
    block_bits: one float32 work block and its bits): C = 2**(clip(exponent(|x|)) + shift), |x| + C - C
    rounds to the format's quantum, two exact scalings overflow what is out of range to inf, then x's sign.
    Each inner loop is simple enough for the compiler to vectorise (which views made inside would stop)."""
    n = x.size
    for start in range(0, n, block.size):
        m = min(block.size, n - start)
        xs, xus, rus = x[start:start + m], xu[start:start + m], ru[start:start + m]
        for j in range(m):
            block_bits[j] = min(max(xus[j] & _EXPONENT_MASK, lo), hi) + step
        for j in range(m):
            big = block[j]
            block[j] = (((abs(xs[j]) + big) - big) * up) * down
        for j in range(m):
            rus[j] = block_bits[j] | (xus[j] & _SIGN_MASK)


@_jit.jit
def _round_bfloat16(x: np.ndarray, xu: np.ndarray, ru: np.ndarray) -> None:  # pragma: no cover - numba
    """amp.dtypes._round_bfloat16 per element: round-to-nearest-even on the top 16 bits; NaN kept."""
    for i in range(x.size):
        u = xu[i]
        ru[i] = u if x[i] != x[i] else (((u >> 16) & 1) + u + 0x7FFF) & 0xFFFF0000


def round_half(x: np.ndarray, dtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """`amp.round_to_half(x, dtype)`: a new float32 array of x's shape (64-byte aligned), or `out` (a
    C-contiguous float32 array of x's shape, which may be x itself: each element is read before it is
    written). A strided x is copied into the new array, which is then rounded in place while it is in cache
    (`round_half_in_layout` keeps a transposed view's layout instead)."""
    if out is None and not x.flags.c_contiguous and x.dtype == np.float32:
        x = out = aligned_copy(x, np.float32)  # rounded in place below
    x = np.ascontiguousarray(x, dtype=np.float32)
    if out is None:
        out = empty_aligned(x.shape, np.float32)
    elif out.dtype != np.float32 or out.shape != x.shape or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {x.shape}")
    flat, flat_out = x.reshape(-1), out.reshape(-1)
    if dtype == FLOAT32_MODE:
        np.copyto(flat_out, flat)
        return out
    fmt = half_format(dtype)
    if not _jit.enabled():
        if np.may_share_memory(flat, flat_out):  # the reference reads x after writing out
            flat = flat.copy()

        def reference(lo: int, hi: int) -> None:
            round_to_half(flat[lo:hi], dtype, flat_out[lo:hi])
        split_range(flat.size, reference)
        return out
    if fmt.name == "float16":
        if np.may_share_memory(flat, flat_out):  # out is x (the executor's fused rounding): vectorised in place
            split_range(flat.size, lambda lo, hi: _round_float16_in_place(flat_out[lo:hi]), STREAMING)
        else:
            split_range(flat.size, lambda lo, hi: _round_float16(flat[lo:hi], flat_out[lo:hi]), STREAMING)
        return out
    xu, ru = flat.view(np.uint32), flat_out.view(np.uint32)
    if fmt.exponent_bits == 8 and np.may_share_memory(flat, flat_out):
        split_range(flat.size, lambda lo, hi: _round_bfloat16_in_place(ru[lo:hi]), STREAMING)
        return out
    if fmt.exponent_bits == 8:
        split_range(flat.size, lambda lo, hi: _round_bfloat16(flat[lo:hi], xu[lo:hi], ru[lo:hi]), STREAMING)
        return out
    shift = _MANTISSA_BITS - fmt.mantissa_bits
    lo_bits = np.uint32((fmt.min_exponent + 127) << _MANTISSA_BITS)
    hi_bits = np.uint32((254 - shift) << _MANTISSA_BITS)  # keeps C finite; such |x| overflow the format anyway
    step = np.uint32(shift << _MANTISSA_BITS)
    up, down = np.float32(2.0 ** (127 - fmt.bias)), np.float32(2.0 ** (fmt.bias - 127))

    def work(lo: int, hi: int) -> None:
        block = scratch("round_half", (_BLOCK,))
        _round_narrow(flat[lo:hi], xu[lo:hi], ru[lo:hi], block, block.view(np.uint32), lo_bits, hi_bits, step, up,
                      down)
    split_range(flat.size, work, STREAMING)
    return out


def _c_order(x: np.ndarray) -> list[int] | None:
    """The axis order in which x is a C-contiguous block (x itself: 0, 1, ...), or None."""
    if x.flags.c_contiguous:
        return list(range(x.ndim))
    order = sorted(range(x.ndim), key=lambda axis: -x.strides[axis])
    return order if np.transpose(x, order).flags.c_contiguous else None


def round_half_in_layout(x: np.ndarray, dtype: str, in_place: bool = False) -> np.ndarray:
    """`round_half(x, dtype)`, laid out as x where x is a permutation of a C-contiguous float32 block (a
    transpose handed on as a view, fusion.lazy_transposes): the block is rounded into a new array in its own
    order and handed on as the same view of it, as float32 numerics hand on x itself. Saves round_half's copy
    of the strided view: the zoo transformer's eight attention transposes 0.4 ms a step on one thread.
    `in_place`: x's memory is the caller's to overwrite (the executor's dead inputs): where the block is
    writable and `rounds_in_place(dtype)`, it is rounded where it is and x itself is handed on."""
    order = _c_order(x) if x.dtype == np.float32 else None
    if order is None:
        return round_half(x, dtype)
    block = np.transpose(x, order)
    if in_place and block.flags.writeable and rounds_in_place(dtype):
        round_half(block, dtype, out=block)
        return x
    if x.flags.c_contiguous:
        return round_half(x, dtype)
    return np.transpose(round_half(block, dtype), np.argsort(order))
