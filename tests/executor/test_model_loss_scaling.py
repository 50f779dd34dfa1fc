"""A model that does its own loss scaling (the Model Zoo's TF loss-scale optimizer) trains on the simulated WSE
as on TensorFlow.

`tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer` applies the update inside
`tf.cond(grads are finite, apply + global_step += 1, no_op)` and updates its scale variables: with TF's
`DynamicLossScale` in a (nested) tf.cond, with a CS-style dynamic scale by arithmetic and assigns. The
compiler if-converts these conds with guarded writes, the executor adds no loss scaling of its own, and
every variable (weights, the model's scale and counters, global_step) follows TF exactly in float32
numerics, including on a step whose gradients overflow.
"""
from __future__ import annotations

import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from estimator import Estimator, EstimatorSpec, RunConfig
from cerebras_tf import CerebrasEstimator, CSRunConfig, amp, set_default_tf_config
from cerebras_tf.run import chief
from cerebras_tf.compiler import initial
from cerebras_tf.precheck import precheck
from cerebras_tf.wse.executor import Executor
from estimator import ModeKeys

BATCH = 4
NUM_BATCHES = 10  # one epoch; the input repeats
OVERFLOW_BATCH = 3  # its labels are 1e37: the loss is inf and the scaled gradients are not finite
STEPS = 20


class CSStyleDynamicLossScale(tf.compat.v1.mixed_precision.DynamicLossScale):
    """A dynamic loss scale in the CS system's style: no tf.cond in update(), only arithmetic and assigns.

    The scale halves on a step whose gradients' global norm is not finite (beyond `overflow_tolerance` of the
    steps since the last rescale) and doubles after `increment_period` steps without a rescale; the counters
    restart at each rescale.
    """

    def __init__(self, initial_loss_scale, increment_period, overflow_tolerance=0.0,
                 min_loss_scale=1.0, max_loss_scale=2.0 ** 20):
        super().__init__(initial_loss_scale=initial_loss_scale, increment_period=increment_period, multiplier=2.0)
        self._steps = self._add_weight(name="steps_since_rescale", initial_value=0, dtype=tf.int64)
        self._overflows = self._add_weight(name="overflows_since_rescale", initial_value=0, dtype=tf.int64)
        self._tolerance = overflow_tolerance
        self._bounds = (min_loss_scale, max_loss_scale)

    def update(self, grads):
        finite = tf.math.is_finite(tf.linalg.global_norm([g for g in grads if g is not None]))
        steps = self._steps.assign_add(1)
        overflows = self._overflows.assign_add(1 - tf.cast(finite, tf.int64))
        lower = tf.cast(overflows, tf.float32) / tf.cast(steps, tf.float32) > self._tolerance
        higher = tf.logical_and(tf.logical_not(lower), steps >= self.increment_period)
        factor = tf.where(lower, 0.5, tf.where(higher, 2.0, 1.0))
        scale = tf.clip_by_value(self._current_loss_scale * factor, *self._bounds)
        keep = 1 - tf.cast(tf.logical_or(lower, higher), tf.int64)
        updates = [self._current_loss_scale.assign(scale), self._steps.assign(steps * keep),
                   self._overflows.assign(overflows * keep)]
        return tf.group(*updates), finite


# loss scale -> (the variables it uses, how to build it). The CS-style scale inherits DynamicLossScale's
# good_steps but never uses it: it is no program variable, but the CS checkpoint still holds it (unchanged), as
# tf.estimator's does, so CPU training can resume from it.
SCALES = {
    "tf_dynamic": (["current_loss_scale", "good_steps"],
                   lambda: tf.compat.v1.mixed_precision.DynamicLossScale(initial_loss_scale=2.0 ** 8,
                                                                         increment_period=4)),
    "cs_dynamic": (["current_loss_scale", "steps_since_rescale", "overflows_since_rescale"],
                   lambda: CSStyleDynamicLossScale(initial_loss_scale=2.0 ** 8, increment_period=4)),
}


def _input_fn(params):
    """NUM_BATCHES fixed batches, unshuffled, repeating; batch OVERFLOW_BATCH overflows."""
    rng = np.random.RandomState(3)
    x = rng.randn(NUM_BATCHES * BATCH, 3).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.3).astype(np.float32)
    y[OVERFLOW_BATCH * BATCH:(OVERFLOW_BATCH + 1) * BATCH] = 1e37
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH, drop_remainder=True)


def _model_fn(features, labels, mode, params):
    """MLP 3-8-1 (seeded initializers), MSE, momentum in TF's loss-scale optimizer, lr decaying with global_step."""
    hidden = tf.compat.v1.layers.dense(features, 8, activation=tf.nn.tanh, name="hidden",
                                       kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=5))
    predictions = tf.compat.v1.layers.dense(hidden, 1, name="output",
                                            kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=6))
    loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
    train_op = None
    if mode == ModeKeys.TRAIN:
        step = tf.compat.v1.train.get_global_step()
        learning_rate = tf.compat.v1.train.exponential_decay(0.05, step, 5, 0.8)
        optimizer = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
            tf.compat.v1.train.MomentumOptimizer(learning_rate, 0.9), SCALES[params["scale"]][1]())
        train_op = optimizer.minimize(loss, global_step=step)
    return EstimatorSpec(mode, loss=loss, train_op=train_op, predictions=predictions)


