"""numpy implementations of every WSE kernel kind (the IR's vocabulary, cerebras_tf.ir.KINDS).

`KERNELS` maps a kind to a `KernelFn(inputs, attrs, ctx) -> outputs`;
`run_kernel` is the convenient entry point. Semantics are TensorFlow's for the
kernel's TF op type with static inputs moved to attrs. Variable-writing kinds
(assign_*, scatter_add_variable, apply_*) update `variables` in place and
return []. Never imports TensorFlow. The kinds "gradient_seed" and "to_half"
(inserted by the compiler) are left to the executor, which scales and rounds.

Modules: elementwise, elementwise_grad, linalg (matmul/conv, whose arithmetic
comes from the context's host-kernel provider: host_kernels, host_numpy),
pool, norm, softmax, reduce, data, random, variables (incl. optimizers).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

# Importing a module registers its kinds. `variables` is bound under another name: run_kernel's
# parameter of that name would shadow it.
from cerebras_tf.wse.kernels import (  # noqa: F401
    data,
    elementwise,
    elementwise_grad,
    linalg,
    norm,
    pool,
    random,
    reduce,
    softmax,
)
from cerebras_tf.wse.kernels import variables as _variables_kinds  # noqa: F401
from cerebras_tf.wse.kernels._registry import KERNELS, KernelContext, KernelFn, KernelInputError, np_dtype
from cerebras_tf.wse.kernels.host_kernels import DENSE_KINDS, NUMPY_HOST_KERNELS, DenseKernel, HostKernels

__all__ = ["DENSE_KINDS", "KERNELS", "DenseKernel", "HostKernels", "KernelContext", "KernelFn", "KernelInputError",
           "NUMPY_HOST_KERNELS", "np_dtype", "run_kernel"]


def run_kernel(kind: str, inputs: list[np.ndarray], attrs: Mapping[str, Any] | None = None,
               variables: list[np.ndarray] | None = None, step: int = 0, salt: int = 0,
               host_kernels: HostKernels | None = None, check: bool = True) -> list[np.ndarray]:
    """Run one kernel. `variables` (resource operands) are written in place by the writing kinds;
    `step` (global step) and `salt` (kernel id) seed the random kinds; `host_kernels` provides the
    dense arithmetic (numpy/OpenBLAS when None); `check`: see KernelContext.check."""
    try:
        fn = KERNELS[kind]
    except KeyError:
        raise KeyError(f"no WSE kernel implements kind {kind!r}") from None
    ctx = KernelContext(variables=list(variables or []), step=step, salt=salt,
                        host_kernels=host_kernels or NUMPY_HOST_KERNELS, check=check)
    return fn([np.asarray(x) for x in inputs], attrs or {}, ctx)
