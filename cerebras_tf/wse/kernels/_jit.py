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
tests run every such kernel both ways (`use_jit`).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

ENV_VAR = "CEREBRAS_TF_JIT"

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


def jit(fn: F) -> F:
    """`fn` compiled by numba (nopython, GIL released, cached on disk, no fast-math) on its first call;
    `fn` itself when numba is missing (then `enabled()` is False and no kernel calls it)."""
    if _numba is None:  # pragma: no cover
        return fn
    return cast(F, _numba.njit(cache=True, nogil=True, fastmath=False, error_model="numpy")(fn))
