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


def program_with_checks() -> ir.Program:
    """The tiny program plus an assertion (condition: a constant True) showing the loss, and a print of it."""
    program = tiny_train_program()
    program.tensors.append(ir.Tensor(9, [], "bool", "holds", const=ir.Const(splat=True)))
    program.outputs.update({"assert/0/condition": 9, "assert/0/data/1": 3, "print/0/data/1": 3})
    program.assertions = [{"name": "Assert/AssertGuard/Assert", "location": "model.py:3", "summarize": 3,
                           "condition": "assert/0/condition",
                           "data": [{"constant": "loss is", "dtype": "string", "shape": []},
                                    {"output": "assert/0/data/1", "dtype": "float32"},
                                    {"constant": [[1, 2]], "dtype": "int32", "shape": [1, 2]}]}]
    program.prints = [{"name": "PrintV2", "location": None, "style": "v2", "summarize": 3, "output_stream": "stderr",
                       "end": "\n", "first_n": -1, "when": None, "after": [0],
                       "pieces": [{"text": "loss "}, {"output": "print/0/data/1", "dtype": "float32"}]}]
    return program


@pytest.fixture
def program() -> ir.Program:
    return tiny_train_program()
