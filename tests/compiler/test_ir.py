"""The IR of the zoo models: serialisable, static, lean, ordered, with precision casts and marked roles."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest

from cerebras_tf import CerebrasEstimator, CSRunConfig
from cerebras_tf import ir
from cerebras_tf.compiler import fold
from examples.zoo import MODELS

COMPUTE_KINDS = {"matmul", "batch_matmul", "conv2d", "conv2d_backprop_input", "conv2d_backprop_filter"}
GONE_TF_TYPES = {"Identity", "IdentityN", "NoOp", "StopGradient", "Shape", "ShapeN", "BroadcastGradientArgs",
                 "Const", "VarHandleOp", "ZerosLike", "OnesLike"}


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict[str, ir.Program]:
    compiled = {}
    for name, module in MODELS.items():
        est = CerebrasEstimator(module.model_fn, model_dir=str(tmp_path_factory.mktemp(name)),
                                config=CSRunConfig(cs_ip="localhost:9000", tf_random_seed=7))
        compiled[name] = est.compile(module.input_fn).program
    return compiled


@pytest.fixture(params=["mlp", "cnn", "transformer"])
def program(request, programs) -> ir.Program:
    return programs[request.param]


def test_round_trips_through_json_and_npz(program, tmp_path):
    program.save(str(tmp_path))
    loaded = ir.Program.load(str(tmp_path))
    assert loaded == program
    assert loaded.to_json() == program.to_json()
    assert loaded.arrays.keys() == program.arrays.keys()
    for key, value in program.arrays.items():
        np.testing.assert_array_equal(loaded.arrays[key], value)
        assert loaded.arrays[key].dtype == value.dtype


def test_every_tensor_is_static_and_kernels_run_in_dependency_order(program):
    for tensor in program.tensors:
        assert all(isinstance(d, int) and d >= 0 for d in tensor.shape), tensor
    available = set(program.inputs.values()) | {t.id for t in program.tensors if t.const is not None}
    for kernel in program.kernels:
        assert set(kernel.inputs) <= available, kernel
        available.update(kernel.outputs)
    assert set(program.outputs.values()) <= available


def test_identity_noop_and_shape_math_are_gone(program):
    assert not {k.tf_type for k in program.kernels} & GONE_TF_TYPES
    # tf.cond/tf.case (piecewise_constant) is if-converted: both branches, then a select
    assert all(k.kind == "select" for k in program.kernels if k.tf_type in ("If", "StatelessIf"))


def test_splat_constants_are_never_materialised(program):
    for tensor in program.tensors:
        if tensor.const is not None and tensor.const.splat is not None:
            assert tensor.id not in program.arrays
    for value in program.arrays.values():
        assert fold.as_splat(np.asarray(value)) is None  # a repeated value would have been a splat


def test_precision_casts_feed_every_matmul_and_conv(program):
    producers = {t: k for k in program.kernels for t in k.outputs}
    compute = [k for k in program.kernels if k.kind in COMPUTE_KINDS]
    assert compute
    for kernel in compute:
        assert kernel.attrs["accumulate"] == "float32"
        for tid in kernel.inputs:
            tensor = program.tensors[tid]
            if tensor.dtype != "int32":
                assert tensor.dtype == ir.HALF, (kernel.tf_name, tensor)
                cast = producers[tid]
                assert cast.kind == "to_half" and program.tensors[cast.inputs[0]].dtype == "float32"
        assert all(program.tensors[t].dtype == "float32" for t in kernel.outputs)
    assert all(v.dtype in ("float32", "int64") for v in program.variables)  # weights stay float32


def test_gradient_seed_gradients_and_optimizer_updates_are_marked(program):
    seed = program.kernels[program.gradient_seed]
    assert seed.kind == "gradient_seed" and seed.role == "gradient_seed" and not seed.inputs
    assert program.tensors[seed.outputs[0]].shape == program.tensors[program.outputs["loss"]].shape
    assert program.gradients
    consumers = {t for k in program.kernels if k.role == "optimizer" for t in k.inputs}
    assert set(program.gradients) <= consumers
    writes = [k for k in program.kernels if k.kind.startswith(("apply_", "assign_"))]
    trainable = {v.name for v in program.variables if v.role == "trainable"}
    for kernel in writes:
        if kernel.vars[0] in trainable:
            assert kernel.role == "optimizer", kernel
    assert [k.role for k in program.kernels].count("global_step_update") == 1
    assert program.variable(program.global_step).role == "global_step"


def test_control_order_is_kept(programs):
    cnn = programs["cnn"].kernels
    moving_average = [k.id for k in cnn if k.role == "state_update"]
    updates = [k.id for k in cnn if k.kind == "apply_momentum"]
    step = next(k.id for k in cnn if k.role == "global_step_update")
    assert len(moving_average) == 4 and len(updates) == 10
    assert max(moving_average) < min(updates)  # UPDATE_OPS before minimize, as the control deps say
    assert max(updates) < step
    mlp = programs["mlp"].kernels
    adam = [k.id for k in mlp if k.kind == "apply_adam"]
    beta_powers = [k.id for k in mlp if k.kind == "assign_variable" and k.vars[0].startswith("beta")]
    assert len(beta_powers) == 2 and max(adam) < min(beta_powers)
    # every variable is read for the forward pass before its update writes it
    for program in programs.values():
        for var in (v.name for v in program.variables if v.role == "trainable"):
            reads = [k.id for k in program.kernels if var in k.vars and k.role == "forward"]
            written = [k.id for k in program.kernels if var in k.vars and k.role == "optimizer"]
            assert reads and written and max(reads) < min(written), var


def test_variables_slots_and_state(programs):
    mlp = {v.name: v for v in programs["mlp"].variables}
    assert mlp["dense1/kernel"].role == "trainable" and mlp["dense1/kernel"].shape == [20, 32]
    assert mlp["dense1/kernel/Adam_1"].role == "optimizer_state"
    assert mlp["dense1/kernel/Adam_1"].slot_of == "dense1/kernel"
    assert mlp["beta1_power"].role == "optimizer_state" and mlp["beta1_power"].slot_of is None
    cnn = {v.name: v for v in programs["cnn"].variables}
    assert cnn["bn1/moving_mean"].role == "state" and cnn["conv1/kernel/Momentum"].slot_of == "conv1/kernel"
    bert = {v.name: v for v in programs["transformer"].variables}
    assert bert["layer_0/attention/query/kernel/adam_m"].slot_of == "layer_0/attention/query/kernel"


def test_layers_group_each_kernel_once(program):
    grouped = [k for layer in program.layers for k in layer.kernels]
    assert sorted(grouped) == list(range(len(program.kernels)))
    for layer in program.layers:
        assert all(program.kernels[k].layer == layer.name for k in layer.kernels)


def test_layer_holds_its_forward_and_gradient_kernels(programs):
    dense1 = next(layer for layer in programs["mlp"].layers if layer.name == "dense1")
    kinds = [(programs["mlp"].kernels[k].kind, programs["mlp"].kernels[k].role) for k in dense1.kernels]
    assert ("matmul", "forward") in kinds and ("matmul", "backward") in kinds
    assert ("apply_adam", "optimizer") in kinds
    assert "dense1/kernel" in dense1.variables


def test_dropout_keeps_tf_seeds(programs):
    (dropout,) = [k for k in programs["mlp"].kernels if k.kind == "random_uniform"]
    assert dropout.attrs["seed"] == 7 and isinstance(dropout.attrs["seed2"], int)  # TF's (graph, op) seeds
    assert dropout.location.endswith("examples/zoo/mlp.py:" + str(_line_of(MODELS["mlp"], "layers.dropout(")))
    assert dropout.attrs["dtype"] == "float32"
    assert programs["mlp"].tensors[dropout.outputs[0]].shape == [8, 32]


def _line_of(module, text: str) -> int:
    with open(module.__file__, encoding="utf-8") as f:
        return next(number for number, line in enumerate(f, start=1) if text in line)


def test_ir_and_costs_load_without_tensorflow():
    code = "import sys, cerebras_tf.ir, cerebras_tf.ir.costs; print('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=str(pathlib.Path(__file__).resolve().parents[2]))
    assert result.stdout.strip() == "False"  # an executor can read programs without TF


def test_input_leaves_keys_a_nest_as_program_inputs_in_tf_nest_order():
    import tensorflow as tf

    nest = {"b": np.zeros(2), "a": (np.ones(1), {"z": np.ones(3), "y": [np.ones(4)]})}
    leaves = ir.input_leaves("features", nest)
    assert list(leaves) == ["features/a/0", "features/a/1/y/0", "features/a/1/z", "features/b"]
    assert [leaf.shape for leaf in leaves.values()] == [leaf.shape for leaf in tf.nest.flatten(nest)]  # same order
    single = np.zeros(3)
    assert ir.input_leaves("features", single) == {"features": single}
    assert ir.input_leaves("labels", None) == {}
    tensor = tf.constant([1.0])
    assert ir.input_leaves("labels", {"y": tensor})["labels/y"] is tensor  # TF tensors key the same way
