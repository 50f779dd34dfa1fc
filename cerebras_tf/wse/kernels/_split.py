"""Split a kernel's numba loop over whole units (images, row blocks) across the host's threads.

`threads.split_range` cuts a range of elements; a numba kernel here works on
whole units (an image of a pooling input, a block of batch-norm rows), so the
element bounds are rounded to unit bounds: every unit is done once, by one
thread, whatever the number of threads (results never depend on the split).
"""
from __future__ import annotations

from typing import Callable

from cerebras_tf.wse import threads


def split_units(units: int, unit_elements: int, work: Callable[[int, int], None],
                min_per_thread: int = threads.MIN_ELEMENTS_PER_THREAD) -> None:
    """Call `work(lo, hi)` over disjoint ranges covering range(units), in parallel when
    units * unit_elements (the elements the work touches) is at least `min_per_thread` per thread."""
    size = max(unit_elements, 1)

    def run(lo: int, hi: int) -> None:
        a, b = (lo + size // 2) // size, (hi + size // 2) // size
        if a < b:
            work(a, b)
    threads.split_range(units * size, run, min_per_thread)
