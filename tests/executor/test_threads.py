"""Host threads split big elementwise work into disjoint slices covering the whole range."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from cerebras_tf.wse import threads


@pytest.mark.parametrize("size", [0, 5, threads.MIN_ELEMENTS_PER_THREAD * 2 + 3, 1_000_003])
def test_split_range_covers_every_index_once(size, monkeypatch):
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
    expected_parts = max(1, min(3, size // threads.MIN_ELEMENTS_PER_THREAD))
    assert len(covered) == expected_parts
    assert (len(names) > 1) == (expected_parts > 1)  # the caller works too, the pool takes the rest


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
