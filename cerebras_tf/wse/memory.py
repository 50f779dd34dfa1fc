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
So a step on several threads takes its big arrays' buffers from a `BufferPool`
of its Executor's instead: a buffer is kept when its array goes, and any
thread's next array of that size reuses it. The zoo transformer on two threads
then takes no page faults a step (against 500-2,000, and 5-15 ms of system
time) and peaks at about 1,090-1,110 MB resident, where malloc's two arenas
grew to 1,110-1,290 (TF's own step: 1,115). On one thread malloc's one heap
does better (the pool keeps a buffer per size, malloc coalesces freed blocks
of any size: the transformer 1,038 MB without, 1,063 with), so an executor
that has chosen one thread leaves it out.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import sys
import threading
from typing import Any, Iterator, Sequence

import numpy as np

ALIGNMENT = 64


def empty_aligned(shape: Sequence[int] | int, dtype: Any = np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array of `shape` whose data starts on a 64-byte boundary. (The address is
    read through a ctypes view of the buffer's first byte: 0.25 us, where numpy's `.ctypes` and
    __array_interface__ build Python objects and strings for 0.9 us, and the executor makes dozens of arrays a
    step.) Inside `pooled`, an array of POOLED_BYTES or more takes its buffer from that pool."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    in_use = _running[-1:]  # the last running step's pool, read in one operation (another step may end meanwhile)
    if in_use and nbytes >= POOLED_BYTES:
        buffer = in_use[0].take(nbytes + ALIGNMENT)
    else:
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


POOLED_BYTES = 1 << 18  # smaller arrays come from malloc, inside `pooled` too


class BufferPool:
    """Byte buffers kept for the arrays `empty_aligned` makes, reused by any thread once their arrays are gone.

    A buffer is free when nothing but the pool refers to it: an array from `empty_aligned`, and every view of
    it, keeps its buffer (numpy's `base`) alive, so a buffer is reused exactly when numpy would have freed it.
    Buffers are matched by their exact size (a step makes the same sizes every time) and kept until `clear`
    or the pool's end."""

    def __init__(self) -> None:
        self._buffers: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """A uint8 buffer of `nbytes` that nothing else refers to: a kept one, else a new one kept from now."""
        with self._lock:
            kept = self._buffers.setdefault(nbytes, [])
            for buffer in kept:
                if sys.getrefcount(buffer) == _UNUSED_REFERENCES:
                    return buffer
            buffer = np.empty(nbytes, np.uint8)
            kept.append(buffer)
            return buffer

    @property
    def nbytes(self) -> int:
        """The bytes of every buffer kept, free or in use."""
        with self._lock:
            return sum(size * len(kept) for size, kept in self._buffers.items())

    def clear(self) -> None:
        """Let go of every buffer (one still in use lives on with its arrays)."""
        with self._lock:
            self._buffers.clear()


# References to a kept buffer that nothing else holds, as sys.getrefcount counts them in BufferPool.take:
# the pool's list, the loop's variable and getrefcount's argument.
_UNUSED_REFERENCES = 3
_running: list[BufferPool] = []  # the pools of the steps running now, in the order they started; the last in use
_running_lock = threading.Lock()


@contextlib.contextmanager
def pooled(pool: BufferPool) -> Iterator[None]:
    """`empty_aligned` takes big buffers from `pool` meanwhile, on every thread (an Executor's step: its kernels
    run on the executor's threads). Steps of two executors at once on two threads share the later one's pool
    while both run; once neither does, no pool is in use, whichever ended first."""
    with _running_lock:
        _running.append(pool)
    try:
        yield
    finally:
        with _running_lock:
            _running.remove(pool)


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
