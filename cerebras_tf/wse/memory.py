"""New arrays on 64-byte boundaries, and malloc set to reuse freed memory.

numpy aligns its arrays to 16 bytes; TensorFlow's kernels (the TF host-kernel
provider) take a numpy operand without copying it only when it starts on a
64-byte boundary, so the arrays the executor hands them are made here.

A step allocates and frees the same few hundred megabytes every time. glibc's
malloc maps each block above its threshold (128 KiB to start) afresh and
unmaps it on free, so every page of it is faulted in again on first touch:
17,000 faults per step of the zoo transformer, a tenth of its time.
TensorFlow's allocator keeps its buffers; `keep_freed_memory` asks malloc to
do the same (blocks up to 32 MiB from its heap, freed memory kept for reuse),
which leaves 60 faults per step and the peak resident memory as it was. That
is on one thread: the executor's second thread allocates from another of
malloc's arenas, whose heaps are unmapped when they empty, and the transformer
on two threads takes about 3,400 faults a step (7 ms of system time). One
arena for every thread (mallopt M_ARENA_MAX=1) takes that to 50, but the step
took no less time (measured in processes taking turns), so malloc's arenas
are left as they are. The second arena also holds a second peak: on two
threads the zoo transformer's resident memory grew to about 1,140 MB, against
1,050 with MALLOC_ARENA_MAX=1 in the environment (the step 0.95-0.995x the
time, processes taking turns). Only the environment can ask for that: glibc
fixes its arena limit when a thread first needs an arena, which TensorFlow's
threads have done before an Executor exists (mallopt then changes nothing).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
import sys
from typing import Any, Sequence

import numpy as np

ALIGNMENT = 64


def empty_aligned(shape: Sequence[int] | int, dtype: Any = np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array of `shape` whose data starts on a 64-byte boundary. (The address is
    read through a ctypes view of the buffer's first byte: 0.25 us, where numpy's `.ctypes` and
    __array_interface__ build Python objects and strings for 0.9 us, and the executor makes dozens of arrays a
    step.)"""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    buffer = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -ctypes.addressof(ctypes.c_char.from_buffer(buffer)) % ALIGNMENT
    return buffer[start:start + nbytes].view(dtype).reshape(shape)


def aligned_copy(value: Any, dtype: Any) -> np.ndarray:
    """`value` as a new C-contiguous array of `dtype` on a 64-byte boundary (TensorFlow's kernels copy an
    operand that is not aligned: the zoo CNN's 1 MB conv input took 1.77 ms at 16 bytes past, 1.53 aligned)."""
    value = np.asarray(value)
    out = empty_aligned(value.shape, dtype)
    out[...] = value
    return out


_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # blocks below this come from malloc's heap (and go back to it)
TRIM_THRESHOLD = 1 << 30  # free memory at the heap's top kept, up to this, instead of returned to the OS
_kept = False


def keep_freed_memory() -> bool:
    """Have glibc's malloc serve blocks up to MMAP_THRESHOLD from its heap and keep freed memory for reuse
    (once per process; the process's resident memory then does not shrink after its peak). Whether it
    applies: False off Linux/glibc."""
    global _kept
    if _kept:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _kept = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _kept
