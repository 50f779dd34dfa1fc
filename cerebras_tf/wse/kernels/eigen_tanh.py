"""float32 tanh as TensorFlow's CPU kernel computes it: Eigen's rational approximation, bit for bit.

tf.math.tanh on float32 is Eigen's fast-math tanh (`ptanh_float`, earlier `generic_fast_tanh_float`), a
quotient of an odd and an even polynomial of the input clamped to [-c, c], in one of two forms:

* "13/6" (Eigen before August 2024; TF 2.15 and 2.16 checked, 2.17 by its release date): numerator of degree
  13, denominator of degree 6, Horner's rule from the highest power, c = 7.90531110763549805, and x itself
  where |x| < 0.0004.
* "9/8" (Eigen from August 2024; TF 2.21 checked, 2.18 to 2.20 by their release dates): numerator
  x^3 * P(x^2) + x with P of degree 3, denominator of degree 4 in x^2, c = 7.90738964080810547.

Both in float32 with a separate multiply and add (TF's wheels are built without FMA: c is the non-FMA
constant), and TF's threads flush subnormals (DAZ): a subnormal x gives a zero of its sign. numpy's tanh
differs from both in the last bits of most inputs (58-65% of normal samples, up to 6 ulp). Which form the
installed tensorflow uses is read from its version (package metadata, no TF import): up to 2.17 "13/6".

Every operation is exactly rounded, so the same statements run inside a chain's loop (wse/chains.py:
`chain_lines`) give the kernel's bits.
"""
from __future__ import annotations

import numpy as np

from cerebras_tf.wse.kernels import _jit
from cerebras_tf.wse.kernels.eigen_erf import tf_version
from cerebras_tf.wse.threads import map_elementwise

F = np.float32
FORMS = ("13/6", "9/8")
_TINY = _jit.FLOAT32_TINY

# "13/6": numerator (odd, x^13 first) and denominator (even, x^6 first) coefficients, the clamp, the cut
_A13 = tuple(F(c) for c in (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
                            5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
                            4.89352455891786e-03))
_B13 = tuple(F(c) for c in (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
                            4.89352518554385e-03))
_CLAMP13 = F(7.90531110763549805)
_SMALL13 = F(0.0004)
# "9/8": P (x^6 first) and the denominator (x^8 first), the clamp
_A9 = tuple(F(c) for c in (1.394553628e-8, 2.102733560e-5, 3.520756727e-3, 1.340216100e-1))
_B9 = tuple(F(c) for c in (8.015776984e-7, 3.326951409e-4, 2.597254514e-2, 4.673548340e-1, 1.0))
_CLAMP9 = F(7.90738964080810547)


def tf_form() -> str:
    """The form the installed tensorflow's tanh takes ("9/8" when no tensorflow is installed)."""
    version = tf_version()
    return "13/6" if version is not None and version < (2, 18) else "9/8"


def _f(value: np.float32) -> str:
    return f"np.float32({float(value)!r})"  # float32 -> float64 is exact, and repr round-trips it


def chain_lines(x: str, out: str, form: str | None = None) -> list[str]:
    """Statements (numba or numpy scalar code) setting `out` to TF's tanh of the float32 `x` in `form`
    (default: the installed tensorflow's); temporaries are named `out` plus a suffix."""
    form = form or FORM
    lines = [f"{out}x = {x} * np.float32(0.0) if abs({x}) < {_f(_TINY)} else {x}"]  # DAZ
    clamp = _CLAMP13 if form == "13/6" else _CLAMP9
    # pmax(pmin(x, c), -c): SSE's minps/maxps with x second, which they return when either is NaN
    lines += [f"{out}m = {_f(clamp)} if {_f(clamp)} < {out}x else {out}x",
              f"{out}c = {_f(-clamp)} if {_f(-clamp)} > {out}m else {out}m",
              f"{out}2 = {out}c * {out}c"]
    if form == "13/6":
        lines.append(f"{out}p = {out}2 * {_f(_A13[0])} + {_f(_A13[1])}")
        lines += [f"{out}p = {out}2 * {out}p + {_f(a)}" for a in _A13[2:]]
        lines.append(f"{out}q = {out}2 * {_f(_B13[0])} + {_f(_B13[1])}")
        lines += [f"{out}q = {out}2 * {out}q + {_f(b)}" for b in _B13[2:]]
        lines.append(f"{out} = {out}c if abs({out}x) < {_f(_SMALL13)} else ({out}c * {out}p) / {out}q")
        return lines
    lines.append(f"{out}3 = {out}2 * {out}c")
    lines.append(f"{out}p = {_f(_A9[0])} * {out}2 + {_f(_A9[1])}")
    lines += [f"{out}p = {out}p * {out}2 + {_f(a)}" for a in _A9[2:]]
    lines.append(f"{out}q = {_f(_B9[0])} * {out}2 + {_f(_B9[1])}")
    lines += [f"{out}q = {out}q * {out}2 + {_f(b)}" for b in _B9[2:]]
    lines.append(f"{out} = ({out}3 * {out}p + {out}c) / {out}q")
    return lines


