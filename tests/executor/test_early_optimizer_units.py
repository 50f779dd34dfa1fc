"""The optimizer phase's units that write nothing run in the first phase, with the gradients' unscaling
(Executor._early_layout): when they may, and that they leave every tensor to its last reader."""
from __future__ import annotations

import numpy as np
import pytest

from cerebras_tf import ir
from cerebras_tf.amp import GradScaler
from cerebras_tf.wse.chains import use_chains
from cerebras_tf.wse.executor import Executor


def _vector(tid: int, name: str) -> ir.Tensor:
    return ir.Tensor(tid, [4], "float32", name)


def _program(gradient_read_forward: bool = False) -> ir.Program:
    """loss = sum(v * x); g = seed * x; n = -x (forward, read only by the optimizer phase). The optimizer phase:
    v -= n (a write: stays after the barrier), then sum(n) and |g| streamed out (write nothing: run early).
    The write is n's first reader in program order, the sum its last. With `gradient_read_forward`, a
    backward-role kernel streams out g + g too."""
    tensors = [_vector(0, "features"), _vector(1, "v"), _vector(2, "product"), ir.Tensor(3, [], "float32", "loss"),
               _vector(4, "seed"), _vector(5, "grad"), _vector(6, "n"), _vector(7, "unused"),
               ir.Tensor(8, [], "float32", "n_sum"), _vector(9, "grad_abs")]
    kernels = [
        ir.Kernel(0, "read_variable", [], [1], {}, vars=["v"]),
        ir.Kernel(1, "mul", [1, 0], [2], {}),
        ir.Kernel(2, "sum", [2], [3], {"axis": None}),
        ir.Kernel(3, "neg", [0], [6], {}),
        ir.Kernel(4, "gradient_seed", [], [4], {"value": 1.0}, role="gradient_seed"),
        ir.Kernel(5, "mul", [4, 0], [5], {}, role="backward"),
        ir.Kernel(6, "assign_sub_variable", [6], [], {}, role="optimizer", vars=["v"]),
        ir.Kernel(7, "sum", [6], [8], {"axis": None}, role="optimizer"),
        ir.Kernel(8, "abs", [5], [9], {}, role="optimizer"),
    ]
    outputs = {"loss": 3, "host_call/0": 8, "host_call/1": 9}
    if gradient_read_forward:
        tensors.append(_vector(10, "grad_twice"))
        kernels.insert(6, ir.Kernel(6, "add", [5, 5], [10], {}, role="backward"))
        outputs["host_call/2"] = 10
        for index, kernel in enumerate(kernels):
            kernel.id = index
    return ir.Program(mode="train", tensors=tensors, kernels=kernels,
                      variables=[ir.Variable("v", [4], "float32", True, "trainable")], inputs={"features": 0},
                      outputs=outputs, host_call={"args": [{"tensor": key} for key in outputs if key != "loss"]},
                      gradient_seed=4, gradients=[5])


def _unit_kinds(plan) -> list[str]:
    return [p.kernel.kind for p in plan]


@pytest.mark.parametrize("threads", [1, 2])
def test_units_that_write_nothing_run_early_and_a_tensor_waits_for_its_last_reader(threads):
    """The sum and abs run in the first phase, beside the unscaling; n, which the write after the barrier reads
    too, is not dropped in the first phase though the sum, its last reader in program order, runs there. The
    steps are those of the layout that unscales between the phases, bit for bit."""
    x = np.array([0.5, -1.25, 3.0, 0.1], np.float32)
    v = np.array([1.0, 2.0, -3.0, 0.25], np.float32)
    runs = []
    for early in (True, False):
        executor = Executor(_program(), {"v": v}, grad_scaler=GradScaler(loss_scale="dynamic", init_scale=2.0**10),
                            threads=threads)
        layout = executor._step_layout
        if early:
            assert layout.unscaled_early
            assert _unit_kinds(layout.plans[0])[-3:] == ["unscale", "sum", "abs"]
            assert _unit_kinds(layout.plans[1]) == ["assign_sub_variable"]
        else:
            executor._step_layout = executor._systems_layout
        results = [executor.step(x) for _ in range(3)]
        runs.append((results, executor.variables()["v"]))
    (results, variables), (reference, reference_variables) = runs
    for got, expected in zip(results, reference):
        assert got.finite and got.outputs.keys() == expected.outputs.keys()
        for key in expected.outputs:
            np.testing.assert_array_equal(got.outputs[key], expected.outputs[key])
    np.testing.assert_array_equal(variables, reference_variables)
    np.testing.assert_array_equal(results[0].outputs["host_call/1"], np.abs(x))  # unscaled
    np.testing.assert_array_equal(variables, v + x + x + x)


def test_a_non_finite_gradient_found_early_skips_the_write_and_halves_the_scale():
    scaler = GradScaler(loss_scale="dynamic", init_scale=8.0)
    v = np.ones(4, np.float32)
    executor = Executor(_program(), {"v": v}, grad_scaler=scaler)
    assert executor._step_layout.unscaled_early
    result = executor.step(np.array([1.0, np.inf, 0.0, 2.0], np.float32))
    assert not result.finite and scaler.scale == 4.0
    np.testing.assert_array_equal(executor.variables()["v"], v)
    assert np.isinf(result.outputs["host_call/1"][1])  # the early units ran on the step's gradient


def test_nothing_runs_early_where_every_gradient_must_exist_first():
    """A GradScaler that clips (by the gradients' global norm), or a gradient a unit of the first phase reads
    (here with chains off: as a chain's member the add would read the gradient inside the loop that makes it):
    the optimizer phase runs after the barrier, whole. Without a GradScaler the units that write nothing still
    run early (nothing to unscale)."""
    clipping = GradScaler(loss_scale="dynamic", max_gradient_norm=1.0)
    for program, scaler in ((_program(), clipping), (_program(gradient_read_forward=True), GradScaler())):
        with use_chains(False):
            executor = Executor(program, {"v": np.ones(4, np.float32)}, grad_scaler=scaler)
        assert executor._step_layout is executor._systems_layout
        assert len(executor._step_layout.plans[1]) == 3
    executor = Executor(_program(), {"v": np.ones(4, np.float32)})
    layout = executor._step_layout
    assert not layout.unscaled_early and _unit_kinds(layout.plans[0])[-2:] == ["sum", "abs"]
    executor.step(np.ones(4, np.float32))
    np.testing.assert_array_equal(executor.variables()["v"], [2, 2, 2, 2])  # v -= -1
