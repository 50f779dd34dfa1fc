"""Timing helpers the micro-benchmarks share (TF-free: importing it starts no TensorFlow threads)."""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """The median wall time of `repeats` calls of fn, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))
