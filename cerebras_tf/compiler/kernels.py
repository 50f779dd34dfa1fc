"""The WSE kernel library: which TF op types the system runs, as which kernel kinds, with which attrs.

A `KernelDef` names the kernel kind, the TF attrs it keeps (renamed where
useful), the inputs that must be compile-time constants and become attrs
(axes, shapes, permutations: a data-dependent value there is an error), and
whether it is a compute kernel (matmul/conv: half-precision inputs, float32
accumulation). Variables are resource operands of a kernel (Kernel.vars), in
the TF op's operand order; `ir.WRITES` says which kinds write them. Kinds and
their cost categories are the IR's vocabulary (`ir.KINDS`).

Kernel semantics are TensorFlow's for the op type in `Kernel.tf_type`, with
the static inputs moved to attrs; e.g. kind "matmul" with attrs
transpose_a/transpose_b is tf.raw_ops.MatMul. A few conventions:
- "select" has attr broadcast="numpy" (SelectV2) or "v1" (Select: a vector
  condition picks rows).
- "fused_batch_norm" outputs (y, batch_mean, batch_var, saved_mean,
  saved_var, reserve[0]); "fused_batch_norm_grad" takes (dy, x, scale,
  saved_mean, saved_var, reserve) and returns (dx, dscale, doffset, _, _).
- random kernels carry TF's (seed, seed2) pair; executors draw a fresh,
  reproducible sample each step from (seed, seed2, global_step).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np
import tensorflow as tf

from cerebras_tf import ir


@dataclasses.dataclass(frozen=True)
class KernelDef:
    kind: str
    attrs: Mapping[str, str] = dataclasses.field(default_factory=dict)  # TF attr -> IR attr name
    static: Mapping[int, str] = dataclasses.field(default_factory=dict)  # input index -> IR attr name
    compute: bool = False  # matmul/conv family: precision casts on float inputs

    @property
    def category(self) -> str:
        """The kind's cost category (the IR vocabulary's)."""
        return ir.KINDS[self.kind]


def _k(kind: str, *attrs: str, static: Mapping[int, str] | None = None, compute: bool = False,
       rename: Mapping[str, str] | None = None) -> KernelDef:
    names = {a: a for a in attrs}
    names.update(rename or {})
    return KernelDef(kind, names, dict(static or {}), compute)


_CONV_ATTRS = ("strides", "padding", "explicit_paddings", "data_format", "dilations")
_POOL_ATTRS = ("ksize", "strides", "padding", "data_format")
_REDUCE: dict[str, Any] = {"static": {1: "axis"}}

LIBRARY: dict[str, KernelDef] = {
    # element-wise, unary
    **{t: _k(t.lower()) for t in ("Neg", "Exp", "Log", "Log1p", "Erf", "Erfc", "Tanh", "Sigmoid", "Relu", "Relu6",
                                  "Elu", "Selu", "Softplus", "Rsqrt", "Sqrt", "Square", "Abs", "Sign",
                                  "Reciprocal", "Floor", "Ceil", "Round", "Sin", "Cos")},
    "LeakyRelu": _k("leaky_relu", "alpha"),
    "LogicalNot": _k("logical_not"),
    "IsFinite": _k("is_finite"),
    "IsNan": _k("is_nan"),
    "Cast": _k("cast", "DstT", rename={"DstT": "to"}),
    "ZerosLike": _k("zeros_like"),
    "OnesLike": _k("ones_like"),
    # element-wise, binary (numpy broadcasting)
    "AddV2": _k("add"), "Add": _k("add"), "Sub": _k("sub"), "Mul": _k("mul"), "MulNoNan": _k("mul_no_nan"),
    "RealDiv": _k("div"), "Div": _k("div"), "DivNoNan": _k("div_no_nan"), "FloorDiv": _k("floor_div"),
    "FloorMod": _k("floor_mod"), "Pow": _k("pow"), "Maximum": _k("maximum"), "Minimum": _k("minimum"),
    "SquaredDifference": _k("squared_difference"),
    "Equal": _k("equal"), "NotEqual": _k("not_equal"), "Less": _k("less"), "LessEqual": _k("less_equal"),
    "Greater": _k("greater"), "GreaterEqual": _k("greater_equal"),
    "LogicalAnd": _k("logical_and"), "LogicalOr": _k("logical_or"),
    "BiasAdd": _k("bias_add", "data_format"), "BiasAddV1": _k("bias_add"),
    "AddN": _k("add_n"),
    "ClipByValue": _k("clip_by_value"),
    "Select": KernelDef("select"),
    "SelectV2": KernelDef("select"),
    # gradients of element-wise ops: (gradient, forward input or output) as in TF
    **{t: _k(name) for t, name in (("ReluGrad", "relu_grad"), ("Relu6Grad", "relu6_grad"),
                                   ("TanhGrad", "tanh_grad"), ("SigmoidGrad", "sigmoid_grad"),
                                   ("RsqrtGrad", "rsqrt_grad"), ("SqrtGrad", "sqrt_grad"),
                                   ("EluGrad", "elu_grad"), ("SeluGrad", "selu_grad"),
                                   ("SoftplusGrad", "softplus_grad"), ("ReciprocalGrad", "reciprocal_grad"))},
    "LeakyReluGrad": _k("leaky_relu_grad", "alpha"),
    "BiasAddGrad": _k("bias_add_grad", "data_format"),
    # matmul / conv (half inputs, float32 accumulation)
    "MatMul": _k("matmul", "transpose_a", "transpose_b", compute=True),
    "BatchMatMul": _k("batch_matmul", "adj_x", "adj_y", compute=True),
    "BatchMatMulV2": _k("batch_matmul", "adj_x", "adj_y", compute=True),
    "BatchMatMulV3": _k("batch_matmul", "adj_x", "adj_y", compute=True),
    "Conv2D": _k("conv2d", *_CONV_ATTRS, compute=True),
    "Conv2DBackpropInput": _k("conv2d_backprop_input", *_CONV_ATTRS, static={0: "input_sizes"},
                              compute=True),
    "Conv2DBackpropFilter": _k("conv2d_backprop_filter", *_CONV_ATTRS, static={1: "filter_sizes"},
                               compute=True),
    "DepthwiseConv2dNative": _k("depthwise_conv2d", *_CONV_ATTRS, compute=True),
    "DepthwiseConv2dNativeBackpropInput": _k("depthwise_conv2d_backprop_input", *_CONV_ATTRS,
                                             static={0: "input_sizes"}, compute=True),
    "DepthwiseConv2dNativeBackpropFilter": _k("depthwise_conv2d_backprop_filter", *_CONV_ATTRS,
                                              static={1: "filter_sizes"}, compute=True),
    "Einsum": _k("einsum", "equation", compute=True),
    # pooling and normalisation
    "MaxPool": _k("max_pool", *_POOL_ATTRS),
    "MaxPoolGrad": _k("max_pool_grad", *_POOL_ATTRS),
    "AvgPool": _k("avg_pool", *_POOL_ATTRS),
    "AvgPoolGrad": _k("avg_pool_grad", *_POOL_ATTRS, static={0: "orig_input_shape"}),
    "FusedBatchNormV3": _k("fused_batch_norm", "epsilon", "exponential_avg_factor", "data_format",
                           "is_training"),
    "FusedBatchNormGradV3": _k("fused_batch_norm_grad", "epsilon", "data_format", "is_training"),
    # softmax and losses
    "Softmax": _k("softmax"),
    "LogSoftmax": _k("log_softmax"),
    "SoftmaxCrossEntropyWithLogits": _k("softmax_cross_entropy"),
    "SparseSoftmaxCrossEntropyWithLogits": _k("sparse_softmax_cross_entropy"),
    "L2Loss": _k("l2_loss"),
    # reductions
    "Sum": _k("sum", "keep_dims", **_REDUCE), "Mean": _k("mean", "keep_dims", **_REDUCE),
    "Max": _k("max", "keep_dims", **_REDUCE), "Min": _k("min", "keep_dims", **_REDUCE),
    "Prod": _k("prod", "keep_dims", **_REDUCE), "All": _k("all", "keep_dims", **_REDUCE),
    "Any": _k("any", "keep_dims", **_REDUCE),
    "ArgMax": _k("argmax", "output_type", **_REDUCE), "ArgMin": _k("argmin", "output_type", **_REDUCE),
    "Cumsum": _k("cumsum", "exclusive", "reverse", static={1: "axis"}),
    "MatrixBandPart": _k("band_part", static={1: "num_lower", 2: "num_upper"}),
    # data movement (static shapes, axes and indices in attrs)
    "Reshape": _k("reshape", static={1: "shape"}),
    "Squeeze": _k("squeeze", "squeeze_dims", rename={"squeeze_dims": "axis"}),
    "ExpandDims": _k("expand_dims", static={1: "axis"}),
    "Transpose": _k("transpose", static={1: "perm"}),
    "ConcatV2": _k("concat", static={-1: "axis"}),
    "Pack": _k("stack", "axis"),
    "Unpack": _k("unstack", "axis", "num"),
    "Split": _k("split", "num_split", static={0: "axis"}),
    "SplitV": _k("split_v", static={1: "size_splits", 2: "axis"}),
    "Slice": _k("slice", static={1: "begin", 2: "size"}),
    "StridedSlice": _k("strided_slice", "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
                       "shrink_axis_mask", static={1: "begin", 2: "end", 3: "strides"}),
    "StridedSliceGrad": _k("strided_slice_grad", "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
                           "shrink_axis_mask", static={0: "shape", 1: "begin", 2: "end", 3: "strides"}),
    "Tile": _k("tile", static={1: "multiples"}),
    "Pad": _k("pad", static={1: "paddings"}),
    "PadV2": _k("pad", static={1: "paddings", 2: "constant_value"}),
    "BroadcastTo": _k("broadcast_to", static={1: "shape"}),
    "Fill": _k("fill", static={0: "shape"}),
    "OneHot": _k("one_hot", "axis", static={1: "depth", 2: "on_value", 3: "off_value"}),
    "GatherV2": _k("gather", "batch_dims", static={2: "axis"}),
    "UnsortedSegmentSum": _k("unsorted_segment_sum", static={2: "num_segments"}),
    "Range": _k("range", static={0: "start", 1: "limit", 2: "delta"}),
    # stateful random (reproducible: TF's seed pair)
    "RandomUniform": _k("random_uniform", "seed", "seed2", "dtype", static={0: "shape"}),
    "RandomStandardNormal": _k("random_normal", "seed", "seed2", "dtype", static={0: "shape"}),
    "TruncatedNormal": _k("truncated_normal", "seed", "seed2", "dtype", static={0: "shape"}),
    # variables (resource operands are Kernel.vars)
    "ReadVariableOp": _k("read_variable"),
    "ResourceGather": _k("gather_variable", "batch_dims"),
    "AssignVariableOp": _k("assign_variable"),
    "AssignAddVariableOp": _k("assign_add_variable"),
    "AssignSubVariableOp": _k("assign_sub_variable"),
    "ResourceScatterAdd": _k("scatter_add_variable"),
    # optimizer updates (fused, TF semantics)
    "ResourceApplyGradientDescent": _k("apply_gradient_descent"),
    "ResourceApplyMomentum": _k("apply_momentum", "use_nesterov"),
    "ResourceApplyKerasMomentum": _k("apply_keras_momentum", "use_nesterov"),
    "ResourceSparseApplyMomentum": _k("sparse_apply_momentum", "use_nesterov"),
    "ResourceApplyAdam": _k("apply_adam", "use_nesterov"),
    "ResourceApplyRMSProp": _k("apply_rms_prop"),
    "ResourceApplyAdagrad": _k("apply_adagrad", "update_slots"),
    "ResourceApplyAdagradV2": _k("apply_adagrad_v2", "update_slots"),
}

# Output shapes TF leaves unknown that the kernel defines.
OUTPUT_SHAPES: dict[str, dict[int, list[int]]] = {
    "FusedBatchNormV3": {5: [0]},  # reserve_space_3: empty on this system
}

# ---- unsupported ops: hints --------------------------------------------------------
_PY_FUNC = ("EagerPyFunc", "PyFunc", "PyFuncStateless")
DATA_DEPENDENT = ("Where", "Unique", "UniqueV2", "UniqueWithCounts", "DynamicPartition", "DynamicStitch",
                   "NonMaxSuppressionV3", "NonMaxSuppressionV4", "NonMaxSuppressionV5", "Shape", "ShapeN",
                   "Size", "ListDiff", "SparseToDense", "RaggedTensorToTensor")
# TF1 control flow (tf.cond / tf.while_loop with control flow v2 disabled): its ops' creation order is not a
# topological one, so the compiler refuses a graph holding them before lowering anything.
TF1_CONTROL_FLOW = ("Switch", "Merge", "Enter", "Exit", "NextIteration", "LoopCond")
_LOOPS = ("While", "StatelessWhile")


def unsupported_hint(op: tf.Operation) -> str:
    """What to do about an op with no kernel."""
    if op.type in _PY_FUNC:
        return ("tf.py_function / tf.numpy_function run arbitrary Python on the host, which the wafer cannot "
                "call mid-step. Rewrite the function with TensorFlow ops, or move it into input_fn (it may "
                "run there, in the input pipeline).")
    if any(t.dtype == tf.string for t in list(op.inputs) + list(op.outputs)):
        return ("String tensors cannot live on the wafer. Do string processing (parsing, formatting, lookup) "
                "in input_fn and feed numeric tensors; format values in a host_call on the host, or give "
                "tf.print / tf.Assert the numeric tensors themselves (the host formats them as TF does).")
    if op.type.startswith("Unique") and "update_" in op.name:
        return ("The optimizer de-duplicates the sparse gradient of an embedding lookup (tf.gather on a "
                "variable) with tf.unique, whose size depends on the data. Densify the gradients before "
                "applying them: grads_and_vars = [(tf.convert_to_tensor(g), v) for g, v in "
                "optimizer.compute_gradients(loss)], then optimizer.apply_gradients(grads_and_vars, global_step), "
                "or look embeddings up with a one-hot matmul.")
    if op.type in DATA_DEPENDENT:
        return ("Its output shape depends on the data (e.g. tf.boolean_mask, tf.where with one argument, "
                "tf.unique, tf.shape of a dynamic tensor), but the CS system needs every shape fixed at "
                "compile time. Use a fixed-shape formulation: multiply by a 0/1 mask, tf.where(cond, x, y), "
                "or pad to a maximum size.")
    if op.type in TF1_CONTROL_FLOW:
        return ("TF1 control flow (the Switch/Merge ops tf.cond and tf.while_loop build after "
                "tf.compat.v1.disable_control_flow_v2() or disable_v2_behavior()) cannot be compiled. Call "
                "tf.compat.v1.enable_control_flow_v2() before building the model: the CS system compiles its "
                "tf.cond/tf.case (If ops; loops stay unsupported: unroll them in Python).")
    if op.type in _LOOPS:
        return ("Loops (tf.while_loop, or a Python loop over tensors that AutoGraph turned into one) are not "
                "supported: the graph must be static. Unroll the loop in Python with a fixed trip count.")
    if op.type in ("OptionalFromValue", "OptionalNone", "OptionalGetValue", "OptionalHasValue"):
        return ("TF keeps the intermediates of a differentiated tf.cond/tf.case in optionals for its gradient, "
                "which the CS system cannot hold. Choose between differentiable values with tf.where(cond, x, y) "
                "(both computed, as the if-converted branches are), and keep tf.cond for choices that are not "
                "differentiated (schedules, loss-scale updates).")
    if op.type in ("Case", "StatelessCase"):
        return ("tf.switch_case over a computed index (a Case op) is not supported (a constant index is folded). "
                "Write it as tf.case over predicates or nested tf.cond (compiled by running every branch and "
                "selecting the result; branch variable writes happen only in the taken branch), or tf.where for "
                "element-wise choices.")
    if op.type in ("If", "StatelessIf"):
        return ("tf.cond/tf.case is compiled by running both branches and selecting the result (variable writes "
                "happen only in the taken branch), so every op in both branches must run on the CS system.")
    if op.type in ("CheckNumerics", "CheckNumericsV2"):
        return ("tf.debugging.check_numerics / assert_all_finite are not run on the CS system. Write the check as "
                "an assertion, which is: tf.debugging.Assert(tf.reduce_all(tf.math.is_finite(x)), ['x is not "
                "finite', x]) under tf.control_dependencies (checked by the host after each step).")
    if op.type in ("PartitionedCall", "StatefulPartitionedCall"):
        return "Calls of tf.function inside model_fn are not inlined; call the Python function directly instead."
    return ("No WSE kernel implements this op. Express it with supported ops (see "
            "cerebras_tf.compiler.kernels.LIBRARY), or compute it on the host in a host_call.")


# ---- attrs and cost ---------------------------------------------------------------
def json_attr(value: Any) -> Any:
    """A TF attr value as JSON data."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, tf.DType):
        return value.name
    if isinstance(value, (list, tuple)):
        return [json_attr(v) for v in value]
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return str(value)


