"""The IR's closed vocabularies: kernel kinds (with their cost category), kernel and variable roles, dtypes.

One definition shared by the compiler (which emits kinds: `compiler.kernels.LIBRARY`
maps TF op types onto these), the executor (`wse.kernels.KERNELS` implements each)
and `verify` (which refuses anything else).
"""
from __future__ import annotations

from typing import Literal, get_args

# forward: the model and anything not below; gradient_seed: d(loss)/d(loss);
# backward: gradient computation; optimizer: everything downstream of the
# gradients (clipping, learning-rate use, slot and weight updates);
# state_update: variable writes independent of gradients (batch-norm moving
# averages); global_step_update: the step counter increment.
Role = Literal["forward", "gradient_seed", "backward", "optimizer", "state_update", "global_step_update"]
ROLES: tuple[str, ...] = get_args(Role)
# The roles that write after the forward/backward pass: the executor's later phases.
UPDATE_ROLES = ("optimizer", "state_update", "global_step_update")

# optimizer_state: written by the optimizer (slots, Adam's beta powers, Keras'
# iteration count); state: any other non-trainable variable (batch-norm moving
# averages, hyperparameters held in variables).
VariableRole = Literal["trainable", "optimizer_state", "state", "global_step"]
VARIABLE_ROLES: tuple[str, ...] = get_args(VariableRole)

# "half" is the run-time half dtype (float16 by default, bfloat16 or cbfloat16).
HALF = "half"
DTYPES = frozenset({HALF, "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
                    "uint8", "uint16", "uint32", "uint64", "bool"})

# Cost categories (the placement model's flop estimate per category).
Category = Literal["elementwise", "reduce", "matmul", "conv", "pool", "norm", "softmax", "data", "random",
                   "variable", "optimizer", "program"]


def _kinds(category: str, names: str) -> dict[str, str]:
    return {name: category for name in names.split()}


# Every kernel kind a program may contain -> its category. Semantics are TensorFlow's for the op the kind
# was lowered from (see compiler/kernels.py); "to_half" and "gradient_seed" are inserted by the compiler.
KINDS: dict[str, str] = {
    **_kinds("elementwise", """
        abs add add_n band_part bias_add cast ceil clip_by_value cos cumsum div div_no_nan elu elu_grad
        equal erf erfc exp floor floor_div floor_mod greater greater_equal is_finite is_nan leaky_relu
        leaky_relu_grad less less_equal log log1p logical_and logical_not logical_or maximum minimum mul
        mul_no_nan neg not_equal ones_like pow reciprocal reciprocal_grad relu relu6 relu6_grad relu_grad
        round rsqrt rsqrt_grad select selu selu_grad sigmoid sigmoid_grad sign sin softplus softplus_grad
        sqrt sqrt_grad square squared_difference sub tanh tanh_grad zeros_like to_half"""),
    **_kinds("reduce", "all any argmax argmin bias_add_grad l2_loss max mean min prod sum"),
    **_kinds("matmul", "batch_matmul einsum matmul"),
    **_kinds("conv", """conv2d conv2d_backprop_filter conv2d_backprop_input depthwise_conv2d
        depthwise_conv2d_backprop_filter depthwise_conv2d_backprop_input"""),
    **_kinds("pool", "avg_pool avg_pool_grad max_pool max_pool_grad"),
    **_kinds("norm", "fused_batch_norm fused_batch_norm_grad"),
    **_kinds("softmax", "log_softmax softmax softmax_cross_entropy sparse_softmax_cross_entropy"),
    **_kinds("data", """broadcast_to concat expand_dims fill gather one_hot pad range reshape slice split
        split_v squeeze stack strided_slice strided_slice_grad tile transpose unsorted_segment_sum unstack"""),
    **_kinds("random", "random_normal random_uniform truncated_normal"),
    **_kinds("variable", """assign_add_variable assign_sub_variable assign_variable gather_variable
        read_variable scatter_add_variable"""),
    **_kinds("optimizer", """apply_adagrad apply_adagrad_v2 apply_adam apply_gradient_descent
        apply_keras_momentum apply_momentum apply_rms_prop sparse_apply_momentum"""),
    "gradient_seed": "program",
}

# Kinds that write their variable operands (all of them); every other kind with `vars` only reads them.
WRITES = frozenset({
    "assign_variable", "assign_add_variable", "assign_sub_variable", "scatter_add_variable",
    "apply_gradient_descent", "apply_momentum", "apply_keras_momentum", "sparse_apply_momentum", "apply_adam",
    "apply_rms_prop", "apply_adagrad", "apply_adagrad_v2",
})
# Kinds that read variable operands without writing them.
READS_VARIABLES = frozenset({"read_variable", "gather_variable"})
# Kinds that refuse an input TF's CPU kernel refuses (an index or a label out of range) and write nothing: in an
# if-converted tf.cond branch they refuse it only when the branch is taken (Kernel.check_guard). The writing kinds
# that refuse (scatter_add_variable, sparse_apply_momentum) do not run in an untaken branch at all (Kernel.guard).
CHECKS_INPUT = frozenset({"gather", "gather_variable", "unsorted_segment_sum", "sparse_softmax_cross_entropy"})
