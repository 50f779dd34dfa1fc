"""Helpers for the kernel-vs-TensorFlow tests (a uniquely named module: every test folder has a conftest)."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from typing import Any, Callable

import numpy as np
import tensorflow as tf

from cerebras_tf.wse.kernels import NUMPY_HOST_KERNELS, HostKernels, _jit, run_kernel

HOST_KERNELS: HostKernels = NUMPY_HOST_KERNELS  # the provider `run` uses; the `host_kernels` fixture sets it


def both_ways(fn: Callable[[], Any]) -> tuple[Any, Any]:
    """(fn() with the kernels' numba loops, fn() with their numpy code)."""
    with _jit.use_jit(True):
        fast = fn()
    with _jit.use_jit(False):
        slow = fn()
    return fast, slow


def run(kind: str, inputs: list[Any], attrs: dict[str, Any] | None = None, **kw) -> list[np.ndarray]:
    kw.setdefault("host_kernels", HOST_KERNELS)
    return run_kernel(kind, [np.asarray(x) for x in inputs], attrs or {}, **kw)


def check(ours: Any, theirs: Any, rtol: float = 1e-6, atol: float = 1e-6) -> None:
    """Float: allclose (NaN == NaN); ints/bools exact; dtypes and shapes must agree."""
    t = theirs.numpy() if isinstance(theirs, tf.Tensor) else np.asarray(theirs)
    o = np.asarray(ours)
    assert o.shape == t.shape, (o.shape, t.shape)
    if t.dtype.kind in "fc":
        np.testing.assert_allclose(o.astype(np.float64), t.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)
    else:
        assert o.dtype.kind == t.dtype.kind or (o.dtype == bool) == (t.dtype == bool), (o.dtype, t.dtype)
        np.testing.assert_array_equal(o, t)


def tf_op(op: Any, *args: Any, **attrs: Any) -> Any:
    """Call a tf.raw_ops function with positional operands (raw ops only take keywords)."""
    import inspect
    names = [p for p in inspect.signature(op).parameters if p != "name"]
    return op(**dict(zip(names, args)), **attrs)
