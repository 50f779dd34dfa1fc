"""estimator.runtime's train(), checked against TF computed directly; runs on every supported TensorFlow."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

import runtime_models as models
from estimator import runtime
from estimator.runtime import Estimator, EstimatorSpec, ModeKeys, RunConfig

LR = 0.1
W0 = np.array([[0.5], [-0.25], [1.0]], np.float32)
B0 = np.array([0.1], np.float32)


def _linear_model_fn(features, labels, mode, params):
    w = tf.compat.v1.get_variable("w", initializer=tf.constant(W0))
    b = tf.compat.v1.get_variable("b", initializer=tf.constant(B0))
    predictions = tf.matmul(features, w) + b
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions=predictions)
    loss = tf.reduce_mean(tf.square(predictions - labels))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(LR).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return EstimatorSpec(mode, loss=loss, train_op=train_op)


def _estimator(tmp_path, model_fn=None, **config):
    return Estimator(model_fn or models.dense_model_fn(runtime, layers=False), model_dir=str(tmp_path),
                     config=RunConfig(tf_random_seed=3, **config), params={})


def test_one_step_equals_sgd_computed_with_tf_ops(tmp_path):
    estimator = Estimator(_linear_model_fn, model_dir=str(tmp_path))
    estimator.train(models.input_fn(), steps=1)

    x, y = tf.constant(models.X[:models.BATCH]), tf.constant(models.Y[:models.BATCH])
    w, b = tf.Variable(W0), tf.Variable(B0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
    grad_w, grad_b = tape.gradient(loss, [w, b])
    np.testing.assert_allclose(estimator.get_variable_value("w"), W0 - LR * grad_w.numpy(), rtol=1e-6)
    np.testing.assert_allclose(estimator.get_variable_value("b"), B0 - LR * grad_b.numpy(), rtol=1e-6)
    assert estimator.get_variable_value("global_step") == 1
    assert sorted(estimator.get_variable_names()) == ["b", "global_step", "w"]
    assert estimator.latest_checkpoint() == os.path.join(str(tmp_path), "model.ckpt-1")


def test_steps_add_up_and_max_steps_already_reached_skips(tmp_path):
    estimator = _estimator(tmp_path)
    estimator.train(models.input_fn(), steps=2)
    estimator.train(models.input_fn(), steps=3)
    assert estimator.get_variable_value("global_step") == 5
    recorder = _Recorder()
    with models.tf_log_lines() as log:
        assert estimator.train(models.input_fn(), max_steps=5, hooks=[recorder]) is estimator
    assert "Skipping training since max_steps has already saved." in log
    assert recorder.calls == []
    estimator.train(models.input_fn(), max_steps=7)
    assert estimator.get_variable_value("global_step") == 7


def test_training_stops_when_the_input_ends(tmp_path):
    estimator = _estimator(tmp_path)
    estimator.train(models.input_fn(repeat=False))  # 16 examples, batches of 4
    assert estimator.get_variable_value("global_step") == 4


@pytest.mark.parametrize("kwargs, message", [
    (dict(steps=1, max_steps=2), "Can not provide both steps and max_steps."),
    (dict(steps=0), "Must specify steps > 0, given: 0"),
    (dict(steps=-3), "Must specify steps > 0, given: -3"),
    (dict(max_steps=0), "Must specify max_steps > 0, given: 0"),
])
def test_train_argument_checks(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(") + "$"):
        _estimator(tmp_path).train(models.input_fn(), **kwargs)
    assert not os.listdir(tmp_path)


def test_hooks_and_listeners_must_have_the_right_type(tmp_path):
    estimator = _estimator(tmp_path)
    with pytest.raises(TypeError, match="Hooks must be a SessionRunHook, given: 3"):
        estimator.train(models.input_fn(), steps=1, hooks=[3])
    with pytest.raises(TypeError, match="saving_listeners must be a list of CheckpointSaverListener"):
        estimator.train(models.input_fn(), steps=1, saving_listeners=["x"])


def test_keep_checkpoint_max_and_the_final_checkpoint(tmp_path):
    estimator = _estimator(tmp_path, save_checkpoints_steps=2, keep_checkpoint_max=2)
    estimator.train(models.input_fn(), max_steps=5)
    state = tf.train.get_checkpoint_state(str(tmp_path))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == ["model.ckpt-4", "model.ckpt-5"]
    assert sorted(f for f in os.listdir(tmp_path) if f.startswith("model.ckpt")) == [
        f"model.ckpt-{step}.{ext}" for step in (4, 5) for ext in ("data-00000-of-00001", "index", "meta")]
    assert os.path.exists(tmp_path / "graph.pbtxt")


class _Recorder(tf.compat.v1.train.SessionRunHook):
    """Records every hook call and the loss it asked for."""

    def __init__(self):
        self.calls = []
        self.losses = []

    def begin(self):
        self.calls.append("begin")
        self._loss = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)[-1]

    def after_create_session(self, session, coord):
        self.calls.append("after_create_session")

    def before_run(self, run_context):
        self.calls.append("before_run")
        return tf.compat.v1.train.SessionRunArgs({"loss": self._loss})

    def after_run(self, run_context, run_values):
        self.calls.append("after_run")
        self.losses.append(run_values.results["loss"])

    def end(self, session):
        self.calls.append("end")


class _Listener(tf.compat.v1.train.CheckpointSaverListener):
    def __init__(self):
        self.calls = []

    def begin(self):
        self.calls.append("begin")

    def before_save(self, session, global_step_value):
        self.calls.append(("before_save", int(global_step_value)))

    def after_save(self, session, global_step_value):
        self.calls.append(("after_save", int(global_step_value)))

    def end(self, session, global_step_value):
        self.calls.append(("end", int(global_step_value)))


def test_hooks_listeners_and_spec_hooks_are_called(tmp_path):
    chief_hook, training_hook, user_hook, listener = _Recorder(), _Recorder(), _Recorder(), _Listener()
    base = models.dense_model_fn(runtime, layers=False)

    def model_fn(features, labels, mode, params):
        return base(features, labels, mode, params)._replace(training_hooks=[training_hook],
                                                             training_chief_hooks=[chief_hook])

    estimator = _estimator(tmp_path, model_fn, save_checkpoints_steps=2, log_step_count_steps=1)
    with models.tf_log_lines() as log:
        estimator.train(models.input_fn(), steps=3, hooks=[user_hook], saving_listeners=[listener])
    for hook in (chief_hook, training_hook, user_hook):
        assert hook.calls == ["begin", "after_create_session"] + ["before_run", "after_run"] * 3 + ["end"]
    reported = [float(loss) for loss, _ in models.loss_lines(log)]
    np.testing.assert_allclose(user_hook.losses, reported, rtol=1e-6)  # the loss it asked for is the logged one
    assert len(models.loss_lines(log)) == 3
    assert listener.calls == ["begin", ("before_save", 0), ("after_save", 0), ("before_save", 2),
                              ("after_save", 2), ("before_save", 3), ("after_save", 3), ("end", 3)]


def test_saving_listeners_need_a_checkpoint_saver(tmp_path):
    estimator = _estimator(tmp_path, save_checkpoints_steps=None, save_checkpoints_secs=None)
    with pytest.raises(ValueError, match="There should be a CheckpointSaverHook to use saving_listeners"):
        estimator.train(models.input_fn(), steps=1, saving_listeners=[_Listener()])


def test_summaries_and_log_lines(tmp_path):
    estimator = _estimator(tmp_path, save_summary_steps=2, log_step_count_steps=3)
    with models.tf_log_lines() as log:
        estimator.train(models.input_fn(), max_steps=7)
    models.assert_logged_steps(log, [0, 3, 6])
    assert sum(line.startswith("global_step/sec: ") for line in log) == 2
    assert any(line.startswith("Loss for final step: ") for line in log)
    tags = models.event_tags(str(tmp_path))
    steps = [step for step, _ in tags["loss"]]
    assert steps[0] == 1 and len(steps) in (3, 4)  # [1, 3, 5, 7]; TF's summary hook may shift one under load
    assert len(tags["global_step/sec"]) == 2  # TF's StepCounterHook: every log_step_count_steps after the first


def test_input_fn_results_and_arguments(tmp_path):
    """Datasets of (features, labels), tensors as a pair, and input_fn(mode, params, config)."""
    seen = {}

    def tensors_input_fn(mode, params, config):
        seen.update(mode=mode, params=params, config=config)
        return tf.constant(models.X[:4]), tf.constant(models.Y[:4])

    def model_fn(features, labels, mode, params):
        seen["labels"] = labels
        return _linear_model_fn(features, labels, mode, None)

    estimator = Estimator(model_fn, model_dir=str(tmp_path), params={"a": 1})
    estimator.train(tensors_input_fn, steps=2)
    assert seen["mode"] == ModeKeys.TRAIN and seen["params"] == {"a": 1}
    assert isinstance(seen["config"], RunConfig) and seen["config"].model_dir == str(tmp_path)
    assert seen["labels"].shape.as_list() == [4, 1]


def test_model_fn_without_labels_refuses_an_input_with_labels(tmp_path):
    def model_fn(features, mode):
        raise AssertionError("not called")

    with pytest.raises(ValueError, match="model_fn does not take labels, but input_fn returns labels."):
        Estimator(model_fn, model_dir=str(tmp_path)).train(models.input_fn(), steps=1)


def test_model_fn_must_return_an_estimator_spec(tmp_path):
    with pytest.raises(ValueError, match="model_fn should return an EstimatorSpec."):
        Estimator(lambda features, labels: {"loss": 1}, model_dir=str(tmp_path)).train(models.input_fn(), steps=1)
