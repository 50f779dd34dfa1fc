"""Half-precision formats of the simulated WSE and fast float32 -> half rounding.

Three 16-bit formats are supported, all IEEE-754-style binary formats with an
implicit leading bit, bias ``2**(E-1) - 1``, gradual underflow (exponent field 0
holds zeros and subnormals) and an all-ones exponent field for +-inf / NaN:

=========  ==  ==  ====  ===================  ===============  =======
name       E   M   bias  max finite           smallest normal  epsilon
=========  ==  ==  ====  ===================  ===============  =======
float16    5   10  15    65504                2**-14           2**-10
bfloat16   8   7   127   ~3.3895e38           2**-126          2**-7
cbfloat16  6   9   31    (2-2**-9)*2**31      2**-30           2**-9
=========  ==  ==  ====  ===================  ===============  =======

cbfloat16 (Cerebras' 1-6-9 format) is defined here by analogy with float16 and
bfloat16: bias 31, subnormals down to ``2**-39``, exponent field 63 reserved for
inf (mantissa 0) and NaN, so ``max_finite = 4290772992.0``. Values are never
stored as 16-bit words: the simulator keeps float32 arrays whose values are
exactly representable in the half format (:func:`round_to_half`).

Rounding is round-to-nearest, ties-to-even, on the float32 value (inputs of
another dtype are cast to float32 first). Magnitudes at or beyond
``max_finite + ulp/2`` become +-inf, exactly as an IEEE cast would; NaN stays
NaN; the sign of zero is kept. Only the default round-to-nearest float
environment is assumed; flush-to-zero/denormals-are-zero would not change results.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "FLOAT32_MODE",
    "HALF_DTYPES",
    "HalfFormat",
    "get_half_dtype",
    "half_format",
    "round_to_half",
    "set_half_dtype",
]

HALF_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "cbfloat16")
FLOAT32_MODE = "float32"  # no half rounding at all: the simulator computes in float32, for parity checks against TF

_F32_MANTISSA_BITS = 23
_ABS_MASK = np.uint32(0x7FFFFFFF)
_SIGN_MASK = np.uint32(0x80000000)
_EXPONENT_MASK = np.uint32(0x7F800000)
_BLOCK = 1 << 18  # elements rounded per pass sequence: 1 MiB per array, within a core's L2


@dataclass(frozen=True)
class HalfFormat:
    """Facts about one half format (values are Python floats/ints)."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max_finite: float
    smallest_normal: float
    smallest_subnormal: float
    epsilon: float  # distance from 1.0 to the next representable value

    @property
    def min_exponent(self) -> int:
        """Unbiased exponent of the smallest normal number (``1 - bias``)."""
        return 1 - self.bias

    @property
    def max_exponent(self) -> int:
        """Unbiased exponent of the largest finite number (``bias``)."""
        return self.bias


def _make_format(name: str, exponent_bits: int, mantissa_bits: int) -> HalfFormat:
    bias = 2 ** (exponent_bits - 1) - 1
    emin = 1 - bias
    return HalfFormat(
        name=name,
        exponent_bits=exponent_bits,
        mantissa_bits=mantissa_bits,
        bias=bias,
        max_finite=(2.0 - 2.0 ** -mantissa_bits) * 2.0 ** bias,
        smallest_normal=2.0 ** emin,
        smallest_subnormal=2.0 ** (emin - mantissa_bits),
        epsilon=2.0 ** -mantissa_bits,
    )


_FORMATS: dict[str, HalfFormat] = {
    "float16": _make_format("float16", 5, 10),
    "bfloat16": _make_format("bfloat16", 8, 7),
    "cbfloat16": _make_format("cbfloat16", 6, 9),
    FLOAT32_MODE: _make_format(FLOAT32_MODE, 8, 23),
}

_half_dtype: str = "float16"


def _canonical(value: Any) -> str:
    """Map a half dtype name (or numpy float16 / ml_dtypes bfloat16 dtype) to its name."""
    if isinstance(value, str):
        name = value.strip().lower()
        if name in _FORMATS:
            return name
    else:
        try:
            name = np.dtype(value).name
        except (TypeError, ValueError):
            name = None
        if name in ("float16", "bfloat16", FLOAT32_MODE):
            return name
    raise ValueError(
        f"Unsupported half dtype {value!r}: choose one of "
        f"{', '.join(repr(n) for n in HALF_DTYPES)}, or {FLOAT32_MODE!r} for float32 numerics (no half rounding)."
    )


def set_half_dtype(value: Any) -> str:
    """Select the half dtype used by the simulated WSE; returns its canonical name.

    Accepts ``"float16"`` (default), ``"bfloat16"`` or ``"cbfloat16"`` (case
    insensitive), or the numpy float16 / ml_dtypes bfloat16 dtype. ``"float32"``
    (or ``np.float32``) selects float32 numerics: nothing is rounded, so a run
    on the simulated WSE can be checked step by step against TensorFlow on CPU.
    Anything else raises ``ValueError`` listing the choices. Takes effect for
    executors created afterwards (each run reads it when it starts), except
    runs whose CSRunConfig has ``cs_config`` ``use_cbfloat16=True``: those use
    cbfloat16 (the config's choice wins).
    """
    global _half_dtype
    _half_dtype = _canonical(value)
    return _half_dtype


