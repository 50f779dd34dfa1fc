"""amp.optimizer_step: loss scaling from a model_fn, with the same behaviour on CPU (TF ops) and the simulated WSE."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import glob
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.summaries import read_scalars
from estimator import Estimator, EstimatorSpec, RunConfig, SessionRunHook
import cerebras_tf
from cerebras_tf import CerebrasEstimator, CSRunConfig, amp, set_default_tf_config
from cerebras_tf.run import chief
from cerebras_tf.amp import GradScaler
from cerebras_tf import ir
from cerebras_tf.compiler import initial
from cerebras_tf.compiler.driver import program_hash
from cerebras_tf.input_workers import InputStream
from cerebras_tf.precheck import precheck
from cerebras_tf.wse.executor import Executor
from estimator import ModeKeys

BATCH, STEPS = 4, 12
OVERFLOW_STEPS = (3, 4, 9)  # 1-based steps whose batch holds huge features: the loss and gradients overflow
PATTERN = [step not in OVERFLOW_STEPS for step in range(1, STEPS + 1)]  # finite per step

SCALERS = {
    "dynamic": dict(loss_scale="dynamic", init_scale=2.0 ** 11, steps_per_increase=2,
                    min_loss_scale=2.0 ** 10, max_loss_scale=2.0 ** 11),
    "tolerance": dict(loss_scale="dynamic", init_scale=2.0 ** 10, steps_per_increase=4, overflow_tolerance=0.5,
                      max_loss_scale=2.0 ** 12),
    "static": dict(loss_scale=128.0),
    "none": None,
}


@pytest.fixture(autouse=True)
def _environment(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    set_default_tf_config()
    cerebras_tf.release_system()
    yield
    cerebras_tf.release_system()


def _input_fn(params):
    rng = np.random.RandomState(0)
    x = rng.randn(STEPS * BATCH, 4).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype(np.float32)
    for step in OVERFLOW_STEPS:
        x[(step - 1) * BATCH:step * BATCH] = 1e20
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH, drop_remainder=True)


def _model_fn(features, labels, mode, params):
    init = tf.compat.v1.glorot_uniform_initializer(seed=3)
    hidden = tf.compat.v1.layers.dense(features, 8, activation=tf.nn.relu, kernel_initializer=init, name="hidden")
    predictions = tf.compat.v1.layers.dense(hidden, 1, kernel_initializer=init, name="output")
    loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
    train_op = None
    if mode == ModeKeys.TRAIN:
        scaler = GradScaler(**params["scaler"]) if params["scaler"] is not None else None
        optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
        train_op = amp.optimizer_step(loss, optimizer, scaler, **params.get("clip", {}))
    return EstimatorSpec(mode, loss=loss, train_op=train_op)


class _Recorder(SessionRunHook):
    """Every global variable and the loss-scale state, before the first step and after each step."""

    def begin(self):
        self.variables = {v.op.name: v for v in tf.compat.v1.global_variables() + tf.compat.v1.local_variables()}
        self.states = []

    def after_create_session(self, session, coord):
        self.states.append(session.run(self.variables))

    def after_run(self, run_context, run_values):
        self.states.append(run_context.session.run(self.variables))


def _train_on_cpu(model_dir, params, steps=STEPS):
    estimator = Estimator(_model_fn, model_dir=str(model_dir), params=params,
                          config=RunConfig(tf_random_seed=1, save_summary_steps=1))
    recorder = _Recorder()
    estimator.train(_input_fn, max_steps=steps, hooks=[recorder])
    return estimator, recorder.states


def _cs_estimator(model_dir, params):
    config = CSRunConfig(cs_ip="localhost:9000", tf_random_seed=1, save_checkpoints_steps=100, log_step_count_steps=1)
    return CerebrasEstimator(_model_fn, model_dir=str(model_dir), config=config, params=params)


def _expected_scales(settings, pattern=PATTERN):
    """GradScaler (the numpy spec): the scale used at each step, and the scale after it."""
    scaler = GradScaler.for_optimizer_step(GradScaler(**settings) if settings is not None else None)
    used = []
    for finite in pattern:
        used.append(scaler.scale)
        scaler.update(finite)
    return used, used[1:] + [scaler.scale]


def _checkpointed_scale(state, settings):
    """amp/loss_scale of a CPU state; a static scale (or none) is a constant, not a checkpointed variable."""
    if settings is None or settings["loss_scale"] != "dynamic":
        assert "amp/loss_scale" not in state
        return GradScaler.for_optimizer_step(GradScaler(**settings) if settings is not None else None).scale
    return float(state["amp/loss_scale"])


def _weights_and_slots(state):
    return {name: value for name, value in state.items()
            if name.startswith(("hidden/", "output/")) or name.startswith("beta")}


# ---------------------------------------------------------------------------------------------- CPU/GPU


@pytest.mark.parametrize("name", list(SCALERS))
def test_on_cpu_an_overflow_step_changes_nothing_but_the_step_and_the_scale(tmp_path, name):
    settings = SCALERS[name]
    _, states = _train_on_cpu(tmp_path, {"scaler": settings})
    assert len(states) == STEPS + 1
    _, scale_after = _expected_scales(settings)
    recorded = [_checkpointed_scale(state, settings) for state in states[1:]]
    assert recorded == scale_after
    for step in range(1, STEPS + 1):
        before, after = states[step - 1], states[step]
        assert after["global_step"] == before["global_step"] + 1 == step
        moved = [n for n, v in _weights_and_slots(after).items() if not np.array_equal(v, before[n])]
        if step in OVERFLOW_STEPS:
            assert moved == [], f"step {step} overflowed but changed {moved}"
        else:
            assert {"hidden/kernel", "hidden/kernel/Adam", "output/bias/Adam_1", "beta1_power"} <= set(moved)
        assert all(np.isfinite(v).all() for v in _weights_and_slots(after).values())


def test_on_cpu_the_dynamic_scale_doubles_after_steps_per_increase_and_stays_in_bounds(tmp_path):
    settings = SCALERS["dynamic"]
    _, states = _train_on_cpu(tmp_path, {"scaler": settings})
    scales = [float(state["amp/loss_scale"]) for state in states]
    # 2048 (max): step 2 doubles, clamped to 2048; overflows at 3, 4 halve to 1024, then min 1024 (not 512);
    # 2 finite steps double (6), clamp at max (8); overflow at 9 halves; 2 finite steps double (11).
    assert scales == [2048.0, 2048, 2048, 1024, 1024, 1024, 2048, 2048, 2048, 1024, 1024, 2048, 2048]
    assert all(settings["min_loss_scale"] <= s <= settings["max_loss_scale"] for s in scales)
    assert "loss_scale" in {v.tag for p in glob.glob(str(tmp_path / "events.out.tfevents.*"))
                            for e in tf.compat.v1.train.summary_iterator(p) for v in e.summary.value}


def _one_sgd_step(scaler, **clip):
    """(gradients TF computes for the initial weights, weight change of one optimizer_step with SGD lr=1)."""
    features, labels = next(iter(_input_fn({}).take(1)))
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        spec = _model_fn(tf.constant(features.numpy()), tf.constant(labels.numpy()), ModeKeys.EVAL, {})
        variables = tf.compat.v1.trainable_variables()
        grads = tf.gradients(spec.loss, variables)
        train_op = amp.optimizer_step(spec.loss, tf.compat.v1.train.GradientDescentOptimizer(1.0), scaler, **clip)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            before, raw = session.run([variables, grads])
            session.run(train_op)
            after = session.run(variables)
    return raw, [b - a for b, a in zip(before, after)]


@pytest.mark.parametrize("scaler_norm, norm, expected", [(None, 0.05, 0.05), (0.05, None, 0.05), (0.5, 0.05, 0.05)])
def test_clipping_by_global_norm_matches_tf_clip_by_global_norm(scaler_norm, norm, expected):
    scaler = GradScaler("dynamic", init_scale=2.0 ** 10, max_gradient_norm=scaler_norm)
    raw, change = _one_sgd_step(scaler, max_gradient_norm=norm)
    assert tf.linalg.global_norm(raw).numpy() > 10 * expected  # the clipping is active
    reference, _ = tf.clip_by_global_norm(raw, expected)
    for got, want in zip(change, reference):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-7)


def test_clipping_by_value_matches_tf_clip_by_value():
    raw, change = _one_sgd_step(GradScaler(loss_scale=64.0), max_gradient_value=0.01)
    assert max(np.abs(g).max() for g in raw) > 0.1
    for got, grad in zip(change, raw):
        np.testing.assert_allclose(got, tf.clip_by_value(grad, -0.01, 0.01).numpy(), rtol=1e-5, atol=1e-7)


def test_numpy_grad_scaler_clips_by_value_after_the_norm_like_tf():
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal((5, 3)).astype(np.float32) * 4 for _ in range(2)]
    scaler = GradScaler.for_optimizer_step(GradScaler("dynamic", init_scale=8.0, max_gradient_norm=10.0),
                                           max_gradient_value=0.5)
    result = scaler.unscale_and_check([g * 8 for g in grads])
    reference, _ = tf.clip_by_global_norm(grads, 10.0)
    for got, want in zip(result.grads, reference):
        np.testing.assert_allclose(got, tf.clip_by_value(want, -0.5, 0.5).numpy(), rtol=1e-6)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="mutually exclusive"):
        GradScaler.for_optimizer_step(None, max_gradient_norm=1.0, max_gradient_value=1.0)
    with pytest.raises(ValueError, match="max_gradient_value"):
        GradScaler.for_optimizer_step(None, max_gradient_value=-1.0)
    with pytest.raises(TypeError, match="GradScaler"):
        GradScaler.for_optimizer_step("dynamic")
    with tf.Graph().as_default():
        with pytest.raises(TypeError, match="tf.compat.v1.train.Optimizer"):
            amp.optimizer_step(tf.constant(1.0), object(), None)


def test_config_round_trips_and_amp_stays_tensorflow_free():
    scaler = GradScaler.for_optimizer_step(GradScaler(loss_scale=32.0), max_gradient_norm=2.0)
    assert GradScaler.from_config(scaler.config()).config() == scaler.config()
    assert scaler.max_gradient_norm == 2.0 and not scaler.dynamic  # optimizer_step's clipping: every mode
    code = "import sys, cerebras_tf.amp as a; print('tensorflow' in sys.modules, 'optimizer_step' in a.__all__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]


# ---------------------------------------------------------------------------------------------- simulated WSE


def _compiled(tmp_path, params):
    estimator = _cs_estimator(tmp_path / "model", params)
    model = precheck(estimator, _input_fn, ModeKeys.TRAIN)
    return model, estimator.compile(_input_fn).program


def test_on_the_system_only_a_plain_update_is_compiled_and_the_settings_reach_the_executor(tmp_path):
    params = {"scaler": SCALERS["dynamic"], "clip": {"max_gradient_value": 0.25}}
    model, program = _compiled(tmp_path, params)
    assert not [v for v in program.variables if v.name.startswith("amp/")]
    assert program.loss_scaling == {**GradScaler(**SCALERS["dynamic"]).config(), "max_gradient_value": 0.25}
    assert ir.Program.from_json(program.to_json()).loss_scaling == program.loss_scaling
    scaler = chief.grad_scaler_for(program)
    assert (scaler.scale, scaler.steps_per_increase, scaler.max_gradient_value) == (2048.0, 2, 0.25)
    other = precheck(_cs_estimator(tmp_path / "other", {**params, "clip": {"max_gradient_value": 0.5}}),
                     _input_fn, ModeKeys.TRAIN)
    assert program_hash(other) != program_hash(model)  # a changed loss-scaling config recompiles


def test_on_the_system_an_overflow_step_changes_nothing_but_the_step_and_the_scale(tmp_path):
    amp.set_half_dtype("float32")
    model, program = _compiled(tmp_path, {"scaler": SCALERS["dynamic"]})
    executor = Executor(program, initial.initial_values(model, program),
                        grad_scaler=chief.grad_scaler_for(program))
    used, after = _expected_scales(SCALERS["dynamic"])
    with InputStream.local(_input_fn, {}) as batches:
        for step in range(1, STEPS + 1):
            before = executor.variables()
            result = executor.step(*next(batches))
            now = executor.variables()
            assert result.finite == PATTERN[step - 1] and result.loss_scale == used[step - 1]
            assert executor.grad_scaler.scale == after[step - 1]
            assert executor.global_step == step
            moved = [n for n in _weights_and_slots(now) if not np.array_equal(now[n], before[n])]
            assert (moved == []) == (step in OVERFLOW_STEPS)


@pytest.mark.parametrize("name, clip", [("dynamic", {"max_gradient_norm": 0.5}),
                                        ("tolerance", {"max_gradient_value": 0.2}),
                                        ("none", {})])
def test_the_same_model_fn_trains_the_same_on_cpu_and_on_the_system(tmp_path, name, clip):
    amp.set_half_dtype("float32")
    params = {"scaler": SCALERS[name], "clip": clip}
    cpu, states = _train_on_cpu(tmp_path / "cpu", params)
    system = _cs_estimator(tmp_path / "cs", params)
    system.train(_input_fn, max_steps=STEPS)

    used, _ = _expected_scales(SCALERS[name])
    on_system = read_scalars(str(tmp_path / "cs"), "loss_scale")
    assert [on_system[step] for step in range(1, STEPS + 1)] == used
    assert used == [_checkpointed_scale(s, SCALERS[name]) for s in states[:-1]]  # CPU: the scale before each step
    cpu_final = _weights_and_slots(states[-1])
    assert len(cpu_final) == 14  # 4 weights, 8 Adam slots, 2 beta powers
    for variable, value in cpu_final.items():
        np.testing.assert_allclose(system.get_variable_value(variable), value, rtol=1e-5, atol=1e-7,
                                   err_msg=variable)
    assert system.get_variable_value("global_step") == cpu.get_variable_value("global_step") == STEPS
