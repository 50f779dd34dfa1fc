"""Branch-free masked selection for the gradient kernels.

`np.where(mask, x, 0)` runs a data-dependent branch per element, which costs
several nanoseconds each when the mask is unpredictable (ReLU and max-pool
gradients): here the mask becomes an all-ones/all-zeros integer word and is
ANDed onto the value's bits, which gives the same result bit for bit.
"""
from __future__ import annotations

import numpy as np


def keep_where(mask: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`np.where(mask, x, 0)` for boolean `mask` broadcastable with `x`: x's value (NaN and inf
    included) where mask holds, +0 elsewhere; a new array of x's dtype and the broadcast shape."""
    x = np.asarray(x)
    mask = np.asarray(mask, dtype=bool)
    if x.dtype.kind != "f":
        return np.where(mask, x, np.zeros((), x.dtype))
    words = np.dtype(f"i{x.dtype.itemsize}")
    out = np.empty(np.broadcast_shapes(mask.shape, x.shape), words)
    np.negative(mask.view(np.int8), out=out, casting="unsafe")  # True -> -1: every bit set
    np.bitwise_and(out, x.view(words), out=out)
    return out.view(x.dtype)