def get_half_dtype() -> str:
    """The currently selected half dtype name."""
    return _half_dtype


def half_format(dtype: Any = None) -> HalfFormat:
    """The :class:`HalfFormat` of ``dtype`` (default: the selected half dtype)."""
    return _FORMATS[_half_dtype if dtype is None else _canonical(dtype)]


def _round_bfloat16(x: np.ndarray, out: np.ndarray) -> None:
    """bfloat16 keeps float32's exponent: round-to-nearest-even on the top 16 bits."""
    u = x.view(np.uint32)
    r = out.view(np.uint32)
    # Add 0x7FFF plus the lowest kept bit, then truncate; a carry into the exponent
    # (or up to the inf pattern) is the correct IEEE result, subnormals included.
    np.right_shift(u, np.uint32(16), out=r)
    np.bitwise_and(r, np.uint32(1), out=r)
    np.add(r, u, out=r)
    np.add(r, np.uint32(0x7FFF), out=r)
    np.bitwise_and(r, np.uint32(0xFFFF0000), out=r)
    nan = np.isnan(x)
    if nan.any():  # NaN payloads may have rounded to inf or wrapped: keep the input
        np.copyto(r, u, where=nan)


def _round_narrow(x: np.ndarray, fmt: HalfFormat, out: np.ndarray) -> None:
    """Formats with fewer exponent bits than float32 (float16, cbfloat16).

    Branch-free: with ``e = max(exponent(|x|), emin)`` and ``C = 2**(e + 23 - M)``,
    the float32 sum ``|x| + C`` lies in ``[C, 2C)`` whose spacing is the format's
    quantum at ``e``, so float32 round-to-nearest-even performs the format's
    rounding (normal and subnormal alike) and ``(|x| + C) - C`` is exact. Values
    beyond the format's range then overflow to inf by an exact scaling
    ``* 2**(127 - bias) * 2**(bias - 127)``; inf and NaN pass through unchanged.
    One temporary; every other pass writes into ``out``.
    """
    u = x.view(np.uint32)
    shift = _F32_MANTISSA_BITS - fmt.mantissa_bits
    lo = np.uint32((fmt.min_exponent + 127) << _F32_MANTISSA_BITS)
    hi = np.uint32((254 - shift) << _F32_MANTISSA_BITS)  # keeps C finite; such |x| overflow the format anyway
    c = np.bitwise_and(u, _EXPONENT_MASK)  # exponent(|x|) in place
    np.clip(c, lo, hi, out=c)
    np.add(c, np.uint32(shift << _F32_MANTISSA_BITS), out=c)
    big = c.view(np.float32)
    r = out.view(np.uint32)
    np.bitwise_and(u, _ABS_MASK, out=r)
    with np.errstate(over="ignore", invalid="ignore"):
        np.add(out, big, out=out)
        np.subtract(out, big, out=out)
        np.multiply(out, np.float32(2.0 ** (127 - fmt.bias)), out=out)  # |s| >= 2**(bias+1) -> inf, others exact
        np.multiply(out, np.float32(2.0 ** (fmt.bias - 127)), out=out)
    np.bitwise_and(u, _SIGN_MASK, out=c)
    np.bitwise_or(r, c, out=r)


def round_to_half(x: Any, dtype: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Round ``x`` to the half format ``dtype`` (default: the selected one).

    Returns a float32 array of the same shape whose values are exactly
    representable in the format (round-to-nearest-even, IEEE overflow to +-inf,
    subnormals kept, NaN preserved): a new one, or ``out`` (a C-contiguous
    float32 array of x's size that does not overlap x). Fully vectorised on
    uint32 views.
    """
    fmt = half_format(dtype)
    arr = np.asarray(x, dtype=np.float32)
    if out is None:
        out = np.empty(arr.shape, np.float32)
    elif out.dtype != np.float32 or out.size != arr.size or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of {arr.size} elements")
    flat, flat_out = np.ascontiguousarray(arr).reshape(-1), out.reshape(-1)
    if fmt.name == FLOAT32_MODE:
        np.copyto(flat_out, flat)
        return out.reshape(arr.shape)
    for lo in range(0, flat.size, _BLOCK):  # blocks that stay in cache across the passes
        hi = lo + _BLOCK
        if fmt.exponent_bits == 8:
            _round_bfloat16(flat[lo:hi], flat_out[lo:hi])
        else:
            _round_narrow(flat[lo:hi], fmt, flat_out[lo:hi])
    return out.reshape(arr.shape)
