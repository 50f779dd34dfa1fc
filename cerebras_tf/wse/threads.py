"""Split big elementwise work across the host's cores (numpy releases the GIL inside ufuncs).

TensorFlow runs its elementwise kernels on an intra-op thread pool; the
simulator does the same for the few memory-bound passes that dominate a step
(half-precision rounding, fused optimizer updates). Results are identical to
a single-threaded run: every element is computed by the same ufuncs, only in
disjoint slices. While the executor runs kernels side by side (wse/dataflow.py),
no kernel splits: each of its threads already keeps a core busy.
"""
from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

import numpy as np

from cerebras_tf.wse import denormals
from cerebras_tf.wse.memory import empty_aligned

MIN_ELEMENTS_PER_THREAD = 1 << 16  # below this, the thread hand-off costs more than it saves
# One-pass loops that only stream memory (numba's relu, rounding, optimizer updates) stay on one thread below
# this: a second core adds little bandwidth, and it is often busy spinning in TensorFlow's or OpenBLAS's pool
# after their last kernel (relu + relu_grad in the zoo CNN's step: 8.5 ms split, 5.6 ms on one thread).
STREAMING_MIN_ELEMENTS_PER_THREAD = 1 << 24

_pool: ThreadPoolExecutor | None = None
_beside = 0  # kernels the executor runs beside the one that started last


def host_threads() -> int:
    """Cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


_blas_lock = threading.Lock()
_blas_users = 0
_blas_restore: list[tuple[Any, int]] = []
_blas_libraries: list[Any] | None = None


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """OpenBLAS (numpy's, scipy's: every BLAS threadpoolctl finds) on one thread within the block, restored
    after the last of any overlapping blocks. The executor's threads run dense kernels side by side; OpenBLAS's
    own threads spin on the cores for a while after each call, taking them from the executor's threads."""
    global _blas_users, _blas_libraries
    with _blas_lock:
        if _blas_libraries is None:
            import threadpoolctl
            _blas_libraries = list(threadpoolctl.ThreadpoolController().select(user_api="blas").lib_controllers)
        if _blas_users == 0:
            _blas_restore[:] = [(lib, lib.get_num_threads()) for lib in _blas_libraries]
            for lib in _blas_libraries:
                lib.set_num_threads(1)
        _blas_users += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_users -= 1
            if _blas_users == 0:
                for lib, count in _blas_restore:
                    lib.set_num_threads(count)


def blas_held() -> bool:
    """Whether OpenBLAS is held to one thread now (inside one_blas_thread)."""
    return _blas_users > 0


def kernels_beside(count: int) -> None:
    """The executor says how many other kernels run beside the one it starts now (wse/dataflow.py)."""
    global _beside
    _beside = count


def split_range(size: int, work: Callable[[int, int], object], min_per_thread: int = MIN_ELEMENTS_PER_THREAD) -> None:
    """Call `work(lo, hi)` over disjoint slices covering range(size), in parallel when `size` is at least
    `min_per_thread` per thread and no other kernel runs beside this one."""
    parts = min(host_threads(), size // min_per_thread)
    if parts > 1 and _beside:
        parts = 1
    if parts <= 1:
        work(0, size)
        return
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=host_threads() - 1, thread_name_prefix="wse-host")
    bounds = [size * i // parts for i in range(parts + 1)]
    mode = denormals.mxcsr()

    def task(lo: int, hi: int) -> None:
        with denormals.as_in(mode):  # flushing denormals or not, as the kernel's own thread
            work(lo, hi)
    futures = [_pool.submit(task, bounds[i], bounds[i + 1]) for i in range(1, parts)]
    work(bounds[0], bounds[1])
    for future in futures:
        future.result()


def map_elementwise(fn: Callable[..., Any], *arrays: np.ndarray, dtype: Any = None,
                    min_per_thread: int = MIN_ELEMENTS_PER_THREAD) -> np.ndarray:
    """A new (64-byte aligned) array `out` (arrays[0]'s shape, `dtype` or arrays[0]'s) filled by
    `fn(*arrays, out=out)` for same-shaped arrays, on flat slices in parallel when they are big (see
    split_range); fn writes every element. (Not into one of `arrays`: a numba loop writing where it reads
    cannot be vectorised.)"""
    flats = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    out = empty_aligned(arrays[0].shape, dtype or arrays[0].dtype)
    flat_out = out.reshape(-1)

    def work(lo: int, hi: int) -> None:
        fn(*(f[lo:hi] for f in flats), out=flat_out[lo:hi])
    split_range(flat_out.size, work, min_per_thread)
    return out
