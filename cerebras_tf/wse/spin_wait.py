"""The host's cores kept out of their idle state while a step runs: one spinning thread per core, at idle priority.

A training step hands work from thread to thread hundreds of times: between the executor's threads (the GIL
among them) and to TensorFlow's pool for the kernels it computes. A thread that waits sleeps, and where its
core then has nothing to run the OS idles the core: a VM halts its vCPU (this project's machines: haltpoll
with guest_halt_poll_ns = 0), bare metal enters a C-state. Waking the thread then waits for the core to wake
too (benchmarks/handoff_bench: a thread's wake-up and back, 36 us with the other core idle, 21 with it
spinning). TensorFlow's own pool, OpenMP runtimes and BLAS libraries spin a while before they sleep for this
reason; the waits of the simulator's step (Python threads, numba loops, TensorFlow's kernels called one at a
time) fall between those spins.

`cores_awake()` (around a step of the executor, with the provider below) has one thread per core this process
may use spin on a flag until the last step running ends. Each spinner is pinned to its core and runs at
SCHED_IDLE: the kernel runs it only when nothing else on that core is runnable, and preempts it as soon as
anything is, so it takes no time from the step's threads (nor from other processes); it only keeps the core
from idling.
Its loop runs compiled, without the GIL, and calls sched_yield between reads of the flag, so the kernel
looks for anything else to run on the core every microsecond or so. (A loop that only read the flag, with
x86's pause between reads, made the zoo CNN's step slower, 1.04-1.07x the time: a thread woken on a core
so spinning waited before it ran.) Measured here, two processes taking turns, with and without, the
median step over 5-6 rounds: the zoo CNN on TensorFlow's kernels 0.95x the time in float16 and in float32
(each call wakes TensorFlow's pool), but the numpy provider's models no faster (the zoo transformer on two
threads 0.99x in float16 and 1.02x in float32, the MLP 1.00x and 1.02x, every one within its rounds' spread):
so the executor spins with a provider whose pool it hands each dense kernel to (HostKernels.spinning_pool).
The results are the same bits either way; the process's CPU time counts the spinning.

Linux only (SCHED_IDLE and per-thread affinity), with numba, and not where the process's CPU time is capped
(a container's --cpus: the spinning would count against the cap); CEREBRAS_TF_SPIN_WAIT=0 turns it off.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable, Iterator

import numpy as np

ENV_VAR = "CEREBRAS_TF_SPIN_WAIT"

_lock = threading.Lock()
_users = 0  # cores_awake blocks open now
_flag = np.zeros(1, np.int64)  # 1 while the spinners spin
_go = threading.Event()  # set while they should spin (they wait on it in between)
_spinners: list[threading.Thread] = []
_compiled = False
_capped = False  # cpu_capped(), read with the compile

_spin: Callable[[np.ndarray, int], None] | None = None
# Reads of the flag a spinner goes on for after a step ends, each a sched_yield (about 0.5 us here): about a
# millisecond, which covers the gap between a training loop's steps.
GRACE_READS = 2000
try:
    from llvmlite import ir as _llvm
    from numba import njit as _njit
    from numba import types as _types
    from numba.core import cgutils as _cgutils
    from numba.extending import intrinsic as _intrinsic
except ImportError:  # pragma: no cover - numba is a dependency
    pass
else:
    @_intrinsic
    def _sched_yield(typingctx: Any) -> Any:  # pragma: no cover - compiled by numba
        """libc's sched_yield(), called by name (so numba can cache the loop that calls it)."""
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            function = _cgutils.get_or_insert_function(builder.module, _llvm.FunctionType(_llvm.IntType(32), []),
                                                       "sched_yield")
            builder.call(function, [])
            return context.get_dummy_value()
        return _types.void(), codegen

    _yield_core: Any = _sched_yield  # typed loosely: numba's intrinsics take the typing context only when compiling

    def _spin_loop(flag: np.ndarray, grace: int) -> None:  # pragma: no cover - compiled by numba
        """Spin while flag[0] != 0, and on for `grace` more reads after it last was (the next step may start
        by then), yielding the core between reads (the call also makes the compiler read the flag again)."""
        since = 0
        while since < grace:
            since = 0 if flag[0] != 0 else since + 1
            _yield_core()

    _spin = _njit(nogil=True, cache=True)(_spin_loop)


