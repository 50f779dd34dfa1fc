"""A small, well-formed training program built by hand (no compiler, no TensorFlow)."""
from __future__ import annotations

import pytest

from cerebras_tf import ir


def tiny_train_program() -> ir.Program:
    """loss = mean(features @ w); w -= lr * grad; global_step += 1. Every IR field a verifier checks is set."""
    tensors = [
        ir.Tensor(0, [2, 3], "float32", "features"),
        ir.Tensor(1, [3, 1], "float32", "w/read"),
        ir.Tensor(2, [2, 1], "float32", "dense/MatMul"),
        ir.Tensor(3, [], "float32", "loss"),
        ir.Tensor(4, [], "float32", "gradients/Fill"),
        ir.Tensor(5, [3, 1], "float32", "gradients/dense/MatMul_grad"),
        ir.Tensor(6, [], "float32", "lr", const=ir.Const(splat=0.1)),
        ir.Tensor(7, [], "int64", "one", const=ir.Const(splat=1)),
        ir.Tensor(8, [], "float32", "loss_summary"),
    ]
    kernels = [
        ir.Kernel(0, "read_variable", [], [1], {}, vars=["dense/w"], tf_name="dense/w/read"),
        ir.Kernel(1, "matmul", [0, 1], [2], {}, tf_name="dense/MatMul"),
        ir.Kernel(2, "mean", [2], [3], {"axis": [0, 1]}, tf_name="loss"),
        ir.Kernel(3, "gradient_seed", [], [4], {"value": 1.0}, role="gradient_seed", tf_name="gradients/Fill"),
        ir.Kernel(4, "mul", [4, 1], [5], {}, role="backward", tf_name="gradients/dense/MatMul_grad/MatMul"),
        ir.Kernel(5, "apply_gradient_descent", [6, 5], [], {}, role="optimizer", vars=["dense/w"],
                  tf_name="GradientDescent/update_dense/w/ResourceApplyGradientDescent"),
        ir.Kernel(6, "assign_add_variable", [7], [], {}, role="global_step_update", vars=["global_step"],
                  tf_name="GradientDescent"),
        ir.Kernel(7, "abs", [3], [8], {}, tf_name="loss_summary"),
    ]
    variables = [ir.Variable("dense/w", [3, 1], "float32", True, "trainable"),
                 ir.Variable("global_step", [], "int64", False, "global_step")]
    return ir.Program(mode="train", tensors=tensors, kernels=kernels, variables=variables,
                      inputs={"features": 0}, outputs={"loss": 3, "host_call/0": 3, "summary/abs_loss": 8},
                      host_call={"args": [{"tensor": "host_call/0"}]}, gradient_seed=3, gradients=[5],
                      global_step="global_step", summaries={"abs_loss": "scalar", "picture": "image"})


@pytest.fixture
def program() -> ir.Program:
    return tiny_train_program()
