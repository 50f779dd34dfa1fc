"""The executor on hand-built IR programs: guarded writes, and what a non-finite step with a GradScaler skips
(one thread in program order, Executor._run_in_order, and the dataflow scheduler's two)."""
from __future__ import annotations

import numpy as np
import pytest

from cerebras_tf.amp import GradScaler
from cerebras_tf import ir
from cerebras_tf.wse.executor import Executor
from cerebras_tf.wse.kernels import KernelInputError


def _tensor(tid: int, dtype: str = "float32", name: str = "", const: ir.Const | None = None) -> ir.Tensor:
    return ir.Tensor(tid, [], dtype, name or f"t{tid}", const)


def _guarded_program() -> ir.Program:
    """v += x, guarded by x > 0; w += x, unguarded; loss = x."""
    tensors = [_tensor(0, name="features"), _tensor(1, const=ir.Const(splat=0.0)), _tensor(2, "bool", "x>0")]
    kernels = [
        ir.Kernel(0, "greater", [0, 1], [2], {}),
        ir.Kernel(1, "assign_add_variable", [0], [], {}, role="state_update", vars=["v"], guard=2),
        ir.Kernel(2, "assign_add_variable", [0], [], {}, role="state_update", vars=["w"]),
    ]
    variables = [ir.Variable(name, [], "float32", False, "state") for name in ("v", "w")]
    return ir.Program(mode="train", tensors=tensors, kernels=kernels, variables=variables,
                      inputs={"features": 0}, outputs={"loss": 0})


@pytest.mark.parametrize("threads", [1, 2], ids=["in-order", "dataflow"])
def test_a_guarded_write_runs_only_when_its_guard_is_true(threads):
    executor = Executor(_guarded_program(), {"v": np.float32(0), "w": np.float32(0)}, threads=threads)
    for x in (2.0, -1.0, 0.5, 0.0):
        executor.step(np.float32(x))
    assert executor.variables() == {"v": 2.5, "w": 1.5}


def test_the_guard_survives_serialisation():
    program = ir.Program.from_json(_guarded_program().to_json())
    assert [k.guard for k in program.kernels] == [None, 2, None]
    executor = Executor(program, {"v": np.float32(1), "w": np.float32(1)})
    executor.step(np.float32(-3.0))
    assert executor.variables() == {"v": 1.0, "w": -2.0}


def test_a_kernel_reading_a_guard_made_by_a_later_phase_is_refused():
    program = _guarded_program()
    program.kernels[0].role = "optimizer"  # the guard is now made in phase 2, after the phase-1 write
    with pytest.raises(ValueError, match="reads tensor 2 produced by an optimizer kernel"):
        Executor(program, {"v": np.float32(0), "w": np.float32(0)})


def _check_guarded_program() -> ir.Program:
    """rows = gather(table, ids), refusing bad ids only when `taken` (labels) is True: a look-up in a tf.cond
    branch, which TF runs only when the branch is taken."""
    tensors = [ir.Tensor(0, [3], "int32", "features"), _tensor(1, "bool", "labels"),
               ir.Tensor(2, [4, 2], "float32", "table", ir.Const()), ir.Tensor(3, [3, 2], "float32", "rows")]
    kernels = [ir.Kernel(0, "gather", [2, 0], [3], {"axis": 0, "batch_dims": 0}, tf_name="cond/Gather",
                         check_guard=1)]
    return ir.Program(mode="infer", tensors=tensors, kernels=kernels, variables=[],
                      inputs={"features": 0, "labels": 1}, outputs={"predictions/rows": 3},
                      arrays={2: np.arange(8, dtype=np.float32).reshape(4, 2)})


@pytest.mark.parametrize("threads", [1, 2], ids=["in-order", "dataflow"])
def test_a_check_guarded_kernel_refuses_bad_ids_only_when_its_guard_is_true(threads):
    program = ir.Program.from_json(_check_guarded_program().to_json(), _check_guarded_program().arrays)
    assert program.kernels[0].check_guard == 1 and program.kernels[0].reads == [2, 0, 1]
    executor = Executor(program, {}, threads=threads)
    ids = np.array([3, 9, 0], np.int32)
    rows = executor.step(ids, np.bool_(False)).outputs["predictions/rows"]  # not taken: clamped, discarded
    np.testing.assert_array_equal(rows, [[6, 7], [6, 7], [0, 1]])
    with pytest.raises(KernelInputError, match=r"^indices\[1\] = 9 is not in \[0, 4\)$") as info:
        executor.step(ids, np.bool_(True))
    assert info.value.kernel.tf_name == "cond/Gather"
    good = np.array([3, 1, 0], np.int32)
    for taken in (True, False):
        np.testing.assert_array_equal(executor.step(good, np.bool_(taken)).outputs["predictions/rows"],
                                      [[6, 7], [2, 3], [0, 1]])


