"""Running one phase's kernels as their inputs become ready: on the executor's thread and on helper threads.

TensorFlow's executor runs independent ops at once; so does this one, as the
wafer runs every layer at once. `Schedule.build` turns a phase's units (a
kernel, or kernels the executor fused into one) into a dependency graph, once,
at plan time:

- data: a unit waits for the units that produce the tensors it reads;
- variables: a unit that writes a variable waits for every earlier unit that
  reads or writes it (a unit that reads a view of a variable's array, which a
  shared read_variable hands out, counts as reading the variable), and a unit
  that reads one waits for its last earlier writer: every variable sees its
  reads and writes in program order;
- errors: a unit that writes variables waits for every earlier unit that may
  refuse its input (vocabulary.CHECKS_INPUT), so a refused batch leaves the
  variables as the kernels before the refusing one left them, as running one
  kernel at a time does.

`run` has the caller's thread and helper threads each take the ready unit
with the longest estimated path to the end of the phase (its critical path:
the sum of the `cost` estimates along its longest chain of dependents), the
first in program order among equals, run it, and settle it under one lock.
Without costs that is program order (memory stays near that of running one at
a time); with them, work on the critical path starts first, and what is off
it (the transformer's weight gradients) fills the other core. Each unit
computes what it would one at a time: results are bit-identical whatever the
schedule, and the same from run to run. A tensor is dropped when every unit of the phase that
reads it has finished (its last use is in this phase and it is not kept).
OpenBLAS runs on one thread while the executor runs on several
(threads.one_blas_thread: its idle threads would otherwise spin on the cores
the executor's threads need). A kernel that splits its work (threads.split_range:
big matmuls, pooling, batch norm; a compiled chain's loop started beside another
kernel) cuts it into blocks that the run's threads share: its own thread takes
them one by one, and a thread that comes free takes one too when the kernel's
rank is at least that of every ready unit. A block is the same work whichever
thread does it, so the bits stay those of one kernel at a time; and no third
thread competes for the two cores, as a split on a pool's thread did beside
kernels started after it. The zoo transformer's median times over a traced step
(a pool's split, then shared blocks): layer 1's query matmul 3.3 ms (its split
beside the key and value matmuls), then 0.9-1.0; layer 0's attention output
matmul 2.2 ms (unsplit, started beside a short unit), then 1.3-1.6. Its steps,
alternating in one process, took 0.94-1.0x the time (median 0.98x over five
runs). A unit that
raises stops the start of every later unit; the units before it finish, and
the error of the first in program order is raised.
A view (a reshape, squeeze or expand_dims, an uncopied transpose, float32's
to_half: `Access.inline`) takes microseconds: the thread that settles the last
unit it waits for runs it there and then, under the lock, instead of putting it
through the ready heap where another thread may wake for it (the zoo
transformer's step holds 98 such units of 400 in float32; alternating in one
process, its steps took 0.98-0.99x the time over three runs).
"""
from __future__ import annotations

import dataclasses
import heapq
import math
import os
import queue
import threading
from typing import Any, Callable, Collection, Sequence

import numpy as np

from cerebras_tf.wse import denormals, threads

ENV_VAR = "CEREBRAS_TF_EXECUTOR_THREADS"


def thread_choices() -> tuple[int, ...]:
    """The thread counts the executor may run kernels on: CEREBRAS_TF_EXECUTOR_THREADS's alone when it is set
    (1: one kernel at a time, in program order), else one and every core this process may use, between which
    a ThreadChoice picks."""
    value = os.environ.get(ENV_VAR, "").strip()
    if value:
        try:
            count = int(value)
        except ValueError:
            raise ValueError(f"{ENV_VAR}={value!r} is not a whole number of threads (e.g. 1 runs one kernel at "
                             "a time)") from None
        if count < 1:
            raise ValueError(f"{ENV_VAR}={value!r}: the executor needs at least 1 thread")
        return (count,)
    return tuple(sorted({1, threads.host_threads()}))


