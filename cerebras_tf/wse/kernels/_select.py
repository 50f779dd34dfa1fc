"""Branch-free masked selection for the gradient kernels.

`np.where(mask, x, 0)` runs a data-dependent branch per element, which costs
several nanoseconds each when the mask is unpredictable (ReLU and max-pool
gradients): here the mask becomes an all-ones/all-zeros integer word and is
ANDed onto the value's bits, which gives the same result bit for bit.
"""
from __future__ import annotations

import numpy as np


def keep_where(mask: np.ndarray, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`np.where(mask, x, 0)` for boolean `mask` broadcastable with `x`: x's value (NaN and inf
    included) where mask holds, +0 elsewhere; in x's dtype and the broadcast shape, written to
    `out` when given (which must not overlap x)."""
    x = np.asarray(x)
    mask = np.asarray(mask, dtype=bool)
    if x.dtype.kind != "f":
        result = np.where(mask, x, np.zeros((), x.dtype))
        if out is None:
            return result
        np.copyto(out, result)
        return out
    words = np.dtype(f"i{x.dtype.itemsize}")
    if out is None:
        out = np.empty(np.broadcast_shapes(mask.shape, x.shape), x.dtype)
    bits = out.view(words)
    np.negative(mask.view(np.int8), out=bits, casting="unsafe")  # True -> -1: every bit set
    np.bitwise_and(bits, x.view(words), out=bits)
    return out