def _scaled_program() -> ir.Program:
    """loss = v * x; the gradient g = seed * x; an optimizer-role |g| streamed out; v -= g."""
    tensors = [_tensor(0, name="features"), _tensor(1, name="v"), _tensor(2, name="loss"), _tensor(3, name="seed"),
               _tensor(4, name="grad"), _tensor(5, name="grad_norm")]
    kernels = [
        ir.Kernel(0, "read_variable", [], [1], {}, vars=["v"]),
        ir.Kernel(1, "mul", [1, 0], [2], {}),
        ir.Kernel(2, "gradient_seed", [], [3], {"value": 1.0}, role="gradient_seed"),
        ir.Kernel(3, "mul", [3, 0], [4], {}, role="backward"),
        ir.Kernel(4, "abs", [4], [5], {}, role="optimizer"),
        ir.Kernel(5, "assign_sub_variable", [4], [], {}, role="optimizer", vars=["v"]),
    ]
    return ir.Program(mode="train", tensors=tensors, kernels=kernels,
                      variables=[ir.Variable("v", [], "float32", True, "trainable")], inputs={"features": 0},
                      outputs={"loss": 2, "host_call/0": 5}, host_call={"args": [{"tensor": "host_call/0"}]},
                      gradient_seed=2, gradients=[4])


@pytest.mark.parametrize("threads", [1, 2], ids=["in-order", "dataflow"])
def test_a_non_finite_step_skips_only_the_writes_and_every_output_exists(threads):
    scaler = GradScaler(loss_scale="dynamic", init_scale=8.0)
    executor = Executor(_scaled_program(), {"v": np.float32(1)}, grad_scaler=scaler, threads=threads)
    result = executor.step(np.float32(2.0))
    assert result.finite and float(result.outputs["host_call/0"]) == 2.0  # unscaled
    assert executor.variables()["v"] == -1.0
    result = executor.step(np.float32(np.inf))
    assert not result.finite and scaler.scale == 4.0
    assert executor.variables()["v"] == -1.0  # the write was skipped...
    assert np.isinf(result.outputs["host_call/0"])  # ...but the gradient norm kernel ran


def _matmul_gradient_program(view_in_first_phase: bool) -> ir.Program:
    """loss = sum(x @ v); its gradient g = x^T @ seed (a new array each step); v -= g. With
    `view_in_first_phase`, a backward-role reshape of g is streamed out: a view of g's array."""
    tensors = [ir.Tensor(0, [2, 3], "float32", "features"), ir.Tensor(1, [3, 4], "float32", "v"),
               ir.Tensor(2, [2, 4], "float32", "y"), ir.Tensor(3, [], "float32", "loss"),
               ir.Tensor(4, [2, 4], "float32", "seed"), ir.Tensor(5, [3, 4], "float32", "grad"),
               ir.Tensor(6, [12], "float32", "grad_view")]
    matmul = {"transpose_a": False, "transpose_b": False}
    kernels = [
        ir.Kernel(0, "read_variable", [], [1], {}, vars=["v"]),
        ir.Kernel(1, "matmul", [0, 1], [2], matmul),
        ir.Kernel(2, "sum", [2], [3], {"axis": None}),
        ir.Kernel(3, "gradient_seed", [], [4], {"value": 1.0}, role="gradient_seed"),
        ir.Kernel(4, "matmul", [0, 4], [5], {**matmul, "transpose_a": True}, role="backward"),
        ir.Kernel(5, "reshape", [5], [6], {"shape": [12]}, role="backward"),
        ir.Kernel(6, "assign_sub_variable", [5], [], {}, role="optimizer", vars=["v"]),
    ]
    outputs = {"loss": 3}
    if view_in_first_phase:
        outputs["host_call/0"] = 6
    else:
        del kernels[5], tensors[6]
        kernels[5].id = 5
    return ir.Program(mode="train", tensors=tensors, kernels=kernels,
                      variables=[ir.Variable("v", [3, 4], "float32", True, "trainable")], inputs={"features": 0},
                      outputs=outputs, host_call={"args": [{"tensor": "host_call/0"}]} if view_in_first_phase else None,
                      gradient_seed=3, gradients=[5])


@pytest.mark.parametrize("view_in_first_phase", [False, True])
def test_a_gradient_is_unscaled_in_its_own_array_only_when_no_view_of_it_was_made(view_in_first_phase):
    """The loss scale's unscaling writes into a gradient's array when the step owns it outright
    (Executor._owned_gradients); not when a kernel of the forward/backward phase read it (here a reshape
    streamed out, which shows the scaled gradient either way)."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    v = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    scaler = GradScaler(loss_scale="dynamic", init_scale=2.0**10)
    executor = Executor(_matmul_gradient_program(view_in_first_phase), {"v": v}, grad_scaler=scaler)
    assert (5 in executor._unscale_in_place) != view_in_first_phase
    result = executor.step(x)
    scaled = x.T @ np.full((2, 4), 2.0**10, np.float32)
    np.testing.assert_array_equal(executor.variables()["v"], v - scaled * np.float32(2.0**-10))
    if view_in_first_phase:
        np.testing.assert_array_equal(result.outputs["host_call/0"], scaled.reshape(-1))
