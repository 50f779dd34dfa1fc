"""The kernel registry: kind -> numpy implementation, plus the per-run context."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from cerebras_tf.wse.kernels.host_kernels import NUMPY_HOST_KERNELS, HostKernels


@dataclasses.dataclass
class KernelContext:
    """What a kernel may use besides its inputs and attrs.

    variables: the resource operands (Kernel.vars order), written in place by
    the variable-writing kinds. step: the global step, which random kernels mix
    into their (seed, seed2) pair so each step draws a fresh sample. salt: mixed
    in only for unseeded random kernels (seed == seed2 == 0). check: whether a
    kernel refuses input TF's CPU kernel refuses (KernelInputError); False in a
    tf.cond branch not taken this step (Kernel.check_guard), where the kernel
    computes on clamped input instead (its results are discarded).
    """

    variables: list[np.ndarray] = dataclasses.field(default_factory=list)
    step: int = 0
    salt: int = 0  # distinguishes unseeded (seed == seed2 == 0) random kernels: pass the kernel id
    host_kernels: HostKernels = NUMPY_HOST_KERNELS
    check: bool = True  # set by the executor each step for a kernel with a check_guard


class KernelInputError(ValueError):
    """A kernel's input that TensorFlow's CPU kernel refuses with InvalidArgumentError (e.g. a label out of range
    for sparse softmax cross entropy); the message is TF's, word for word.

    The executor sets `kernel` (the IR kernel that raised it: its TF op name and the user's line) on the way
    out; the host raises TF's own error type for it (cerebras_tf.run.chief).
    """

    kernel: Any = None


KernelFn = Callable[[list[np.ndarray], Mapping[str, Any], KernelContext], list[np.ndarray]]

KERNELS: dict[str, KernelFn] = {}


def register(*kinds: str) -> Callable[[KernelFn], KernelFn]:
    """Decorator: register `fn` under each kind."""
    def deco(fn: KernelFn) -> KernelFn:
        for kind in kinds:
            if kind in KERNELS:
                raise ValueError(f"kernel kind {kind!r} registered twice")
            KERNELS[kind] = fn
        return fn
    return deco


def np_dtype(name: Any) -> np.dtype:
    """A numpy dtype for an IR dtype name; "half" (and bfloat16/cbfloat16) are held as float32."""
    if isinstance(name, np.dtype):
        return name
    name = str(name)
    if name in ("half", "bfloat16", "cbfloat16"):
        return np.dtype(np.float32)
    return np.dtype(name)


def attr_ints(value: Any) -> list[int]:
    """An integer-list attr (an int, a list or tuple of ints, or an array of them) as a list of Python ints; a
    list of ints as the compiler writes it is taken as it is, without a numpy round trip."""
    if type(value) is int:
        return [value]
    if isinstance(value, (list, tuple)) and all(type(v) is int for v in value):
        return list(value)
    return [int(a) for a in np.atleast_1d(np.asarray(value, np.int64)).tolist()]


def normalize_axis(axis: int, ndim: int) -> int:
    """A TF axis (negative counts from the end) as a non-negative index."""
    return axis + ndim if axis < 0 else axis
