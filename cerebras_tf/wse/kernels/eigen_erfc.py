"""float32 erfc as TensorFlow's CPU kernel computes it, bit for bit.

tf.math.erfc on float32 takes one of three forms, by the Eigen the installed tensorflow was built with:

* "libm" (TF 2.19 and earlier; every float32 checked on 2.15 and 2.16): Eigen calls the C library's erfcf.
  The loop calls that same function (numba's math.erfc of a float32), the numpy code too (through ctypes,
  an element a call: about 0.4 us each).
* "rcp2" (TF 2.20: unchecked, from the Eigen it is built with) and "rcp1" (TF 2.21 and later; every float32
  checked on 2.21): Eigen's own `generic_fast_erfc<float>`, written here from its formulas. x is clamped to
  [-11, 11]; for x^2 <= 1, erfc = 1 + x*S(x^2) with S of degree 5; above, erfc = exp(-x^2)(1 - lo) *
  P(1/x^2) / (x*Q(1/x^2)), + 2 for x < 0, where lo is the rounding error of x^2 (Dekker's product), exp is
  Eigen's float exp (range reduction by ln 2 in two parts, a degree-6 polynomial, times 2^m) and 1/x^2 is
  the CPU's 12-bit reciprocal estimate (x86 rcpps) after one Newton step: r*(2 - a*r) in "rcp2" (Eigen
  until 2025-11), r + r*(1 - a*r) in "rcp1". That is TF's path for its 8-lane (AVX) packets; the last
  size % 8 elements of a tensor take Eigen's scalar path, which divides and calls libm's expf instead
  (up to a few ulp apart), and so do they here. TF's bits thus depend on the CPU's rcpps, which differs
  between x86 vendors: the loops execute that instruction, and so does the numpy code (through a compiled
  helper; it divides without numba: then a few ulp apart on some elements above |x| = 1).

Arithmetic is float32 with separate multiplies and adds (TF's wheels are built without FMA), and TF's
threads flush subnormals (DAZ and FTZ): a subnormal input reads as zero and a result that would be
subnormal is zero, whatever the calling thread's MXCSR. The form follows the installed tensorflow's
version (package metadata, no TF import: eigen_erf.tf_version); off x86-64 Eigen's forms are not TF's
(other packets and reciprocal estimates), and `FORM` is None there from TF 2.20.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
import platform
from typing import Any, Callable

import numpy as np

from cerebras_tf.wse.kernels import _jit
from cerebras_tf.wse.kernels.eigen_erf import tf_version
from cerebras_tf.wse.threads import MIN_ELEMENTS_PER_THREAD, map_elementwise

F = np.float32
_TINY = _jit.FLOAT32_TINY
_ZERO, _ONE, _TWO = F(0), F(1), F(2)
_CLAMP = F(11)
_X2_MAX = _CLAMP * _CLAMP
PACKET = 8  # float32 lanes of TF's AVX packets: a tensor's last size % PACKET elements take the scalar path

# erfc(x) = 1 + x*S(x^2) for |x| <= 1, and the P/Q of the large-|x| quotient (highest power first).
_S = tuple(F(c) for c in (5.61802298761904239654541015625e-04, -4.91381669417023658752441406250e-03,
                          2.67075151205062866210937500000e-02, -1.12800106406211853027343750000e-01,
                          3.76122951507568359375000000000e-01, -1.12837910652160644531250000000e+00))
_P = tuple(F(c) for c in (1.0208116471767425537109375e-01, 4.2920666933059692382812500e-01,
                          3.2379078865051269531250000e-01, 5.3971976041793823242187500e-02))
_Q = tuple(F(c) for c in (1.7251677811145782470703125e-02, 3.9137163758277893066406250e-01, 1.0,
                          6.2173241376876831054687500e-01, 9.5662862062454223632812500e-02))
_SPLIT = F(4097)  # Veltkamp's splitter for float32: 2^12 + 1

# Eigen's float exp: m = floor(x*log2(e) + 1/2), r = x - m*ln2 in two parts, exp(r) by a degree-6 polynomial
# (its even and odd coefficients in r^2, highest power first).
_LOG2E, _HALF = F(1.44269504088896341), F(0.5)
_LN2_HI, _LN2_LO = F(-0.693359375), F(2.12194440e-4)
_E_EVEN = tuple(F(c) for c in (1.37449637986719608306884765625e-3, 4.166965186595916748046875e-2,
                               0.49999988079071044921875))
_E_ODD = tuple(F(c) for c in (8.36894474923610687255859375e-3, 0.16666518151760101318359375))

_BLOCK = 1024  # elements a loop takes per block: x^2, its reciprocal estimates, then the rest, all in L1
# libm's erfcf takes ~18 ns an element, so a pool thread's hand-off (70-90 us) pays from far fewer elements than
# threads.MIN_ELEMENTS_PER_THREAD (which suits Eigen's form, ~1.8 ns): 40,960 elements 0.75 -> 0.36 ms split in 2.
_LIBM_MIN_PER_THREAD = 1 << 14
_X86 = platform.machine().lower() in ("x86_64", "amd64")
FORMS = ("libm", "rcp2", "rcp1") if _X86 else ("libm",)  # the forms this machine computes


def tf_form() -> str | None:
    """The form the installed tensorflow's float32 erfc takes ("rcp1" when no tensorflow is installed; None
    for Eigen's own forms off x86-64)."""
    version = tf_version()
    if version is not None and version < (2, 20):
        return "libm"
    if not _X86:
        return None
    return "rcp1" if version is None or version >= (2, 21) else "rcp2"


