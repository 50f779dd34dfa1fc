"""Split big elementwise work across the host's cores (numpy releases the GIL inside ufuncs).

TensorFlow runs its elementwise kernels on an intra-op thread pool; the
simulator does the same for the few memory-bound passes that dominate a step
(half-precision rounding, fused optimizer updates). Results are identical to
a single-threaded run: every element is computed by the same ufuncs, only in
disjoint slices.

Two ways to split: `split_range` hands Python work to a pool thread (a hand-off
costs 70-90 us on this project's 2-core VM, benchmarks/handoff_bench.py), and
`run_loop` runs a compiled loop's parallel version (the chains', wse/chains.py)
on numba's own threads (OpenMP or TBB), which wait for work without the GIL,
spinning for a few milliseconds after each loop: a hand-off there costs a few
microseconds, so loops of 128K elements already gain. While the executor runs
kernels side by side (wse/dataflow.py), split_range, and run_loop beside another
kernel, cut the work into blocks the executor's own threads share (`sharing`):
a thread that comes free joins in, and no pool thread competes for the cores.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from cerebras_tf.wse import denormals
from cerebras_tf.wse.memory import empty_aligned

_numba: Any
try:
    import numba as _numba
except ImportError:  # pragma: no cover - numba is a dependency
    _numba = None

MIN_ELEMENTS_PER_THREAD = 1 << 16  # below this, the thread hand-off costs more than it saves
# One-pass loops that only stream memory (numba's relu, rounding, optimizer updates) stay on one thread below
# this: a second core adds little bandwidth, and it is often busy spinning in TensorFlow's or OpenBLAS's pool
# after their last kernel (relu + relu_grad in the zoo CNN's step: 8.5 ms split, 5.6 ms on one thread).
STREAMING_MIN_ELEMENTS_PER_THREAD = 1 << 24

# A compiled loop (a chain's, wse/chains.py) is split on numba's own threads (its OpenMP or TBB layer) from this
# many elements per thread: they wait for work spinning without the GIL (briefly: short_openmp_spin), so
# a hand-off soon after a loop costs microseconds where a Python pool thread's costs 70-90 (handoff_bench).
LOOP_MIN_ELEMENTS_PER_THREAD = 1 << 16

_beside = 0  # kernels the executor runs beside the one that started last
_loop_threads: bool | None = None  # whether numba's parallel loops may run in this process (probed on first use)
_loop_threads_lock = threading.Lock()


_host_threads: int | None = None


def host_threads() -> int:
    """Cores this process may run on: read once per process (a system call and a set on each split otherwise),
    and again in a forked child."""
    global _host_threads
    if _host_threads is None:
        try:
            _host_threads = max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # not on Linux
            _host_threads = max(1, os.cpu_count() or 1)
    return _host_threads


def _forget_host_threads() -> None:
    global _host_threads
    _host_threads = None


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


# While the executor runs kernels side by side, split_range cuts a kernel's range into at most this many blocks
# per core, which its threads take as they come free (wse/dataflow.py). More blocks balance a late joiner better,
# but each sgemm block packs its other operand again: 1024x256x1024 on one thread took 5.34 ms whole, 5.59 in
# four row blocks and 5.92 in eight.
SHARED_BLOCKS_PER_THREAD = 2

# split_range cuts its range into this many chunks per thread, which the threads take one at a time: a helper
# thread that wakes late (70-90 us on this project's VM, more while TensorFlow's threads spin on the cores) joins
# in for what is left, instead of the caller waiting for a fixed half. The zoo CNN's step (8 splits) spent
# 0.80-1.11 ms a step waiting for its helpers with a fixed half each, 0.40-0.47 ms with chunks. A chunk costs
# a call (about 1.5 us for a numba loop). The chunks' bounds depend on the range alone, never on the timing.
CHUNKS_PER_THREAD = 4


_local = threading.local()  # .share: the executor run's hook for sharing a kernel's blocks (sharing)


@contextlib.contextmanager
def sharing(share: Callable[[Sequence[int], Callable[[int, int], object]], None]) -> Iterator[None]:
    """Within the block, split_range on this thread hands its blocks to `share(bounds, work)`, which calls
    `work(bounds[i], bounds[i + 1])` for every block, on whichever of the executor's threads is free."""
    previous = getattr(_local, "share", None)
    _local.share = share
    try:
        yield
    finally:
        _local.share = previous