class ThreadChoice:
    """Which thread count runs a program's steps fastest, measured on its first steps and then kept.

    Side by side is not always faster: OpenBLAS then runs on one thread, and a model whose step is a chain of
    matmuls (the MLP) has little else to run beside them; one at a time, OpenBLAS uses every core. The
    results are the same bits either way, so only the time decides: after WARMUP steps (numba compiles,
    caches and malloc's heap fill: the zoo CNN's steps still shrink from 45 to 30 ms over its first six), the
    candidates take turns, one step each per round, for TRIALS rounds, and the one whose steps took the lowest
    median share of the first candidate's step in the same round is kept (the smaller count on a tie). A
    round's steps run within a few hundred milliseconds, so a slow spell of the machine slows both alike:
    comparing the two medians of nine steps instead, the zoo transformer kept one thread in 2 processes of 11,
    where two (splitting kernels into shared blocks) were 5-9% faster, its steps' quartiles 5% apart.
    Where TRIALS rounds leave it unclear (`_clear`: the best won too few rounds against the runner-up for a
    sign test), rounds go on, up to MAX_TRIALS, and the median shares of them all decide: the zoo transformer,
    two threads about 4.5% faster, kept one in 1 process of 6 after 12 rounds (its rounds' shares 0.87-1.11).
    The trial steps are training steps like any other (the same bits either way)."""

    WARMUP = 6
    TRIALS = 12
    MAX_TRIALS = 40

    def __init__(self, candidates: Sequence[int]) -> None:
        self.candidates = tuple(candidates)
        self.chosen: int | None = self.candidates[0] if len(self.candidates) == 1 else None
        self._times: dict[int, list[float]] = {count: [] for count in self.candidates}
        self._steps = 0

    def next(self) -> int:
        """The thread count for the next step."""
        if self.chosen is not None:
            return self.chosen
        if self._steps < self.WARMUP:
            return self.candidates[-1]
        return self.candidates[(self._steps - self.WARMUP) % len(self.candidates)]

    def record(self, count: int, seconds: float) -> None:
        """How long the step `next` gave `count` for took."""
        if self.chosen is not None:
            return
        if self._steps >= self.WARMUP:
            self._times[count].append(seconds)
        self._steps += 1
        counts = {len(times) for times in self._times.values()}
        rounds = counts.pop()
        if not counts and rounds >= self.TRIALS:  # at a round's end: every candidate has as many steps
            ranked = sorted(self.candidates, key=lambda c: (self._median_share(c), c))
            if rounds >= self.MAX_TRIALS or self._clear(ranked[0], ranked[1]):
                self.chosen = ranked[0]

    def _median_share(self, count: int) -> float:
        """The median over rounds of `count`'s step time as a share of the first candidate's in that round."""
        first = self._times[self.candidates[0]]
        shares = sorted(t / max(f, 1e-12) for t, f in zip(self._times[count], first))
        return shares[len(shares) // 2]

    def _clear(self, best: int, other: int) -> bool:
        """Whether `best` was faster than `other` in enough rounds that chance is unlikely to explain it: a sign
        test, two standard deviations (sqrt(n) / 2 each) over half of the n rounds."""
        n = len(self._times[best])
        wins = sum(b < o for b, o in zip(self._times[best], self._times[other]))
        return wins >= n / 2 + math.sqrt(n)


@dataclasses.dataclass(frozen=True)
class Access:
    """What one unit touches, for its place in the dependency graph."""

    reads: Sequence[int]  # tensor ids (each once)
    outputs: Sequence[int]
    reads_vars: Collection[str] = ()
    writes_vars: Collection[str] = ()
    checks_input: bool = False  # may raise KernelInputError
    cost: float = 0.0  # an estimate of its run time (any unit), for the order ready units start in
    inline: bool = False  # a view (a reshape, ...): run at once by the thread that settles its last dependency


@dataclasses.dataclass(frozen=True)
class Schedule:
    """One phase's dependency graph, over unit indices in program order."""

    waits: tuple[int, ...]  # how many units each waits for
    dependents: tuple[tuple[int, ...], ...]  # the units waiting for each
    releases: tuple[tuple[int, ...], ...]  # tensors whose reader count each unit lowers when it finishes
    readers: dict[int, int]  # tensor -> units of the phase that read it (dropped when all have finished)
    rank: tuple[float, ...] = ()  # per unit: its cost plus the largest rank among its dependents (critical path)
    inline: frozenset[int] = frozenset()  # units run inline (Access.inline)

    def drops_in_order(self) -> tuple[tuple[int, ...], ...]:
        """Per unit: the tensors to drop once it has finished, when the units run one at a time in program
        order (each after its last reader in the phase)."""
        left = dict(self.readers)
        drops = []
        for releases in self.releases:
            mine = []
            for t in releases:
                left[t] -= 1
                if left[t] == 0:
                    mine.append(t)
            drops.append(tuple(mine))
        return tuple(drops)

    @classmethod
    def build(cls, units: Sequence[Access], droppable: Collection[int]) -> "Schedule":
        """The graph of `units` (one phase, in program order); `droppable`: tensors whose last use is in
        this phase and which are not kept (dropped once their readers here have finished)."""
        producer: dict[int, int] = {}
        last_write: dict[str, int] = {}
        reads_since: dict[str, list[int]] = {}
        checkers: list[int] = []
        before: list[set[int]] = []
        for i, unit in enumerate(units):
            waits_for = {producer[t] for t in unit.reads if t in producer}
            for name in unit.reads_vars:
                if name in last_write:
                    waits_for.add(last_write[name])
                reads_since.setdefault(name, []).append(i)
            for name in unit.writes_vars:
                if name in last_write:
                    waits_for.add(last_write[name])
                waits_for.update(reads_since.pop(name, ()))
                last_write[name] = i
            if unit.writes_vars:
                waits_for.update(checkers)
            if unit.checks_input:
                checkers.append(i)
            waits_for.discard(i)
            before.append(waits_for)
            for t in unit.outputs:
                producer[t] = i
        dependents: list[list[int]] = [[] for _ in units]
        for i, waits_for in enumerate(before):
            for j in waits_for:
                dependents[j].append(i)
        readers: dict[int, int] = {}
        releases = []
        for unit in units:
            mine = tuple(t for t in unit.reads if t in droppable)
            for t in mine:
                readers[t] = readers.get(t, 0) + 1
            releases.append(mine)
        rank = [0.0] * len(units)
        for i in range(len(units) - 1, -1, -1):  # dependents come later in program order
            rank[i] = units[i].cost + max((rank[j] for j in dependents[i]), default=0.0)
        return cls(waits=tuple(len(w) for w in before), dependents=tuple(tuple(d) for d in dependents),
                   releases=tuple(releases), readers=readers, rank=tuple(rank),
                   inline=frozenset(i for i, unit in enumerate(units) if unit.inline))


class _Failed:
    """A unit's exception, carried back from the thread that ran it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_helpers: list[threading.Thread] = []
_helpers_lock = threading.Lock()


def _helper_loop() -> None:
    while True:
        _jobs.get()()


def _forget_helpers() -> None:
    """In a forked child: the parent's helper threads do not exist here (new ones start on first use)."""
    global _jobs, _helpers_lock
    _jobs, _helpers_lock = queue.SimpleQueue(), threading.Lock()
    _helpers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_helpers)