def _rcpps4_py(buf: Any, i: Any) -> None:  # pragma: no cover - only without numba (or x86), where no loop runs
    buf[i:i + 4] = _ONE / buf[i:i + 4]


_rcpps4: Callable[..., Any] = _rcpps4_py
if _jit._numba is not None and _X86:  # pragma: no branch
    from llvmlite import ir as _llvm
    from numba.core import types as _types
    from numba.extending import intrinsic as _intrinsic

    @_intrinsic
    def _rcpps4(typingctx: Any, buf: Any, i: Any) -> Any:  # pragma: no cover - compiled by numba
        """buf[i:i + 4] (float32, in place) replaced by the CPU's reciprocal estimates (x86 rcpps)."""
        if not (isinstance(buf, _types.Array) and buf.dtype == _types.float32 and isinstance(i, _types.Integer)):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            vec = _llvm.VectorType(_llvm.FloatType(), 4)
            rcp = builder.module.declare_intrinsic("llvm.x86.sse.rcp.ps", fnty=_llvm.FunctionType(vec, [vec]))
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            where = builder.bitcast(builder.gep(data, [args[1]]), vec.as_pointer())
            builder.store(builder.call(rcp, [builder.load(where, align=4)]), where, align=4)
            return context.get_dummy_value()
        return _types.void(buf, i), codegen


def _horner_py(x: Any, coeffs: tuple[Any, ...]) -> Any:
    """Eigen's ppolevl: the polynomial with `coeffs` (highest power first) at x by Horner's rule, p*x + c at
    each step (no FMA); on scalars in the loops, on arrays in the numpy code."""
    p = coeffs[0]
    for c in coeffs[1:]:
        p = p * x + c
    return p


_horner = _jit.jit(_horner_py)


@_jit.jit
def _polys(x: Any, x2: Any, q2: Any, e: Any) -> Any:  # pragma: no cover - compiled by numba
    """Eigen's erfc from x (clamped), x^2, 1/x^2 and exp(-x^2): the small form where x^2 <= 1, else the large."""
    small = x * _horner(x2, _S) + _ONE
    g = _SPLIT * x  # x^2 - fl(x^2), exactly (Dekker, Veltkamp's split)
    hi = (x - g) + g
    lo = x - hi
    err = hi * hi - x2
    err = hi * lo + err
    err = lo * hi + err
    err = lo * lo + err
    t = e * err
    if abs(t) < _TINY:
        t = _ZERO
    zr = (e - t) * (_horner(q2, _P) / (x * _horner(q2, _Q)))
    if abs(zr) < _TINY:
        zr = _ZERO
    large = zr + (_TWO if x < _ZERO else _ZERO)
    return large if _ONE < x2 else small


