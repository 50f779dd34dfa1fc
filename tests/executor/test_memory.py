"""empty_aligned: the arrays the executor hands TensorFlow's kernels start on a 64-byte boundary."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from cerebras_tf.wse.kernels.half import round_half
from cerebras_tf.wse.memory import ALIGNMENT, POOLED_BYTES, BufferPool, empty_aligned, pooled
from cerebras_tf.wse.threads import map_elementwise


@pytest.mark.parametrize("shape,dtype", [((3,), np.float32), ((64, 32, 32, 3), np.float32), (7, np.int64),
                                         ((5, 1), np.float64), ((2, 3), np.bool_)])
def test_empty_aligned_is_a_writable_c_array_on_a_64_byte_boundary(shape, dtype):
    a = empty_aligned(shape, dtype)
    assert a.ctypes.data % ALIGNMENT == 0
    assert a.shape == ((shape,) if isinstance(shape, int) else shape) and a.dtype == dtype
    assert a.flags.c_contiguous and a.flags.writeable
    a[...] = 1
    assert (a == 1).all()


def test_the_rounded_and_elementwise_results_are_aligned():
    x = np.arange(1, 100_001, dtype=np.float32)[1:]  # a view 4 bytes off its buffer's start
    assert round_half(x, "float16").ctypes.data % ALIGNMENT == 0
    assert map_elementwise(lambda a, out: np.negative(a, out=out), x).ctypes.data % ALIGNMENT == 0


BIG = (POOLED_BYTES // 4,)  # float32 elements: a pooled array


def test_a_pooled_buffer_is_handed_out_again_only_when_nothing_refers_to_it():
    pool = BufferPool()
    with pooled(pool):
        first = empty_aligned(BIG)
        address = first.ctypes.data
        assert address % ALIGNMENT == 0
        rows = first.reshape(4, -1)[1:]  # a view keeps the buffer
        del first
        assert empty_aligned(BIG).ctypes.data != address
        del rows
        again = empty_aligned(BIG)
        assert again.ctypes.data == address
        assert empty_aligned((POOLED_BYTES // 4 + 16,)).ctypes.data != address  # sizes are matched exactly
        small = empty_aligned(1024)
    buffers = pool.nbytes
    assert buffers == 2 * (POOLED_BYTES + ALIGNMENT) + POOLED_BYTES + 64 + ALIGNMENT  # the small one is malloc's
    del again, small
    assert empty_aligned(BIG).ctypes.data != address  # outside `pooled`: malloc's, the pool still holds the buffer
    assert pool.nbytes == buffers
    pool.clear()
    assert pool.nbytes == 0


def test_a_buffer_one_thread_let_go_of_serves_the_next_array_on_another():
    """What the pool is for: a step's threads share one set of buffers (malloc would keep a heap per thread)."""
    pool = BufferPool()
    made: list[int] = []

    def make_and_drop() -> None:
        made.append(empty_aligned(BIG).ctypes.data)

    with pooled(pool):
        worker = threading.Thread(target=make_and_drop)
        worker.start()
        worker.join()
        assert empty_aligned(BIG).ctypes.data == made[0]
    assert pool.nbytes == POOLED_BYTES + ALIGNMENT


def test_steps_that_overlap_leave_no_pool_in_use_whichever_ends_first():
    """Two executors stepping at once on two threads: the first to start may end first."""
    first, second = BufferPool(), BufferPool()
    first_step, second_step = pooled(first), pooled(second)
    first_step.__enter__()
    second_step.__enter__()
    made = [empty_aligned(BIG)]
    first_step.__exit__(None, None, None)
    made.append(empty_aligned(BIG))
    second_step.__exit__(None, None, None)
    assert (first.nbytes, second.nbytes) == (0, 2 * (POOLED_BYTES + ALIGNMENT))  # the later one's while both ran
    empty_aligned(BIG)
    assert (first.nbytes, second.nbytes) == (0, 2 * (POOLED_BYTES + ALIGNMENT))  # and none after


_FAULTS_SCRIPT = """
import resource, sys
import numpy as np
from cerebras_tf.wse.memory import keep_freed_memory

def step():
    arrays = [np.ones(1 << 20, np.float32) for _ in range(16)]
    del arrays

applies = keep_freed_memory() if sys.argv[1] == "kept" else False
for _ in range(3):  # the heap grows to hold them once
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(applies, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc's malloc")
def test_a_steps_freed_memory_is_reused_instead_of_faulted_in_again():
    """In a fresh process, as a training run starts: after keep_freed_memory (the Executor calls it), 16 arrays
    of 4 MiB made and freed together, 20 times over as a step's are, fault in almost no page again; without
    it glibc hands the 64 MiB back to the OS after each round and faults them in again (163,520 measured)."""
    import subprocess
    import sys

    runs = {}
    for mode in ("kept", "default"):
        out = subprocess.run([sys.executable, "-c", _FAULTS_SCRIPT, mode], capture_output=True, text=True, check=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        applies, faults = out.stdout.split()
        runs[mode] = (applies == "True", int(faults))
    assert runs["kept"][0]
    assert runs["default"][1] > 16 * 1024, runs  # the control: glibc's default faults the pages in every round
    assert runs["kept"][1] < 1024, runs