def _ensure_helpers(count: int) -> None:
    with _helpers_lock:
        while len(_helpers) < count:
            thread = threading.Thread(target=_helper_loop, name=f"wse-kernels-{len(_helpers) + 1}", daemon=True)
            thread.start()
            _helpers.append(thread)


class _SharedWork:
    """A running kernel's range cut into blocks (threads.split_range) that the run's free threads take, one at
    a time, beside the kernel's own thread (which takes them too, and returns once every block is done)."""

    def __init__(self, bounds: Sequence[int], work: Callable[[int, int], object], rank: float) -> None:
        self.bounds, self.work, self.rank = bounds, work, rank
        self.taken = 0  # blocks handed out
        self.busy = 0  # blocks handed out and not finished
        self.error: BaseException | None = None

    @property
    def blocks(self) -> int:
        return len(self.bounds) - 1


class _Run:
    """One run of a schedule: the ready units and what is running, shared by the threads under one lock."""

    def __init__(self, schedule: Schedule, compute: Callable[[int], Any], complete: Callable[[int, Any], None],
                 drop: Callable[[int], None]) -> None:
        self.schedule, self.compute, self.complete, self.drop = schedule, compute, complete, drop
        self.waits = list(schedule.waits)
        self.left = dict(schedule.readers)
        self.rank = schedule.rank or (0.0,) * len(self.waits)
        self.ready = [(-self.rank[i], i) for i, count in enumerate(self.waits) if count == 0]  # a heap
        heapq.heapify(self.ready)
        self.lock = threading.Condition(threading.Lock())
        self.running = 0
        self.idle = 0  # threads waiting for a unit
        self.stop_at = len(self.waits)  # after an error: units from here on are not started
        self.errors: dict[int, BaseException] = {}
        self.shared: list[_SharedWork] = []  # running kernels' blocks not yet handed out
        self.broken: BaseException | None = None  # what stopped a thread outside any unit

    def work(self) -> None:
        """Take ready units, the highest rank first (then program order), and run them until none is left or
        can come; in between, blocks of a running kernel that shares them (`_share`) when its rank is at
        least that of every ready unit."""
        index, result, rank = -1, None, [0.0]
        job: _SharedWork | None = None
        block = 0
        with threads.sharing(lambda bounds, fn: self._share(bounds, fn, rank[0])):
            try:
                while True:
                    with self.lock:
                        if index >= 0:
                            done, index = index, -1
                            self.running -= 1
                            self._settle(done, result)
                        taken = self._take()
                        if taken is None:
                            return
                        if isinstance(taken, _SharedWork):
                            job, block = taken, self._hand_out(taken)
                        else:
                            index = taken
                            self.running += 1
                            threads.kernels_beside(self.running - 1)
                    if job is not None:
                        self._run_block(job, block)
                        job = None
                        continue
                    rank[0] = self.rank[index]
                    result = self._computed(index)
            except BaseException as error:  # e.g. KeyboardInterrupt, or a bug in complete/drop: start nothing more
                if index >= 0:  # raised by the unit this thread ran: it will not settle
                    with self.lock:
                        self.running -= 1
                self.broken = self.broken or error
                self.stop()
                raise

    def _take(self) -> int | _SharedWork | None:
        """The next unit to start, or a running kernel's blocks to help with (under the lock; waits while
        others run and neither is there), or None: nothing runs and nothing can become ready."""
        while True:
            job = max(self.shared, key=lambda j: j.rank) if self.shared else None
            while self.ready and (job is None or -self.ready[0][0] > job.rank):
                _, index = heapq.heappop(self.ready)
                if index < self.stop_at:
                    return index
            if job is not None:
                return job
            if not self.running:
                self.lock.notify_all()  # nothing runs, nothing can become ready: every thread is done
                return None
            self.idle += 1
            self.lock.wait()
            self.idle -= 1

    def _hand_out(self, job: _SharedWork) -> int:
        """The next block of `job` (under the lock); the job leaves the shared list with its last block."""
        block = job.taken
        job.taken += 1
        job.busy += 1
        if job.taken == job.blocks:
            self.shared.remove(job)
        return block

    def _run_block(self, job: _SharedWork, block: int) -> None:
        """Run one block of `job` (outside the lock); its error is the job's, raised by the kernel's thread."""
        try:
            job.work(job.bounds[block], job.bounds[block + 1])
        except BaseException as error:  # noqa: BLE001 - the kernel's own thread raises it (and an interrupt here)
            job.error = job.error or error
            if not isinstance(error, Exception):
                raise
        finally:
            with self.lock:
                job.busy -= 1
                if not job.busy and job.taken == job.blocks:
                    self.lock.notify_all()  # the kernel's thread may wait for this block

    def _share(self, bounds: Sequence[int], work: Callable[[int, int], object], rank: float) -> None:
        """threads.split_range on one of this run's threads (running a unit of rank `rank`): every block of
        `bounds` done by this thread and any that comes free; returns when all are done."""
        job = _SharedWork(bounds, work, rank)
        with self.lock:
            self.shared.append(job)
            if self.idle:
                self.lock.notify_all()
        try:
            while True:
                with self.lock:
                    if job.taken == job.blocks:
                        while job.busy:
                            self.lock.wait()
                        break
                    block = self._hand_out(job)
                self._run_block(job, block)
        except BaseException:  # an interrupt in this thread's block: hand out no more
            with self.lock:
                if job in self.shared:
                    self.shared.remove(job)
            raise
        if job.error is not None:
            raise job.error

    def _settle(self, index: int, result: Any) -> None:
        """Store a finished unit's result (under the lock), make its dependents ready, and run and settle here
        each inline one that became ready (a view: cheaper than a round through the ready heap and a thread)."""
        schedule = self.schedule
        settling = [(index, result)]
        while settling:
            index, result = settling.pop()
            if isinstance(result, _Failed):
                self.errors[index] = result.error
                self.stop_at = min(self.stop_at, index)
            else:
                self.complete(index, result)
                for later in schedule.dependents[index]:
                    self.waits[later] -= 1
                    if self.waits[later] == 0:
                        if later not in schedule.inline:
                            heapq.heappush(self.ready, (-self.rank[later], later))
                        elif later < self.stop_at:
                            settling.append((later, self._computed(later)))
            for t in schedule.releases[index]:
                self.left[t] -= 1
                if self.left[t] == 0:
                    self.drop(t)
        if self.idle and (self.ready or not self.running):
            self.lock.notify_all()

    def _computed(self, index: int) -> Any:
        """Unit `index`'s result, or its exception as a _Failed."""
        try:
            return self.compute(index)
        except Exception as error:  # noqa: BLE001 - raised by `run`, after the earlier units have finished
            return _Failed(error)

    def stop(self) -> None:
        """Start nothing more (the caller's thread is unwinding)."""
        with self.lock:
            self.stop_at = -1
            self.lock.notify_all()