def estimate_flops(kind: str, category: str, inputs: list[list[int]], outputs: list[list[int]],
                   attrs: Mapping[str, Any]) -> int:
    """Rough floating-point operations of one kernel run (multiply-add = 2)."""
    out = int(sum(np.prod(s, dtype=np.int64) for s in outputs))
    if kind == "matmul":
        a = inputs[0]
        k = a[0] if attrs.get("transpose_a") else a[1]
        return 2 * out * int(k)
    if kind == "einsum" and "." not in attrs["equation"]:  # contracted: input dims not in the output
        spec_in, spec_out = attrs["equation"].replace(" ", "").split("->")
        sizes = {c: d for term, shape in zip(spec_in.split(","), inputs) for c, d in zip(term, shape)}
        contracted = int(np.prod([d for c, d in sizes.items() if c not in spec_out], dtype=np.int64))
        return 2 * out * contracted
    if kind == "batch_matmul":
        a = inputs[0]
        k = a[-2] if attrs.get("adj_x") else a[-1]
        return 2 * out * int(k)
    if kind == "depthwise_conv2d":  # (input, filter [h, w, in, multiplier])
        return 2 * out * int(inputs[1][0] * inputs[1][1])
    if kind == "conv2d":  # (input, filter)
        filt = inputs[1]
        return 2 * out * int(filt[0] * filt[1] * filt[2])
    if kind == "conv2d_backprop_input":  # (filter, dy) -> dx
        filt = inputs[0]
        return 2 * out * int(filt[0] * filt[1] * filt[3])
    if kind == "conv2d_backprop_filter":  # (input, dy) -> dfilter
        dy = inputs[1]
        return 2 * int(np.prod(dy, dtype=np.int64)) * int(attrs["filter_sizes"][0] * attrs["filter_sizes"][1]
                                                          * attrs["filter_sizes"][2])
    if category in ("reduce", "softmax", "norm", "pool", "optimizer"):
        biggest = max([int(np.prod(s, dtype=np.int64)) for s in inputs] + [out])
        return {"reduce": 1, "softmax": 5, "norm": 8, "pool": 4, "optimizer": 10}[category] * biggest
    if category in ("data", "variable"):
        return 0
    return out