@_jit.jit
def _clamped(xi: Any) -> Any:  # pragma: no cover - compiled by numba
    """x with subnormals read as zero (DAZ), clamped to [-11, 11] (NaN kept)."""
    if abs(xi) < _TINY:
        xi = xi * _ZERO
    if xi < -_CLAMP:
        xi = -_CLAMP
    if xi > _CLAMP:
        xi = _CLAMP
    return xi


@_jit.jit
def _exp_neg(x2: Any) -> Any:  # pragma: no cover - compiled by numba
    """Eigen's float exp(-x2) for 0 <= x2 <= 121 (NaN taken as 121), flushed to zero below the normal range."""
    t = -x2 if x2 <= _X2_MAX else -_X2_MAX
    m = np.floor(t * _LOG2E + _HALF)
    r = m * _LN2_HI + t
    r = m * _LN2_LO + r
    r2 = r * r
    y = r2 * (r * _horner(r2, _E_ODD) + _horner(r2, _E_EVEN)) + (r + _ONE)
    k = np.int32(m)
    y = y * _jit.u2f((max(k, np.int32(-126)) + np.int32(127)) << np.int32(23))
    return y if y >= _TINY and k >= -126 else _ZERO


@_jit.jit
def _eigen_loop(x: np.ndarray, out: np.ndarray, q: np.ndarray, newer: bool) -> None:  # pragma: no cover
    """Eigen's packet path over x into out, a block at a time: x^2 into q, rcpps on q, then the rest."""
    n = x.size
    for start in range(0, n, _BLOCK):
        m = min(n - start, _BLOCK)
        xs, outs = x[start:start + m], out[start:start + m]
        for j in range(m):
            c = _clamped(xs[j])
            q[j] = c * c
        for j in range(0, m, 4):
            _rcpps4(q, j)
        for j in range(m):
            c = _clamped(xs[j])
            x2 = c * c
            r = q[j]
            if newer:
                r = r * (_ONE - x2 * r) + r
            else:
                r = r * (_TWO - x2 * r)
            outs[j] = _polys(c, x2, r, _exp_neg(x2))


