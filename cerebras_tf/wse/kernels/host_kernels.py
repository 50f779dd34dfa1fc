"""Host kernels: where the executor gets its dense math (matmul, batch matmul, the convolutions and their
gradients) from.

The WSE kernels of these kinds (linalg.py) own the numerics contract: they hand a
provider float32 operands (inputs already rounded to the half dtype by the program's
casts; float16 arrays upcast), take back a float32 result (products accumulated in
float32) and cast it back to the input's dtype. A provider is only the arithmetic, so
it can be swapped for a faster library without touching the numerics: numpy/OpenBLAS
(`NUMPY_HOST_KERNELS`, the default, here) or TensorFlow's own oneDNN kernels
(`cerebras_tf.run.host_kernels_tf`, outside wse/ because it imports TensorFlow).

Each callable takes the kernel's operands and attrs exactly as the IR holds them (the
TF op's attrs, static operands such as input_sizes/filter_sizes among them) and
returns one array. Integer matmul operands arrive as they are (they multiply exactly).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from cerebras_tf.wse.kernels import host_numpy

DenseKernel = Callable[[Sequence[np.ndarray], Mapping[str, Any]], np.ndarray]
# Several dense kernels, (kind, operands, attrs) each, in one call of the library; a result each.
DenseKernels = Callable[[Sequence[tuple[str, Sequence[np.ndarray], Mapping[str, Any]]]], list[np.ndarray]]


@dataclasses.dataclass(frozen=True)
class HostKernels:
    """One provider of the dense kernels; `name` is what the log and the benchmarks show. Its callables may run
    on several threads at once (the executor runs independent kernels side by side). `together`, where the
    library can take several independent kernels in one call and run them at once (TensorFlow's executor
    does): the executor hands it adjacent independent dense kernels (fusion.dense_groups); None: one by one.
    `spinning_pool`: its library's own threads keep spinning on the cores after each call (TensorFlow's), so the
    executor keeps its compiled loops off numba's threads (threads.one_loop_thread), runs one kernel at a
    time (its threads=None picks 1 without measuring) and keeps the cores from idling during a step
    (spin_wait.cores_awake: each call wakes the library's threads). batch_matmul's operands
    may be strided views (fusion.lazy_transposes), and its attrs may ask for a layout of its result
    ("out_perm", fusion.transposed_outputs), which a provider may ignore."""

    name: str
    matmul: DenseKernel
    batch_matmul: DenseKernel
    conv2d: DenseKernel
    conv2d_backprop_input: DenseKernel
    conv2d_backprop_filter: DenseKernel
    depthwise_conv2d: DenseKernel
    depthwise_conv2d_backprop_input: DenseKernel
    depthwise_conv2d_backprop_filter: DenseKernel
    together: DenseKernels | None = None
    spinning_pool: bool = False


# The kernel kinds a provider computes: its DenseKernel fields.
DENSE_KINDS = frozenset(f.name for f in dataclasses.fields(HostKernels)) - {"name", "together", "spinning_pool"}


NUMPY_HOST_KERNELS = HostKernels(
    name="numpy",
    matmul=host_numpy.matmul,
    batch_matmul=host_numpy.batch_matmul,
    conv2d=host_numpy.conv2d,
    conv2d_backprop_input=host_numpy.conv2d_backprop_input,
    conv2d_backprop_filter=host_numpy.conv2d_backprop_filter,
    depthwise_conv2d=host_numpy.depthwise_conv2d,
    depthwise_conv2d_backprop_input=host_numpy.depthwise_conv2d_backprop_input,
    depthwise_conv2d_backprop_filter=host_numpy.depthwise_conv2d_backprop_filter,
)
