"""A kernel writes its result into an input (a to_half rounds in place) only where nobody else can see that
array: the executor's donated inputs, on hand-built programs."""
from __future__ import annotations

import numpy as np

from cerebras_tf import ir
from cerebras_tf.amp import round_to_half
from cerebras_tf.wse.executor import Executor

X = np.array([1.0001, -3.14159, 70000.0], np.float32)  # none is a float16 value


def _program(extra: list[ir.Kernel], outputs: dict[str, int], view_first: bool = False) -> ir.Program:
    """t1 = x * x (a fresh array); t2 = to_half(t1); then `extra` kernels (ids from 2; tensors 3 and 4 are
    theirs), or with `view_first` t3 = reshape(t1) before the to_half and t4 = t3 + x after it."""
    tensors = [ir.Tensor(i, [3], "float32", f"t{i}") for i in range(5)]
    if view_first:
        kernels = [ir.Kernel(0, "mul", [0, 0], [1], {}), ir.Kernel(1, "reshape", [1], [3], {"shape": [3]}),
                   ir.Kernel(2, "to_half", [1], [2], {}), ir.Kernel(3, "add", [3, 0], [4], {})]
    else:
        kernels = [ir.Kernel(0, "mul", [0, 0], [1], {}), ir.Kernel(1, "to_half", [1], [2], {}), *extra]
    return ir.Program(mode="eval", tensors=tensors, kernels=kernels, variables=[], inputs={"features": 0},
                      outputs=outputs)


def _run(program: ir.Program, x: np.ndarray) -> tuple[Executor, dict[str, np.ndarray]]:
    executor = Executor(program, {}, half_dtype="float16")
    return executor, executor.step(x).outputs


def test_the_last_reader_of_a_fresh_array_rounds_it_in_place():
    executor, out = _run(_program([], {"loss": 2}), X.copy())
    assert executor._donations == {1: {0}}
    np.testing.assert_array_equal(out["loss"], round_to_half(X * X, "float16"))


def test_an_array_read_after_the_to_half_is_not_rounded_in_place():
    executor, out = _run(_program([ir.Kernel(2, "add", [1, 0], [3], {})], {"loss": 2, "predictions/other": 3}),
                         X.copy())
    assert not any(k.kind == "to_half" for k in executor.program.kernels if k.id in executor._donations)
    np.testing.assert_array_equal(out["predictions/other"], X * X + X)  # the unrounded values
    np.testing.assert_array_equal(out["loss"], round_to_half(X * X, "float16"))


def test_an_array_viewed_by_another_tensor_is_not_rounded_in_place():
    executor, out = _run(_program([], {"loss": 2, "predictions/other": 4}, view_first=True), X.copy())
    assert not any(k.kind == "to_half" for k in executor.program.kernels if k.id in executor._donations)
    np.testing.assert_array_equal(out["predictions/other"], X * X + X)  # read through the view, unrounded


def test_a_streamed_out_array_and_the_callers_batch_are_never_rounded_in_place():
    program = _program([ir.Kernel(2, "to_half", [0], [3], {})],
                       {"loss": 2, "predictions/square": 1, "predictions/x": 3})
    x = X.copy()
    executor, out = _run(program, x)
    assert not any(k.kind == "to_half" for k in executor.program.kernels if k.id in executor._donations)
    np.testing.assert_array_equal(out["predictions/square"], X * X)
    np.testing.assert_array_equal(x, X)  # the batch the caller handed in
    np.testing.assert_array_equal(out["predictions/x"], round_to_half(X, "float16"))


def test_relu_relu_grad_and_bias_add_write_into_a_donated_input_and_give_the_same_values(monkeypatch):
    """x -> mul (fresh) -> bias_add -> relu -> relu_grad(g = mul, f = relu output): every result lands in a
    donated array; the values are those of a run that donates nothing."""
    tensors = [ir.Tensor(i, [3], "float32", f"t{i}") for i in range(7)]
    kernels = [ir.Kernel(0, "mul", [0, 0], [1], {}), ir.Kernel(1, "bias_add", [1, 0], [2], {}),
               ir.Kernel(2, "relu", [2], [3], {}), ir.Kernel(3, "mul", [0, 0], [4], {}),
               ir.Kernel(4, "relu_grad", [4, 3], [5], {})]
    program = ir.Program(mode="eval", tensors=tensors, kernels=kernels, variables=[], inputs={"features": 0},
                         outputs={"loss": 5})
    x = np.array([1.5, -2.0, 0.25], np.float32)
    executor = Executor(program, {}, half_dtype="float32")
    assert executor._donations == {1: {0}, 2: {0}, 4: {0, 1}}
    got = executor.step(x.copy()).outputs["loss"]
    np.testing.assert_array_equal(got, np.where(np.maximum(x * x + x, 0) > 0, x * x, 0))
    monkeypatch.setattr(Executor, "_donated_inputs", lambda self: {})
    np.testing.assert_array_equal(Executor(program, {}, half_dtype="float32").step(x.copy()).outputs["loss"], got)