def _local_share(size: int, work: Callable[[int, int], object], min_per_thread: int) -> bool:
    """Whether `work` over range(size) was done here, within the executor's `sharing`: in blocks its threads
    share, or in one piece when too small to cut."""
    share = getattr(_local, "share", None)
    if share is None:
        return False
    blocks = min(SHARED_BLOCKS_PER_THREAD * host_threads(), size // max(min_per_thread, 1))
    if blocks > 1:
        share([size * i // blocks for i in range(blocks + 1)], work)
    else:
        work(0, size)
    return True


def split_range(size: int, work: Callable[[int, int], object], min_per_thread: int = MIN_ELEMENTS_PER_THREAD) -> None:
    """Call `work(lo, hi)` over disjoint slices covering range(size), in parallel when `size` is at least
    `min_per_thread` per thread: in blocks the executor's threads share while it runs kernels side by side
    (`sharing`), else when no other kernel runs beside this one, on this thread and a pool's threads, which take
    the range's chunks (CHUNKS_PER_THREAD a thread, fixed by `size` alone) one at a time as they come free."""
    if _local_share(size, work, min_per_thread):
        return
    parts = min(host_threads(), size // min_per_thread)
    if parts > 1 and _beside:
        parts = 1
    if parts <= 1:
        work(0, size)
        return
    chunks = _Chunks(size, min(CHUNKS_PER_THREAD * parts, size))
    mode = denormals.mxcsr()

    def task() -> None:
        with denormals.as_in(mode):  # flushing denormals or not, as the kernel's own thread
            chunks.run(work)
    helpers = _Helper.take(parts - 1)
    try:
        for helper in helpers:
            helper.start(task)
        chunks.run(work)
    finally:
        _Helper.give_back(helpers)


class _Chunks:
    """range(size) in `count` chunks of fixed bounds, handed out in order to the threads that `run` them; after an
    error in one, no more are handed out."""

    def __init__(self, size: int, count: int) -> None:
        self._bounds = [size * i // count for i in range(count + 1)]
        self._next = 0
        self._lock = threading.Lock()

    def run(self, work: Callable[[int, int], object]) -> None:
        """`work` over chunks not yet taken, until none is left."""
        last = len(self._bounds) - 1
        while True:
            with self._lock:
                i, self._next = self._next, self._next + 1
            if i >= last:
                return
            try:
                work(self._bounds[i], self._bounds[i + 1])
            except BaseException:
                with self._lock:
                    self._next = last  # the others stop after their chunk: the error ends the split
                raise


class _Helper:
    """A pool thread for split_range's chunks: `start` hands it a task (taking chunks until none is left),
    `give_back` waits for its end and raises its error. Two plain locks pass the task and its end: a
    ThreadPoolExecutor's Future and Condition cost more Python per hand-off, which runs cold between a step's big
    kernels (the zoo CNN's step about 1-2% faster with this, the geometry cache in kernels/pool.py and
    empty_aligned's address read). A forked child has none of its parent's helpers (`forget`) and makes its own."""

    _free: list[_Helper] = []
    _count = 0
    _lock = threading.Lock()

    def __init__(self, name: str) -> None:
        self._go, self._done = threading.Lock(), threading.Lock()
        self._go.acquire()
        self._done.acquire()
        self._task: Callable[[], object] | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    @classmethod
    def take(cls, count: int) -> list[_Helper]:
        """Up to `count` idle helpers: made on first need, up to one fewer than the host's cores (a caller on
        another thread may hold some)."""
        with cls._lock:
            while len(cls._free) < count and cls._count < host_threads() - 1:
                cls._count += 1
                cls._free.append(cls(f"wse-host-{cls._count}"))
            taken, cls._free[:] = cls._free[:count], cls._free[count:]
        return taken

    @classmethod
    def give_back(cls, helpers: list[_Helper]) -> None:
        """Wait for each helper's task, then return it to the idle ones; raise the first task's error."""
        errors = [helper._wait() for helper in helpers]
        with cls._lock:
            cls._free.extend(helpers)
        for error in errors:
            if error is not None:
                raise error

    def start(self, task: Callable[[], object]) -> None:
        self._task = task
        self._go.release()

    def _wait(self) -> BaseException | None:
        if self._task is None:
            return None
        self._done.acquire()
        self._task, error, self._error = None, self._error, None
        return error

    @classmethod
    def forget(cls) -> None:
        """In a forked child: the parent's helper threads do not exist here."""
        cls._free, cls._count, cls._lock = [], 0, threading.Lock()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            assert self._task is not None
            try:
                self._task()
            except BaseException as error:  # noqa: BLE001 - raised on the caller's thread (give_back)
                self._error = error
            self._done.release()


def split_blocks(bounds: Sequence[int], work: Callable[[int, int], object]) -> None:
    """Call `work(bounds[i], bounds[i + 1])` for every block: shared by the executor's threads within
    `sharing`; else a contiguous run of blocks per core on the pool, or all on this thread while another
    kernel runs beside it. For work whose bits depend on where its range is cut (sgemm on a block of rows sums
    in another order than on the whole matrix with some of OpenBLAS's kernels: Haswell's on an AVX-512 CPU),
    the caller fixes `bounds`: the same blocks, and bits, however the threads run them."""
    blocks = len(bounds) - 1
    share = getattr(_local, "share", None)
    if share is not None and blocks > 1:
        share(bounds, work)
        return
    parts = 1 if _beside else min(host_threads(), blocks)

    def run(first: int, last: int) -> None:  # the blocks of parts first..last-1
        for i in range(blocks * first // parts, blocks * last // parts):
            work(bounds[i], bounds[i + 1])
    if parts <= 1:
        run(0, 1)
        return
    split_range(parts, run, 1)


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


def _fill(out: np.ndarray) -> None:  # pragma: no cover - compiled by numba (parallel) in _probe_loop_threads
    for i in _numba.prange(out.size):
        out[i] = i


def short_openmp_spin() -> None:
    """Have GNU OpenMP's idle threads spin for 10,000 rounds (GOMP_SPINCOUNT) before they
    sleep, instead of its default 300,000, unless the environment sets OMP_WAIT_POLICY or
    GOMP_SPINCOUNT. OpenMP reads them when it is loaded, so this runs before numba first starts its threads.
    With the default, numba's worker spins on a core long after each parallel loop, taking it from the thread
    a split matmul or pooling kernel runs its other half on: the zoo transformer's step on one executor thread
    took 216 ms, 131 ms with 10,000 (135 ms with OMP_WAIT_POLICY=PASSIVE, whose every hand-off wakes a
    sleeping thread: a split 128K-element loop 182 µs against 89); on two threads 118 and 119 ms, within the
    noise (measured in processes taking turns)."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", "10000")


def _probe_loop_threads() -> bool:
    """Whether numba runs parallel loops here on a thread-safe layer (OpenMP or TBB: the executor's threads may
    launch loops at once; numba's fallback "workqueue" layer aborts on that). Its OpenMP threads spin only
    briefly when idle (short_openmp_spin)."""
    if _numba is None:  # pragma: no cover - numba is a dependency
        return False
    short_openmp_spin()
    try:
        _numba.njit(parallel=True, nogil=True, cache=True)(_fill)(np.empty(2))
        return bool(_numba.threading_layer() in ("omp", "tbb"))
    except Exception:  # noqa: BLE001 - any failure to launch: loops stay on the calling thread
        return False


_loops_held = 0  # blocks within one_loop_thread


@contextlib.contextmanager
def one_loop_thread() -> Iterator[None]:
    """Compiled loops stay on the calling thread within the block (loop_parts gives 1). For steps whose dense
    kernels are TensorFlow's: its pool's threads spin on the cores after each op, and a loop's part on one of
    numba's threads then waits for a core (the zoo CNN: a 256K-element chain 0.2 ms, or 2 ms in some processes,
    whose steps took 28 ms instead of 24)."""
    global _loops_held
    with _loop_threads_lock:
        _loops_held += 1
    try:
        yield
    finally:
        with _loop_threads_lock:
            _loops_held -= 1


def loop_parts(size: int, min_per_thread: int = LOOP_MIN_ELEMENTS_PER_THREAD) -> int:
    """Into how many parts a compiled loop over range(size) is split on numba's threads: one per core, each
    at least `min_per_thread` long; 1 while another kernel runs beside this one, within one_loop_thread, where
    numba's threading layer is not thread-safe, or in a child forked after its threads started."""
    global _loop_threads
    parts = min(host_threads(), size // max(min_per_thread, 1))
    if parts <= 1 or _beside or _loops_held or _loop_threads is False:
        return 1
    if _loop_threads is None:
        with _loop_threads_lock:
            if _loop_threads is None:
                _loop_threads = _probe_loop_threads()
        if not _loop_threads:
            return 1
    return parts


def run_loop(loop: Callable[..., None], parallel_loop: Callable[..., None], arrays: Sequence[Any], size: int,
             min_per_thread: int = LOOP_MIN_ELEMENTS_PER_THREAD) -> None:
    """`loop(*arrays, 0, size)`, a numba loop over range(size) that writes each index's own outputs, or, when
    loop_parts says so, `parallel_loop(state, parts, 0, size, *arrays)`: a numba function (parallel=True) that
    runs the loop over `parts` disjoint slices of the range on numba's threads, each thread flushing denormals
    as `state` (the calling thread's denormals.mxcsr(), 0 for none) says (denormals.enter_in_loop); beside
    another kernel, within the executor's `sharing`, `loop(*arrays, lo, hi)` over blocks its threads share. The
    same bits every way."""
    parts = loop_parts(size, min_per_thread)
    if parts > 1:
        # this thread's team: no more of numba's threads than parts (the others would only spin)
        _numba.set_num_threads(min(parts, _numba.config.NUMBA_NUM_THREADS))
        parallel_loop(denormals.mxcsr() or 0, parts, 0, size, *arrays)
    elif not (_beside and _local_share(size, lambda lo, hi: loop(*arrays, lo, hi), min_per_thread)):
        loop(*arrays, 0, size)


def _forget_loop_threads() -> None:
    """In a forked child: numba's OpenMP threads do not exist here, and GNU OpenMP cannot start new ones in a
    child of a process that used it (numba stops the process): loops stay on the calling thread."""
    global _loop_threads
    if _loop_threads:
        _loop_threads = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_loop_threads)
    os.register_at_fork(after_in_child=_Helper.forget)
    os.register_at_fork(after_in_child=_forget_host_threads)