@pytest.fixture(autouse=True)
def _float32_numerics(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    set_default_tf_config()
    previous = amp.get_half_dtype()
    amp.set_half_dtype("float32")
    yield
    amp.set_half_dtype(previous)


def _cs_estimator(model_dir, scale, **config):
    return CerebrasEstimator(_model_fn, model_dir=str(model_dir), params={"scale": scale},
                             config=CSRunConfig(cs_ip="localhost:9000", tf_random_seed=1, **config))


def _checkpoint(model_dir) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def _tensorflow_steps(model, batches: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[dict[str, np.ndarray]]]:
    """Run the captured graph itself in TF: the batches it drew and every variable after each step."""
    graph = model.graph
    with graph.as_default():
        iterator_init = [op for op in graph.get_operations() if op.type == "MakeIterator"]
        variables = tf.compat.v1.global_variables()
        names = [v.op.name for v in variables]
        with tf.compat.v1.Session(graph=graph) as session:
            session.run([tf.compat.v1.global_variables_initializer(), iterator_init])
            drawn, after = [], []
            for _ in range(batches):
                features, labels, _ = session.run([model.features, model.labels, model.spec.train_op])
                drawn.append((features, labels))
                after.append(dict(zip(names, session.run(variables))))
    return drawn, after


@pytest.mark.parametrize("scale", sorted(SCALES))
def test_the_model_loss_scale_follows_tensorflow_step_by_step(tmp_path, scale):
    estimator = _cs_estimator(tmp_path / "model", scale)
    model = precheck(estimator, _input_fn, ModeKeys.TRAIN)
    program = estimator.compile(_input_fn, validate_only=True).program
    assert program.model_loss_scaling and program.loss_scaling is None
    assert chief.grad_scaler_for(program) is None  # no loss scaling of the executor's own on top
    guarded = [k for k in program.kernels if k.guard is not None]
    assert {k.kind for k in guarded} >= {"apply_momentum", "assign_add_variable"}
    assert next(k for k in guarded if k.vars == [program.global_step]).role == "global_step_update"

    batches, tf_after = _tensorflow_steps(model, 2 * NUM_BATCHES)
    executor = Executor(program, initial.initial_values(model, program))
    before = executor.variables()
    scale_variables = SCALES[scale][0]
    for index, ((features, labels), expected) in enumerate(zip(batches, tf_after)):
        executor.step(features, labels)
        after = executor.variables()
        assert set(after) == set(expected) - ({"good_steps"} if scale == "cs_dynamic" else set())
        for name, value in after.items():
            np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-5, err_msg=f"{name} after {index}")
        if index % NUM_BATCHES == OVERFLOW_BATCH:  # no weight moves, global_step stays, the scale halves
            for name in set(after) - set(scale_variables):
                np.testing.assert_array_equal(after[name], before[name], err_msg=name)
            assert after["current_loss_scale"] == before["current_loss_scale"] / 2
        else:
            assert after["global_step"] == before["global_step"] + 1
        before = after
    assert executor.global_step == 2 * NUM_BATCHES - 2  # two overflow steps
    assert len({float(v["current_loss_scale"]) for v in tf_after}) > 2  # the scale went down and up again


@pytest.mark.parametrize("scale", sorted(SCALES))
def test_training_with_the_model_loss_scale_matches_the_estimator(tmp_path, scale, caplog):
    cs_dir, cpu_dir = tmp_path / "cs", tmp_path / "cpu"
    with caplog.at_level(logging.INFO):
        _cs_estimator(cs_dir, scale, save_checkpoints_steps=100).train(_input_fn, max_steps=STEPS, use_cs=True)
    assert "does its own loss scaling" in caplog.text
    cpu = Estimator(_model_fn, model_dir=str(cpu_dir), params={"scale": scale},
                    config=RunConfig(tf_random_seed=1))
    cpu.train(_input_fn, max_steps=STEPS)

    cs_final, cpu_final = _checkpoint(cs_dir), _checkpoint(cpu_dir)
    # the model's scale variables (and the unused good_steps), no amp/ state of the executor's own
    assert set(cs_final) == set(cpu_final)
    assert set(SCALES[scale][0]) <= set(cs_final)
    assert cs_final["global_step"] == STEPS
    for name, value in cs_final.items():
        np.testing.assert_allclose(value, cpu_final[name], rtol=1e-5, atol=1e-5, err_msg=name)

    def eval_input_fn(params):
        return _input_fn(params).take(OVERFLOW_BATCH)

    evaluated = Estimator(_model_fn, model_dir=str(cs_dir), params={"scale": scale}).evaluate(
        eval_input_fn)
    reference = cpu.evaluate(eval_input_fn)
    assert evaluated["global_step"] == STEPS
    np.testing.assert_allclose(evaluated["loss"], reference["loss"], rtol=1e-5)
