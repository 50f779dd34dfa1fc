"""Denormals flushed to zero on the threads that run the executor's kernels, as TensorFlow's CPU kernels run.

TensorFlow runs its kernels with the x86 MXCSR's flush-to-zero and
denormals-are-zero bits set (its ScopedFlushDenormal): a subnormal float32
result becomes a zero of its sign, a subnormal operand reads as zero. numpy and
numba leave them clear, and then every operation on a subnormal takes a slow
microcode path: the zoo transformer's step slowed from 145 to 190 ms over its
first 100 steps as its intermediates reached the subnormal range, and stayed at
about 165 ms with them flushed. Flushing also gives TF's bits where a value
underflows.

`flushing()` sets both bits on the calling thread for a block (the executor's
step) and restores the thread's own setting after; `as_in` gives a helper or
pool thread the setting of the thread that handed it work.
Both are no-ops where they cannot apply (not x86-64, or numba missing):
`AVAILABLE` says which.
"""
from __future__ import annotations

import contextlib
import platform
from typing import Any, Callable, Iterator

FTZ_DAZ = 0x8040  # MXCSR bits: flush to zero (15) and denormals are zero (6)

_read: Callable[[], int] | None = None
_write: Callable[[int], None] | None = None


def _build() -> None:
    """Compile the two MXCSR accessors (numba intrinsics over LLVM's x86 stmxcsr/ldmxcsr)."""
    global _read, _write
    try:
        from llvmlite import ir as llvm
        from numba import njit, types
        from numba.extending import intrinsic
    except ImportError:  # pragma: no cover - numba is a dependency
        return

    def _call(builder: Any, name: str, slot: Any) -> None:
        """LLVM's x86 intrinsic `name` (stmxcsr/ldmxcsr) on the 32-bit stack slot `slot`."""
        byte_ptr = llvm.IntType(8).as_pointer()
        function = builder.module.declare_intrinsic(name, fnty=llvm.FunctionType(llvm.VoidType(), [byte_ptr]))
        builder.call(function, [builder.bitcast(slot, byte_ptr)])

    @intrinsic
    def _stmxcsr(typingctx: Any) -> Any:  # pragma: no cover - compiled by numba
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            slot = builder.alloca(llvm.IntType(32))
            _call(builder, "llvm.x86.sse.stmxcsr", slot)
            return builder.load(slot)
        return types.int32(), codegen

    @intrinsic
    def _ldmxcsr(typingctx: Any, value: Any) -> Any:  # pragma: no cover - compiled by numba
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            slot = builder.alloca(llvm.IntType(32))
            builder.store(args[0], slot)
            _call(builder, "llvm.x86.sse.ldmxcsr", slot)
            return context.get_dummy_value()
        return types.void(types.int32), codegen

    stmxcsr: Any = _stmxcsr  # typed loosely: numba's intrinsics take the typing context only when compiling
    ldmxcsr: Any = _ldmxcsr

    @njit(nogil=True)
    def read() -> int:  # pragma: no cover - compiled by numba
        return stmxcsr()

    @njit(nogil=True)
    def write(value: int) -> None:  # pragma: no cover - compiled by numba
        ldmxcsr(value)

    @njit(nogil=True)
    def enter(state: int) -> int:  # pragma: no cover - compiled by numba
        before = stmxcsr()
        ldmxcsr((before & ~FTZ_DAZ) | (state & FTZ_DAZ))
        return before

    @njit(nogil=True)
    def leave(before: int) -> None:  # pragma: no cover - compiled by numba
        ldmxcsr(before)

    global enter_in_loop, leave_in_loop
    _read, _write = read, write
    enter_in_loop, leave_in_loop = enter, leave


def _keep(state: int) -> int:  # pragma: no cover - where flushing does not apply
    return 0


def _restore(before: int) -> None:  # pragma: no cover
    pass


# For numba code that runs a kernel's work on a thread of numba's own (threads.run_loop): called from compiled
# code, `before = enter_in_loop(state)` sets that thread's flushing as `state` (a `mxcsr()`, 0 for none) says,
# and `leave_in_loop(before)` restores it. Compiled no-ops where flushing does not apply.
enter_in_loop: Callable[[int], int] = _keep
leave_in_loop: Callable[[int], None] = _restore

AVAILABLE = platform.machine().lower() in ("x86_64", "amd64")
if AVAILABLE:
    _build()
    AVAILABLE = _read is not None
if not AVAILABLE:
    try:
        from numba import njit as _njit
        enter_in_loop, leave_in_loop = _njit(nogil=True)(_keep), _njit(nogil=True)(_restore)
    except ImportError:  # pragma: no cover - numba is a dependency
        pass


def mxcsr() -> int | None:
    """This thread's MXCSR (None where flushing does not apply)."""
    return int(_read()) & 0xFFFF if _read is not None else None


@contextlib.contextmanager
def as_in(state: int | None) -> Iterator[None]:
    """Within the block, this thread flushes denormals as a thread whose `mxcsr()` was `state` does (work a
    kernel hands to a pool thread computes as the kernel's own thread would)."""
    if state is None or _read is None or _write is None:
        yield
        return
    before = int(_read())
    if (before ^ state) & FTZ_DAZ == 0:
        yield
        return
    _write((before & ~FTZ_DAZ) | (state & FTZ_DAZ))
    try:
        yield
    finally:
        _write(before)


def flushing() -> contextlib.AbstractContextManager[None]:
    """Within the block, this thread flushes denormals; its own setting is restored after."""
    return as_in(FTZ_DAZ)
