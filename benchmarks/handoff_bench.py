"""What handing work to another thread costs on this machine, and the size of work that pays for it.

The simulator splits big kernels across the host's cores (wse/threads.py) and runs independent kernels side
by side (wse/dataflow.py); each hand-off wakes a thread. Where the guest halts an idle vCPU at once
(haltpoll's guest_halt_poll_ns = 0), waking it costs tens of microseconds, and a split only pays for
itself on large arrays. This prints the round trip of a thread wake-up, with the other core idle and with
it kept busy by a spinning process, and a memory-bound elementwise kernel (add) on one thread against
split over the host's threads, by size; ratios are one thread / split (> 1: splitting is faster).

    ./dev bench handoff_bench [--repeats 200]
"""
from __future__ import annotations

import argparse
import multiprocessing
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from benchmarks.timing import median_seconds
from cerebras_tf.wse import memory, threads

HALT_POLL = "/sys/module/haltpoll/parameters/guest_halt_poll_ns"


def _median_us(fn: Callable[[], Any], repeats: int) -> float:
    return median_seconds(fn, repeats) * 1e6


def _event_round_trip(repeats: int) -> float:
    """Median µs for one thread to wake another and be woken back (threading.Event both ways)."""
    ping, pong = threading.Event(), threading.Event()

    def other() -> None:
        for _ in range(repeats + 1):
            ping.wait()
            ping.clear()
            pong.set()
    thread = threading.Thread(target=other)
    thread.start()

    def once() -> None:
        ping.set()
        pong.wait()
        pong.clear()
    try:
        return _median_us(once, repeats)
    finally:
        thread.join()


def _add(size: int, min_per_thread: int) -> Callable[[], Any]:
    """An add of two float32 arrays of `size` elements, split as threads.map_elementwise does with
    `min_per_thread` (size: one thread; 1: every core)."""
    a = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    b = a[::-1].copy()
    return lambda: threads.map_elementwise(np.add, a, b, min_per_thread=min_per_thread)


def _spin(stop: Any) -> None:
    while not stop.is_set():
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    memory.keep_freed_memory()
    try:
        with open(HALT_POLL) as f:
            halt_poll = f"{f.read().strip()} ns"
    except OSError:
        halt_poll = "(not readable)"
    print(f"{threads.host_threads()} cores; guest_halt_poll_ns: {halt_poll}")

    pool = ThreadPoolExecutor(max_workers=1)
    print(f"{'hand-off':<52}{'median µs':>10}")
    print(f"{'threading.Event round trip, other core idle':<52}{_event_round_trip(args.repeats):>10.1f}")
    print(f"{'ThreadPoolExecutor submit + result, other core idle':<52}"
          f"{_median_us(lambda: pool.submit(int).result(), args.repeats):>10.1f}")
    stop = multiprocessing.Event()
    spinner = multiprocessing.Process(target=_spin, args=(stop,), daemon=True)
    spinner.start()
    try:
        time.sleep(0.2)
        print(f"{'threading.Event round trip, a process spinning':<52}{_event_round_trip(args.repeats):>10.1f}")
    finally:
        stop.set()
        spinner.join()

    print(f"\n{'elements':>10}{'one thread µs':>15}{'split µs':>11}{'ratio':>8}")
    for size in (1 << 17, 1 << 18, 1 << 19, 1 << 20, 1 << 21, 1 << 22):
        whole, split = (_median_us(_add(size, min_per_thread), args.repeats // 4) for min_per_thread in (size, 1))
        print(f"{size:>10}{whole:>15.1f}{split:>11.1f}{whole / split:>8.2f}")


if __name__ == "__main__":
    main()
