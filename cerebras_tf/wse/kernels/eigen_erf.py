"""float32 erf as TensorFlow's CPU kernel computes it: Eigen's rational approximation, bit for bit.

tf.math.erf on float32 is Eigen's `generic_fast_erf` (SpecialFunctionsImpl.h), one of two forms:

* "clamped" (the Eigen of TF 2.19 and earlier; 2.15 to 2.19 checked): erf(x) = x*P(x^2) / Q(x^2) with P
  of degree 4 and Q of degree 6 in x^2, and sign(x) where |x| >= 3.8325 (erfinv(1 - 2^-23)).
* "polevl" (the Eigen of TF 2.20 and later; 2.20 and 2.21 checked): x^2 capped at 16, P and Q of degree 5 in x^2, the
  quotient clamped to [-1, 1].

Both evaluate the polynomials by Horner's rule with a separate multiply and add (TF's wheels are built
without FMA) in float32, and TF's threads flush subnormals (DAZ): a subnormal x gives a zero of its sign.
Which form the installed tensorflow uses is read from its version (package metadata: no TF import): up to
2.19 "clamped", from 2.20 "polevl" (each release's latest patch compared with tf.math.erf bit for bit).
"""
from __future__ import annotations

import importlib.metadata

import numpy as np

from cerebras_tf.wse.kernels import _jit
from cerebras_tf.wse.threads import STREAMING_MIN_ELEMENTS_PER_THREAD, map_elementwise

F = np.float32
_TINY = _jit.FLOAT32_TINY
_ONE = F(1)

# "clamped": numerator (odd) and denominator (even) coefficients, highest power first.
_CA9, _CA7, _CA5, _CA3, _CA1 = (F(c) for c in (0.00022905065861350646, 0.0034082910107109506,
                                                0.050955695062380861, 0.18520832239976145, 1.128379143519084))
_CB12, _CB10, _CB8, _CB6, _CB4, _CB2, _CB0 = (F(c) for c in (
    -1.1791602954361697e-7, 0.000023547966471313185, 0.0010179625278914885, 0.014070470171167667,
    0.11098505178285362, 0.49746925110067538, 1.0))
_CLAMP_AT = F(3.832506856900711)

# "polevl": the same, as float32 values written out exactly.
_PA = tuple(F(c) for c in (2.123732201653183437883853912353515625e-06, 2.861979592125862836837768554687500000e-04,
                           3.658048342913389205932617187500000000e-03, 5.243302136659622192382812500000000000e-02,
                           1.874160766601562500000000000000000000e-01, 1.128379106521606445312500000000000000e+00))
_PA0, _PA1, _PA2, _PA3, _PA4, _PA5 = _PA
_PB = tuple(F(c) for c in (3.89185734093189239501953125000e-05, 1.14329601638019084930419921875e-03,
                           1.47520881146192550659179687500e-02, 1.12945675849914550781250000000e-01,
                           4.99425798654556274414062500000e-01, 1.0))
_PB0, _PB1, _PB2, _PB3, _PB4, _PB5 = _PB
_X2_CAP = F(16)

FORMS = ("clamped", "polevl")


def tf_version() -> tuple[int, int] | None:
    """The installed tensorflow's (major, minor), from its package metadata (no TF import); None without one."""
    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tf-nightly"):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        major, minor = (int(p) if p.isdigit() else 0 for p in (version.split(".") + ["0"])[:2])
        return major, minor
    return None


def tf_form() -> str:
    """The form the installed tensorflow's erf takes ("polevl" when no tensorflow is installed)."""
    version = tf_version()
    return "clamped" if version is not None and version < (2, 20) else "polevl"


@_jit.jit
def _erf_clamped_loop(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    for i in range(x.size):
        xi = x[i]
        if abs(xi) < _TINY:
            xi = xi * F(0)  # DAZ: a subnormal reads as a zero of its sign
        x2 = xi * xi
        p = x2 * _CA9 + _CA7
        p = x2 * p + _CA5
        p = x2 * p + _CA3
        p = x2 * p + _CA1
        p = xi * p
        q = x2 * _CB12 + _CB10
        q = x2 * q + _CB8
        q = x2 * q + _CB6
        q = x2 * q + _CB4
        q = x2 * q + _CB2
        q = x2 * q + _CB0
        r = p / q
        if _CLAMP_AT <= abs(xi):
            r = _ONE if xi > 0 else -_ONE
        out[i] = r


@_jit.jit
def _erf_polevl_loop(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    for i in range(x.size):
        xi = x[i]
        if abs(xi) < _TINY:
            xi = xi * F(0)
        x2 = xi * xi
        if not x2 < _X2_CAP:  # NaN too, as Eigen's pmin(16, x*x)
            x2 = _X2_CAP
        p = _PA0 * x2 + _PA1
        p = p * x2 + _PA2
        p = p * x2 + _PA3
        p = p * x2 + _PA4
        p = p * x2 + _PA5
        p = xi * p
        q = _PB0 * x2 + _PB1
        q = q * x2 + _PB2
        q = q * x2 + _PB3
        q = q * x2 + _PB4
        q = q * x2 + _PB5
        r = p / q
        if r > _ONE:  # NaN stays
            r = _ONE
        if r < -_ONE:
            r = -_ONE
        out[i] = r


def _erf_numpy(x: np.ndarray, form: str) -> np.ndarray:
    """The loops' arithmetic as numpy float32 array operations (the same bits)."""
    with np.errstate(all="ignore"):
        x = np.where(np.abs(x) < _TINY, x * F(0), x)
        x2 = x * x
        if form == "clamped":
            p, q = x2 * _CA9 + _CA7, x2 * _CB12 + _CB10
            for c in (_CA5, _CA3, _CA1):
                p = x2 * p + c
            for c in (_CB8, _CB6, _CB4, _CB2, _CB0):
                q = x2 * q + c
            return np.where(_CLAMP_AT <= np.abs(x), np.where(x > 0, _ONE, -_ONE), (x * p) / q).astype(F, copy=False)
        x2 = np.where(x2 < _X2_CAP, x2, _X2_CAP)
        p, q = _PA0 * x2 + _PA1, _PB0 * x2 + _PB1
        for c in _PA[2:]:
            p = p * x2 + c
        for c in _PB[2:]:
            q = q * x2 + c
        r = (x * p) / q
        r = np.where(r > _ONE, _ONE, r)
        return np.where(r < -_ONE, -_ONE, r).astype(F, copy=False)


def erf_float32(x: np.ndarray, form: str | None = None) -> np.ndarray:
    """TF's float32 erf of `x` (float32) in `form` (default: the installed tensorflow's), in a new
    64-byte aligned array: one numba pass, or numpy without the loops."""
    form = form or _FORM
    if not _jit.enabled():
        return _erf_numpy(np.asarray(x, F), form)
    loop = _erf_clamped_loop if form == "clamped" else _erf_polevl_loop
    return map_elementwise(loop, x, min_per_thread=STREAMING_MIN_ELEMENTS_PER_THREAD)


_FORM = tf_form()