_A13_0, _A13_1, _A13_2, _A13_3, _A13_4, _A13_5, _A13_6 = _A13
_B13_0, _B13_1, _B13_2, _B13_3 = _B13
_A9_0, _A9_1, _A9_2, _A9_3 = _A9
_B9_0, _B9_1, _B9_2, _B9_3, _B9_4 = _B9


@_jit.jit
def _tanh13_loop(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    for i in range(x.size):
        xi = x[i]
        if abs(xi) < _TINY:
            xi = xi * F(0)  # DAZ: a subnormal reads as a zero of its sign
        m = _CLAMP13 if _CLAMP13 < xi else xi  # pmin, then pmax (minps/maxps with the input second): NaN passes
        c = -_CLAMP13 if -_CLAMP13 > m else m
        x2 = c * c
        p = x2 * _A13_0 + _A13_1
        p = x2 * p + _A13_2
        p = x2 * p + _A13_3
        p = x2 * p + _A13_4
        p = x2 * p + _A13_5
        p = x2 * p + _A13_6
        q = x2 * _B13_0 + _B13_1
        q = x2 * q + _B13_2
        q = x2 * q + _B13_3
        out[i] = c if abs(xi) < _SMALL13 else (c * p) / q


@_jit.jit
def _tanh9_loop(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    for i in range(x.size):
        xi = x[i]
        if abs(xi) < _TINY:
            xi = xi * F(0)
        m = _CLAMP9 if _CLAMP9 < xi else xi
        c = -_CLAMP9 if -_CLAMP9 > m else m
        x2 = c * c
        p = _A9_0 * x2 + _A9_1
        p = p * x2 + _A9_2
        p = p * x2 + _A9_3
        q = _B9_0 * x2 + _B9_1
        q = q * x2 + _B9_2
        q = q * x2 + _B9_3
        q = q * x2 + _B9_4
        out[i] = ((x2 * c) * p + c) / q


def tanh_numpy(x: np.ndarray, form: str | None = None) -> np.ndarray:
    """The loop's arithmetic as numpy float32 array operations (the same bits), for runs without numba."""
    form = form or FORM
    x = np.asarray(x, F)
    with np.errstate(all="ignore"):
        x = np.where(np.abs(x) < _TINY, x * F(0), x)
        clamp = _CLAMP13 if form == "13/6" else _CLAMP9
        m = np.where(clamp < x, clamp, x)
        c = np.where(-clamp > m, -clamp, m)
        x2 = c * c
        if form == "13/6":
            p, q = x2 * _A13[0] + _A13[1], x2 * _B13[0] + _B13[1]
            for a in _A13[2:]:
                p = x2 * p + a
            for b in _B13[2:]:
                q = x2 * q + b
            return np.where(np.abs(x) < _SMALL13, c, (c * p) / q).astype(F, copy=False)
        p, q = _A9[0] * x2 + _A9[1], _B9[0] * x2 + _B9[1]
        for a in _A9[2:]:
            p = p * x2 + a
        for b in _B9[2:]:
            q = q * x2 + b
        return (((x2 * c) * p + c) / q).astype(F, copy=False)


def tanh_float32(x: np.ndarray, form: str | None = None) -> np.ndarray:
    """TF's float32 tanh of `x` (float32) in `form` (default: the installed tensorflow's), in a new 64-byte
    aligned array: one numba pass (split across threads when big), or numpy without the loops."""
    form = form or FORM
    if not _jit.enabled():
        return tanh_numpy(x, form)
    return map_elementwise(_tanh13_loop if form == "13/6" else _tanh9_loop, x)


FORM = tf_form()
