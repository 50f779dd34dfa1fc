"""Host threads split big elementwise work into disjoint slices covering the whole range."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from cerebras_tf.wse import threads


def _chunks(size: int, count: int) -> list[tuple[int, int]]:
    """split_range's fixed chunk bounds: range(size) in `count` chunks."""
    return [(size * i // count, size * (i + 1) // count) for i in range(count)]


@pytest.mark.parametrize("size", [0, 5, threads.MIN_ELEMENTS_PER_THREAD * 2 + 3, 1_000_003])
def test_split_range_covers_every_index_once(size, monkeypatch):
    """In chunks of fixed bounds (CHUNKS_PER_THREAD a thread where it splits), each done once; the caller
    takes chunks too."""
    monkeypatch.setattr(threads, "host_threads", lambda: 3)
    seen, names, lock = [], set(), threading.Lock()

    def work(lo, hi):
        with lock:
            seen.append((lo, hi))
            names.add(threading.current_thread().name)

    threads.split_range(size, work)
    covered = sorted(seen)
    assert covered[0][0] == 0 and covered[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
    parts = max(1, min(3, size // threads.MIN_ELEMENTS_PER_THREAD))
    chunks = 1 if parts == 1 else threads.CHUNKS_PER_THREAD * parts
    assert covered == _chunks(size, chunks)
    assert threading.current_thread().name in names


def test_a_helper_that_wakes_late_takes_what_is_left_and_the_caller_the_rest(monkeypatch):
    """The threads take chunks as they come free: while the helper has not started, the caller goes on with the
    next chunks instead of waiting for a fixed share; once it has, the helper takes chunks too."""
    monkeypatch.setattr(threads, "host_threads", lambda: 2)
    helper_started = threading.Event()
    by_thread: dict[str, list[int]] = {}
    lock = threading.Lock()

    def work(lo, hi):
        me = threading.current_thread()
        if me is not threading.main_thread():
            helper_started.set()
        with lock:
            by_thread.setdefault(me.name, []).append(lo)
        if me is threading.main_thread() and len(by_thread[me.name]) == 2:
            assert helper_started.wait(10)  # the helper is awake now: it takes chunks while the caller waits
        time.sleep(0.01)

    threads.split_range(800, work, 100)
    starts = sorted(lo for los in by_thread.values() for lo in los)
    assert starts == [lo for lo, _ in _chunks(800, threads.CHUNKS_PER_THREAD * 2)]
    assert len(by_thread) == 2 and all(by_thread.values())


@pytest.mark.parametrize("size", [0, 7, threads.MIN_ELEMENTS_PER_THREAD * 3 + 1])
def test_map_elementwise_fills_a_new_array_slice_by_slice(size, monkeypatch):
    monkeypatch.setattr(threads, "host_threads", lambda: 3)
    a = np.arange(size, dtype=np.float32).reshape(-1, 1)
    b = np.full(a.shape, 2, np.float32)
    out = threads.map_elementwise(lambda x, y, out: np.multiply(x, y, out=out), a, b, dtype=np.float64)
    assert out.shape == a.shape and out.dtype == np.float64
    np.testing.assert_array_equal(out, a * 2)


def test_loop_parts_one_per_core_each_long_enough_and_one_beside_another_kernel(monkeypatch):
    monkeypatch.setattr(threads, "host_threads", lambda: 2)
    monkeypatch.setattr(threads, "_loop_threads", True)
    per = threads.LOOP_MIN_ELEMENTS_PER_THREAD
    assert threads.loop_parts(per * 2 - 1) == 1
    assert threads.loop_parts(per * 2) == 2 and threads.loop_parts(per * 50) == 2
    assert threads.loop_parts(10, min_per_thread=5) == 2
    threads.kernels_beside(1)
    try:
        assert threads.loop_parts(per * 50) == 1
    finally:
        threads.kernels_beside(0)
    with threads.one_loop_thread():  # TensorFlow's pool spins beside the step
        with threads.one_loop_thread():
            assert threads.loop_parts(per * 50) == 1
        assert threads.loop_parts(per * 50) == 1
    assert threads.loop_parts(per * 50) == 2
    monkeypatch.setattr(threads, "_loop_threads", False)  # no thread-safe layer, or a forked child
    assert threads.loop_parts(per * 50) == 1


def test_a_child_forked_after_numbas_threads_ran_keeps_its_loops_on_one_thread(monkeypatch):
    """GNU OpenMP cannot start threads in a child of a process that used them (numba would stop it)."""
    import multiprocessing

    monkeypatch.setattr(threads, "host_threads", lambda: 2)
    if threads.loop_parts(1 << 22) < 2:
        pytest.skip("numba has no thread-safe threading layer here")
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply_async(threads.loop_parts, (1 << 22,)).get(timeout=60) == 1


def test_openmps_spin_is_shortened_unless_the_environment_chose(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    threads.short_openmp_spin()
    assert os.environ["GOMP_SPINCOUNT"] == "10000"
    monkeypatch.setenv("GOMP_SPINCOUNT", "500")
    threads.short_openmp_spin()
    assert os.environ["GOMP_SPINCOUNT"] == "500"
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    threads.short_openmp_spin()
    assert "GOMP_SPINCOUNT" not in os.environ


_IDLE_SPIN_SCRIPT = """
import os, threading, time
import numpy as np
import numba
from cerebras_tf.wse import threads

assert threads._probe_loop_threads()  # as loop_parts does on first use: numba's OpenMP threads start here

@numba.njit(parallel=True)
def fill(a):
    for i in numba.prange(a.size):
        a[i] = i

def other_threads_ticks():
    me, total = threading.get_native_id(), 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != me:
            fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total

a = np.empty(1 << 20)
for _ in range(3):
    fill(a)
before = other_threads_ticks()
for _ in range(20):  # a loop, then 10 ms without one, as between a step's parallel loops
    fill(a)
    time.sleep(0.01)
print((other_threads_ticks() - before) / os.sysconf("SC_CLK_TCK"))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="per-thread CPU times from /proc")
def test_numbas_idle_openmp_threads_do_not_spin_on_a_core_between_loops():
    """In a fresh process: after each of 20 parallel loops the calling thread sleeps 10 ms; numba's OpenMP
    worker then takes almost no CPU (measured 0-0.01 s of the 0.2 s), where with GNU OpenMP's default spin
    (GOMP_SPINCOUNT=300000, set here as the control on x86) it spins through most of it (0.15-0.16 s)."""
    import platform
    import subprocess
    import sys

    def worker_seconds(**env: str) -> float:
        environ = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        out = subprocess.run([sys.executable, "-c", _IDLE_SPIN_SCRIPT], capture_output=True, text=True,
                             check=True, env={**environ, **env}, timeout=300)
        return float(out.stdout.strip().splitlines()[-1])
    if threads.loop_parts(1 << 22) < 2:
        pytest.skip("numba has no thread-safe threading layer here, or one core")
    assert worker_seconds() <= 0.05
    if platform.machine() in ("x86_64", "AMD64"):  # (where a spin round is a `pause`: tens of cycles)
        assert worker_seconds(GOMP_SPINCOUNT="300000") >= 0.08  # the control: the measure sees a spinning worker


def test_a_loop_beside_another_kernel_goes_to_the_executors_shared_blocks(monkeypatch):
    """Within the executor's sharing: split_range always hands over its blocks (2 per core); run_loop only
    beside another kernel (alone, numba's threads take its parts), as `loop(*arrays, lo, hi)` per block."""
    monkeypatch.setattr(threads, "host_threads", lambda: 2)
    monkeypatch.setattr(threads, "_loop_threads", False)  # alone: the loop on this thread, not numba's
    shared: list[list[int]] = []
    calls: list[tuple[int, int]] = []

    def share(bounds, work):
        shared.append(list(bounds))
        for lo, hi in zip(bounds, bounds[1:]):
            work(lo, hi)

    def loop(out, lo, hi):
        calls.append((lo, hi))
        out[lo:hi] = np.arange(lo, hi)

    out = np.zeros(1000)
    with threads.sharing(share):
        threads.run_loop(loop, None, [out], out.size, min_per_thread=100)
        assert shared == [] and calls == [(0, 1000)]
        threads.kernels_beside(1)
        try:
            threads.run_loop(loop, None, [out], out.size, min_per_thread=100)
            threads.run_loop(loop, None, [out], 150, min_per_thread=100)  # too small to cut: whole
        finally:
            threads.kernels_beside(0)
        threads.split_range(1000, lambda lo, hi: calls.append((lo, hi)), 400)
    assert shared == [[0, 250, 500, 750, 1000], [0, 500, 1000]]
    assert calls == [(0, 1000), (0, 250), (250, 500), (500, 750), (750, 1000), (0, 150), (0, 500), (500, 1000)]
    np.testing.assert_array_equal(out, np.arange(1000))
    threads.split_range(1000, lambda lo, hi: calls.append((lo, hi)), 400)  # outside: the pool's split
    assert shared == [[0, 250, 500, 750, 1000], [0, 500, 1000]]


def test_a_chunks_error_is_raised_after_every_started_chunk_finished(monkeypatch):
    """split_range on helper threads: an error in a helper's chunk reaches the caller once every chunk that
    started has finished (none still runs on the caller's arrays), no chunk starts after it, and the helpers
    take the next split as before."""
    monkeypatch.setattr(threads, "host_threads", lambda: 3)
    started, finished, lock = [], [], threading.Lock()
    first_error = threading.Event()

    def work(lo, hi):
        on_helper = threading.current_thread() is not threading.main_thread()
        with lock:
            started.append(lo)
        if on_helper:
            time.sleep(0.05)  # still running when the caller's chunks are done
        elif len(started) > 1:
            first_error.wait(1)  # the caller's later chunks wait for a helper's error
        with lock:
            finished.append(lo)
        if on_helper:
            first_error.set()
            raise ValueError(f"chunk {lo}")

    with pytest.raises(ValueError, match="chunk"):
        threads.split_range(300, work, 100)
    assert sorted(started) == sorted(finished)  # raised once every started chunk had run
    assert len(started) < threads.CHUNKS_PER_THREAD * 3  # none started after the errors
    seen = []
    threads.split_range(300, lambda lo, hi: seen.append((lo, hi)), 100)
    assert sorted(seen) == _chunks(300, threads.CHUNKS_PER_THREAD * 3)


def test_splits_from_two_threads_at_once_each_cover_their_range(monkeypatch):
    """Two callers splitting at the same time share the helpers: a caller that finds none free does the
    slices itself. Every index of both ranges is done once, and no more helpers are made than cores less one."""
    monkeypatch.setattr(threads, "host_threads", lambda: 2)
    counts = [np.zeros(4000, np.int64) for _ in range(2)]
    start = threading.Barrier(2)

    def caller(k):
        start.wait()
        for _ in range(50):
            threads.split_range(4000, lambda lo, hi: counts[k].__setitem__(slice(lo, hi), counts[k][lo:hi] + 1), 1000)
    callers = [threading.Thread(target=caller, args=(k,)) for k in range(2)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert all((c == 50).all() for c in counts)
    helpers = [t for t in threading.enumerate() if t.name.startswith("wse-host-")]
    assert 1 <= len(helpers) <= 2  # made for up to 3 cores by the other tests of this module, at most


def _split_in_child(size: int) -> list[tuple[int, int]]:
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def work(lo, hi):
        with lock:
            seen.append((lo, hi))
    threads.split_range(size, work, size // 2)
    return sorted(seen)


def test_a_child_forked_after_splits_ran_splits_on_helpers_of_its_own(monkeypatch):
    """The parent's helper threads do not exist in a forked child: its first split makes its own instead of
    waiting forever on a parent's."""
    import multiprocessing

    monkeypatch.setattr(threads, "host_threads", lambda: 2)
    chunks = _chunks(1000, threads.CHUNKS_PER_THREAD * 2)
    assert _split_in_child(1000) == chunks  # the parent's helper now exists
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply_async(_split_in_child, (1000,)).get(timeout=60) == chunks


def _host_threads_in_child() -> int:
    return threads.host_threads()


def test_the_core_count_is_read_once_per_process_and_again_in_a_forked_child(monkeypatch):
    import multiprocessing
    import os

    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(threads, "_host_threads", None)
    assert threads.host_threads() == cores
    monkeypatch.setattr(threads, "_host_threads", cores + 5)  # as kept from an earlier read
    assert threads.host_threads() == cores + 5
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply_async(_host_threads_in_child).get(timeout=60) == cores
