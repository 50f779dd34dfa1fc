"""Per-thread work buffers that kernels reuse across calls for temporaries that never leave the kernel.

A fresh multi-megabyte numpy array is fresh memory from the OS (the allocator hands big
blocks back when they are freed), which costs a page fault per 4 KiB page on first touch:
for the im2col patches of a convolution that is as much as the copy itself.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Sequence

import numpy as np

_local = threading.local()


def scratch(name: str, shape: Sequence[int], dtype: Any = np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array of `shape`: the same memory on every call with `name` on this
    thread (grown when too small), so it is valid only until the next call with the same name."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    buffers: dict[str, np.ndarray] = _local.__dict__.setdefault("buffers", {})
    buf = buffers.get(name)
    if buf is None or buf.nbytes < nbytes:
        buf = buffers[name] = np.empty(nbytes, np.uint8)
    return buf[:nbytes].view(dtype).reshape(shape)