def run(schedule: Schedule, compute: Callable[[int], Any], complete: Callable[[int, Any], None],
        drop: Callable[[int], None], threads_to_use: int = 1) -> None:
    """Run every unit of `schedule`: `compute(i)` on one of `threads_to_use` threads (this one and helpers;
    1: program order, one at a time), then, under the run's lock, `complete(i, result)` and `drop(t)` for
    each tensor no unit still needs. Raises the error of the first unit in program order that raised."""
    if threads_to_use <= 1:
        _run_in_order(schedule, compute, complete, drop)
        return
    state = _Run(schedule, compute, complete, drop)
    helpers = min(max(0, threads_to_use - 1), len(schedule.waits) - 1)
    finished: queue.SimpleQueue[None] = queue.SimpleQueue()
    if helpers > 0:
        _ensure_helpers(helpers)
        errstate = np.geterr()  # numpy's floating-point error handling is per thread: the caller's holds
        mode = denormals.mxcsr()  # and so is flushing denormals (the executor's step flushes them)

        def helper_work() -> None:
            try:
                with np.errstate(**errstate), denormals.as_in(mode):
                    state.work()
            except BaseException:  # noqa: BLE001 - kept in state.broken, raised on the caller's thread
                pass
            finally:
                finished.put(None)
        for _ in range(helpers):
            _jobs.put(helper_work)
    try:
        state.work()
    finally:
        for _ in range(max(helpers, 0)):
            finished.get()
        threads.kernels_beside(0)
    if state.broken is not None:
        raise state.broken
    if state.errors:
        raise state.errors[min(state.errors)]


def _run_in_order(schedule: Schedule, compute: Callable[[int], Any], complete: Callable[[int, Any], None],
                  drop: Callable[[int], None]) -> None:
    """`run` on one thread: every unit in program order (what the scheduler would pick), without its lock."""
    for index, drops in enumerate(schedule.drops_in_order()):
        complete(index, compute(index))
        for t in drops:
            drop(t)
