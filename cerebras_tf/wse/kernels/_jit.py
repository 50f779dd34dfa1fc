"""numba-compiled loops for the memory-bound kernels, and the switch between them and plain numpy.

A kernel that numpy computes in several passes over memory (half rounding, ReLU
and pooling gradients, batch norm, optimizer updates) has a one-pass loop here,
compiled by numba on first use (cached on disk) and run without the GIL, so the
simulator's own threads can split it. Each loop is written to give the same
float32 result as the numpy code it replaces, operation for operation (no
fast-math, no float64 detours); reductions may sum in another order, within the
float32 parity tolerance of TensorFlow.

`enabled()` says whether the loops are used: numba is a dependency, but the
numpy paths stay (a missing numba, or CEREBRAS_TF_JIT=0, selects them) and the
tests run every such kernel both ways (`use_jit`). `f2u` and `u2f` reinterpret a
float32's bits in a loop (and wse/chains' generated ones).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
from typing import Any, Callable, Iterator, TypeVar, cast

import numpy as np

F = TypeVar("F", bound=Callable[..., Any])

ENV_VAR = "CEREBRAS_TF_JIT"

# The smallest normal float32: TF's threads read an input below it in magnitude as a zero of its sign (DAZ),
# which the TF-exact loops (eigen_erf, eigen_erfc, eigen_tanh) do explicitly.
FLOAT32_TINY = np.float32(np.finfo(np.float32).tiny)

_numba: Any
try:  # pragma: no cover - exercised by which stack is installed
    import numba as _numba
except ImportError:  # pragma: no cover
    _numba = None

_enabled = _numba is not None and os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


def enabled() -> bool:
    """Whether kernels take their numba loops (else their numpy code)."""
    return _enabled


@contextlib.contextmanager
def use_jit(on: bool) -> Iterator[None]:
    """Within the block, kernels take their numba loops (on) or their numpy code (off); for tests and
    benchmarks. Asking for the loops without numba installed raises RuntimeError."""
    global _enabled
    if on and _numba is None:
        raise RuntimeError("numba is not installed: pip install the project's pinned numba")
    before, _enabled = _enabled, on
    try:
        yield
    finally:
        _enabled = before


def sources_stamp(package: str) -> str:
    """A hash of every module in the directory `package` (for this package's: what a loop here can compile
    into itself, a jitted callee of another module or an intrinsic)."""
    stamp = hashlib.sha256()
    for name in sorted(os.listdir(package)):
        if name.endswith(".py"):
            with open(os.path.join(package, name), "rb") as source:
                stamp.update(name.encode() + b"\0" + source.read())
    return stamp.hexdigest()


# numba's disk cache keys a loop on its own module's source only, and compiles the jitted functions it calls
# from other modules into it: a change to half.rounded alone would leave norm's loops that inline it as they
# were. Each loop's cache key also carries this stamp, so any change to the package recompiles them all.
SOURCES_STAMP = sources_stamp(os.path.dirname(os.path.abspath(__file__)))


def jit(fn: F) -> F:
    """`fn` compiled by numba (nopython, GIL released, no fast-math) on its first call, cached on disk under
    SOURCES_STAMP; `fn` itself when numba is missing (then `enabled()` is False and no kernel calls it)."""
    if _numba is None:  # pragma: no cover
        return fn
    dispatcher = _numba.njit(cache=False, nogil=True, fastmath=False, error_model="numpy")(fn)
    dispatcher._cache = _StampedCache(fn)  # numba's enable_caching(), with the stamped cache
    return cast(F, dispatcher)


# ---- bit casts (numba intrinsics: a bitcast, no memory round trip), for the loops here and wse/chains' --------

def _f2u_py(x: Any) -> int:  # pragma: no cover - only without numba, where no loop runs
    return int(np.asarray(x, np.float32).view(np.uint32))


def _u2f_py(u: Any) -> Any:  # pragma: no cover
    return np.asarray(u, np.uint32).view(np.float32)[()]


f2u: Callable[..., Any] = _f2u_py
u2f: Callable[..., Any] = _u2f_py
if _numba is not None:  # pragma: no branch
    from llvmlite import ir as _llvm
    from numba.core.caching import FunctionCache as _FunctionCache
    from numba.core import types as _types
    from numba.extending import intrinsic as _intrinsic

    @_intrinsic
    def f2u(typingctx: Any, x: Any) -> Any:  # pragma: no cover - compiled by numba
        """The bits of a float32 as uint32."""
        if x != _types.float32:
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.bitcast(args[0], _llvm.IntType(32))
        return _types.uint32(_types.float32), codegen

    @_intrinsic
    def u2f(typingctx: Any, u: Any) -> Any:  # pragma: no cover - compiled by numba
        """The float32 whose bits are the low 32 bits of the integer u."""
        if u not in _types.integer_domain:
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            value = args[0]
            if u.bitwidth > 32:
                value = builder.trunc(value, _llvm.IntType(32))
            elif u.bitwidth < 32:
                value = builder.zext(value, _llvm.IntType(32))
            return builder.bitcast(value, _llvm.FloatType())
        return _types.float32(u), codegen

    class _StampedCache(_FunctionCache):
        """numba's disk cache of one function, each entry's key also carrying SOURCES_STAMP."""

        def _index_key(self, sig: Any, codegen: Any) -> Any:
            return (*super()._index_key(sig, codegen), SOURCES_STAMP)