@_jit.jit
def _rcp1_loop(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    _eigen_loop(x, out, np.empty(_BLOCK + 4, np.float32), True)


@_jit.jit
def _rcp2_loop(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    _eigen_loop(x, out, np.empty(_BLOCK + 4, np.float32), False)


@_jit.jit
def _scalar_loop(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    """Eigen's scalar path (a tensor's tail): 1/x^2 by division, exp(-x^2) by libm's expf."""
    for i in range(x.size):
        c = _clamped(x[i])
        x2 = c * c
        e = math.exp(-x2)
        out[i] = _polys(c, x2, _ONE / x2, e if e >= _TINY else _ZERO)


@_jit.jit
def _libm_loop(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    """libm's erfcf, subnormals flushed as TF's threads flush them."""
    for i in range(x.size):
        xi = x[i]
        if abs(xi) < _TINY:
            xi = xi * _ZERO
        r = math.erfc(xi)
        out[i] = r if r >= _TINY or r != r else _ZERO


@_jit.jit
def _rcpps_array(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    """out = the CPU's reciprocal estimates of x (out has room for a multiple of 4)."""
    out[:x.size] = x
    for j in range(0, x.size, 4):
        _rcpps4(out, j)


def _flushed(a: np.ndarray) -> np.ndarray:
    return np.where(np.abs(a) < _TINY, _ZERO, a).astype(F, copy=False)


def _exp_neg_numpy(x2: np.ndarray) -> np.ndarray:
    t = np.where(x2 <= _X2_MAX, -x2, -_X2_MAX)
    m = np.floor(t * _LOG2E + _HALF)
    r = m * _LN2_HI + t
    r = m * _LN2_LO + r
    r2 = r * r
    y = r2 * (r * _horner_py(r2, _E_ODD) + _horner_py(r2, _E_EVEN)) + (r + _ONE)
    k = m.astype(np.int32)
    y = y * ((np.maximum(k, -126) + 127) << 23).astype(np.uint32).view(F)
    return np.where((y >= _TINY) & (k >= -126), y, _ZERO).astype(F, copy=False)


def _polys_numpy(x: np.ndarray, x2: np.ndarray, q2: np.ndarray, e: np.ndarray) -> np.ndarray:
    small = x * _horner_py(x2, _S) + _ONE
    g = _SPLIT * x
    hi = (x - g) + g
    lo = x - hi
    err = lo * lo + (lo * hi + (hi * lo + (hi * hi - x2)))
    zr = _flushed((e - _flushed(e * err)) * (_horner_py(q2, _P) / (x * _horner_py(q2, _Q))))
    large = zr + np.where(x < _ZERO, _TWO, _ZERO)
    return np.where(_ONE < x2, large, small).astype(F, copy=False)


def _rcp_estimates(a: np.ndarray) -> np.ndarray:
    """The CPU's reciprocal estimates (rcpps) of a, from a compiled helper; 1/a without numba."""
    if _jit._numba is None or not _X86:  # pragma: no cover - numba is a dependency
        return (_ONE / a).astype(F, copy=False)
    out = np.empty(a.size + 4, F)
    _rcpps_array(a.reshape(-1), out)
    return out[:a.size].reshape(a.shape)


_libm_cache: dict[str, Any] = {}


def _libm(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """The C library's float function `name` (expf, erfcf) over an array, one call an element (ctypes)."""
    if name not in _libm_cache:
        fn = getattr(ctypes.CDLL(ctypes.util.find_library("m")), name)
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
        _libm_cache[name] = np.frompyfunc(fn, 1, 1)
    vec = _libm_cache[name]
    return lambda a: np.asarray(vec(a), F).reshape(np.shape(a))


def _eigen_numpy(x: np.ndarray, form: str, scalar: bool) -> np.ndarray:
    """The loops' arithmetic as numpy float32 array operations: the packet path, or the scalar one."""
    with np.errstate(all="ignore"):
        c = np.clip(np.where(np.abs(x) < _TINY, x * _ZERO, x), -_CLAMP, _CLAMP)
        x2 = c * c
        if scalar:
            return _polys_numpy(c, x2, _ONE / x2, _flushed(_libm("expf")(-x2)))
        r = _rcp_estimates(x2)
        r = r * (_ONE - x2 * r) + r if form == "rcp1" else r * (_TWO - x2 * r)
        return _polys_numpy(c, x2, r, _exp_neg_numpy(x2))


def erfc_float32(x: np.ndarray, form: str | None = None) -> np.ndarray:
    """TF's float32 erfc of `x` (float32) in `form` (default: the installed tensorflow's), in a new array
    (64-byte aligned from the loops): numba loops, split across threads when big, or numpy without them;
    Eigen's forms take the scalar path on the last size % PACKET elements, as TF."""
    form = form or FORM or "libm"
    x = np.asarray(x, F)
    if form == "libm":
        if _jit.enabled():
            return map_elementwise(_libm_loop, x, min_per_thread=_LIBM_MIN_PER_THREAD)
        with np.errstate(all="ignore"):
            return _flushed(_libm("erfcf")(np.where(np.abs(x) < _TINY, x * _ZERO, x)))
    tail = x.size % PACKET
    if _jit.enabled():
        out = map_elementwise(_rcp1_loop if form == "rcp1" else _rcp2_loop, x, min_per_thread=MIN_ELEMENTS_PER_THREAD)
        if tail:
            _scalar_loop(x.reshape(-1)[-tail:], out.reshape(-1)[-tail:])
        return out
    out = _eigen_numpy(x, form, scalar=False)
    if tail:
        out.reshape(-1)[-tail:] = _eigen_numpy(x.reshape(-1)[-tail:], form, scalar=True)
    return out


FORM = tf_form()
