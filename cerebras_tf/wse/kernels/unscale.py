"""Dynamic loss scaling's unscaling of the gradients, with their finiteness check, in one pass.

Between the backward pass and the optimizer the executor multiplies every
gradient by the float32 reciprocal of the loss scale and asks whether all of
them are finite (amp.GradScaler's contract, which also takes the global norm
for clipping). Where no clipping needs that norm, `unscale_gradients` does
both in one numba loop per gradient, which reads each element once, writes
its product and keeps the largest exponent field seen (all ones: inf or
nan). A gradient the executor owns outright is unscaled where it is; a new
array (the other operand of the product) would be one more stream through
memory: the zoo transformer's 3.8M gradient elements took 1.6 ms through
GradScaler (multiply into new arrays, then a dot product each), 0.4 ms this
way on one thread of this project's 2-core VM.
The products are numpy's `g * reciprocal`, bit for bit, under the calling
thread's denormal flushing.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from cerebras_tf.wse.kernels import _jit
from cerebras_tf.wse.memory import aligned_copy, empty_aligned

_EXPONENT = 0x7F800000  # a float32's exponent field: all ones for inf and nan


@_jit.jit
def _unscale(g: np.ndarray, reciprocal: np.float32, out: np.ndarray) -> np.uint32:  # pragma: no cover - numba
    """out = g * reciprocal (flat float32 arrays); the largest exponent field among the products."""
    top = np.uint32(0)
    for i in range(np.uint64(g.size)):
        y = g[i] * reciprocal
        out[i] = y
        top = max(top, _jit.f2u(y) & np.uint32(_EXPONENT))
    return top


@_jit.jit
def _unscale_in_place(g: np.ndarray, reciprocal: np.float32) -> np.uint32:  # pragma: no cover - numba
    """g *= reciprocal (one array: LLVM vectorises it, which `_unscale(g, r, g)` fails to); as `_unscale`."""
    top = np.uint32(0)
    for i in range(np.uint64(g.size)):
        y = g[i] * reciprocal
        g[i] = y
        top = max(top, _jit.f2u(y) & np.uint32(_EXPONENT))
    return top


@_jit.jit
def _top_exponent(g: np.ndarray) -> np.uint32:  # pragma: no cover - numba
    """The largest exponent field among g's elements (a flat float32 array)."""
    top = np.uint32(0)
    for i in range(np.uint64(g.size)):
        top = max(top, _jit.f2u(g[i]) & np.uint32(_EXPONENT))
    return top


def _finite(a: np.ndarray) -> bool:
    if _jit.enabled():
        return bool(_top_exponent(np.ascontiguousarray(a).reshape(-1)) != _EXPONENT)
    return bool(np.isfinite(a).all())


def _unscaled(g: np.ndarray, reciprocal: np.float32 | None, in_place: bool) -> tuple[np.ndarray, bool]:
    """g * reciprocal (g itself when in_place, else a new array; g or its copy for None) and whether every
    element of it is finite."""
    if g.dtype != np.float32:
        g, in_place = g.astype(np.float32), True
    if reciprocal is None:
        out = g if in_place else aligned_copy(g, np.float32)
        return out, _finite(out)
    if not _jit.enabled():
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.multiply(g, reciprocal, out=g if in_place else empty_aligned(g.shape, np.float32))
        return out, bool(np.isfinite(out).all())
    if in_place:
        return g, bool(_unscale_in_place(g.reshape(-1), reciprocal) != _EXPONENT)
    out = empty_aligned(g.shape, np.float32)
    return out, bool(_unscale(np.ascontiguousarray(g).reshape(-1), reciprocal, out.reshape(-1)) != _EXPONENT)


def unscale_gradients(grads: Sequence[np.ndarray], reciprocal: np.float32 | None,
                      in_place: Sequence[bool]) -> tuple[list[np.ndarray], bool]:
    """Each gradient, as float32, times `reciprocal` (GradScaler.reciprocal; None for a scale of 1: the
    gradient as it is, as GradScaler copies it then), and whether all of them are finite.
    `in_place[i]`: grads[i] is an array the caller owns outright, which is then unscaled where it is (when
    float32, C-contiguous and writeable); the others are left as they are, their products new arrays."""
    unscaled, finite = [], True
    r = None if reciprocal is None else np.float32(reciprocal)
    for g, here in zip(grads, in_place):
        out, ok = _unscaled(g, r, here and g.flags.c_contiguous and g.flags.writeable)
        unscaled.append(out)
        finite = finite and ok
    return unscaled, finite