def available() -> bool:
    """Whether spinners can run here: Linux's SCHED_IDLE and per-thread affinity, numba, and no cap on the
    process's CPU time (`cpu_capped`). The loop is compiled (or loaded from numba's disk cache) on the first
    call, on the calling thread."""
    global _compiled, _capped
    if _spin is None or not (hasattr(os, "SCHED_IDLE") and hasattr(os, "sched_setaffinity")):
        return False
    if not _compiled:
        with _lock:
            if not _compiled:
                _capped = cpu_capped()  # read once a process
                _spin(np.zeros(1, np.int64), 0)  # returns at once
                _compiled = True
    return not _capped


_CGROUP_ROOT = "/sys/fs/cgroup"


def cpu_capped(root: str = _CGROUP_ROOT, cgroups: str = "/proc/self/cgroup") -> bool:
    """Whether the process's cgroup caps its CPU time (a container's --cpus: cgroup v2's cpu.max, v1's
    cpu.cfs_quota_us): a spinner's time would count against the cap and throttle the step's own threads, so
    none spins there. False where it cannot tell."""
    try:
        with open(cgroups) as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    files = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        path = path.rstrip("/")
        if controllers == "":  # cgroup v2
            files += [(f"{root}{path}/cpu.max", "v2"), (f"{root}/cpu.max", "v2")]
        elif "cpu" in controllers.split(","):
            for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                files += [(f"{root}/{mount}{path}/cpu.cfs_quota_us", "v1"), (f"{root}/{mount}/cpu.cfs_quota_us", "v1")]
    for name, version in files:
        try:
            with open(name) as f:
                value = f.read().split()
        except OSError:
            continue
        if value and (value[0] != "max" if version == "v2" else value[0] != "-1"):
            return True
    return False


def wanted() -> bool:
    """Whether the environment leaves spinning on (CEREBRAS_TF_SPIN_WAIT unset, or anything but 0/false/no/off)."""
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


def _spinner(core: int, spin: Callable[[np.ndarray, int], None], go: threading.Event, flag: np.ndarray) -> None:
    """A spinner's life: on `core` alone, at idle priority; spins whenever `go` is set, until `flag` has been 0
    for GRACE_READS reads."""
    try:
        os.sched_setaffinity(0, {core})
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError:  # e.g. a core the affinity lists but a cgroup refuses: this one does not spin
        return
    while True:
        go.wait()
        spin(flag, GRACE_READS)


def _start() -> bool:
    """Open a cores_awake block: the spinners made on the first, set spinning by the first of overlapping ones."""
    global _users
    if not wanted() or not available():
        return False
    with _lock:
        spin = _spin
        assert spin is not None
        if not _spinners:
            for core in sorted(os.sched_getaffinity(0)):
                thread = threading.Thread(target=_spinner, args=(core, spin, _go, _flag),
                                          name=f"wse-spin-{core}", daemon=True)
                thread.start()
                _spinners.append(thread)
        _users += 1
        if _users == 1:
            _flag[0] = 1
            _go.set()
    return True


def _stop() -> None:
    """Close a cores_awake block: the last one stops the spinning (the spinners wait for the next)."""
    global _users
    with _lock:
        if _users == 0:  # a block a forked child inherited open
            return
        _users -= 1
        if _users == 0:
            _go.clear()
            _flag[0] = 0


@contextlib.contextmanager
def cores_awake() -> Iterator[None]:
    """Within the block (and any overlapping one, on any thread), a spinner on each core keeps it from idling;
    a no-op where spinning is off or not available."""
    if not _start():
        yield
        return
    try:
        yield
    finally:
        _stop()


def spinning() -> bool:
    """Whether the spinners are asked to spin now."""
    return bool(_flag[0])


def spinner_threads() -> list[threading.Thread]:
    """The spinner threads made so far in this process (for tests and tools)."""
    with _lock:
        return list(_spinners)


def _forget() -> None:
    """In a forked child: the parent's spinners do not exist here (new ones start with the next block)."""
    global _lock, _users, _flag, _go
    _lock, _users, _flag, _go = threading.Lock(), 0, np.zeros(1, np.int64), threading.Event()
    _spinners.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)
