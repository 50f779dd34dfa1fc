"""New arrays on 64-byte boundaries.

numpy aligns its arrays to 16 bytes; TensorFlow's kernels (the TF host-kernel
provider) take a numpy operand without copying it only when it starts on a
64-byte boundary, so the arrays the executor hands them are made here.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

ALIGNMENT = 64


def empty_aligned(shape: Sequence[int] | int, dtype: Any = np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array of `shape` whose data starts on a 64-byte boundary."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    buffer = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -buffer.ctypes.data % ALIGNMENT
    return buffer[start:start + nbytes].view(dtype).reshape(shape)
