"""train(use_cs=True) runs on the simulated WSE and writes checkpoints plain TF reads."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import glob

import numpy as np
import pytest
import tensorflow as tf

from estimator import Estimator
import cerebras_tf
from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig, set_default_tf_config
from cerebras_tf.run import chief
from test_executor import _input_fn, _model_fn  # the same small MLP as the executor tests


@pytest.fixture(autouse=True)
def _tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    set_default_tf_config()


def _estimator(model_dir, **config):
    config.setdefault("save_checkpoints_steps", 100)
    return CerebrasEstimator(_model_fn, model_dir=str(model_dir),
                             config=CSRunConfig(cs_ip="localhost:9000", tf_random_seed=1, **config), params={})


def test_training_on_the_system_learns_and_plain_tensorflow_reads_the_checkpoint(tmp_path):
    estimator = _estimator(tmp_path)
    estimator.train(_input_fn, max_steps=150)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-150")
    assert os.path.exists(tmp_path / "model.ckpt-100.index")  # save_checkpoints_steps

    plain = Estimator(_model_fn, model_dir=str(tmp_path), params={})
    before = CerebrasEstimator(_model_fn, model_dir=str(tmp_path / "untrained"), params={})
    before.train(_input_fn, max_steps=1)
    metrics = plain.evaluate(_input_fn, steps=4)
    untrained = before.evaluate(_input_fn, steps=4)
    assert metrics["global_step"] == 150
    assert metrics["loss"] < 0.7 * untrained["loss"]
    names = set(plain.get_variable_names())
    assert {"fc1/kernel", "fc1/kernel/Adam", "fc1/kernel/Adam_1", "beta1_power", "global_step"} <= names
    events = glob.glob(str(tmp_path / "events.out.tfevents.*"))
    tags = {value.tag for path in events for event in tf.compat.v1.train.summary_iterator(path)
            for value in event.summary.value}
    assert {"loss", "loss_scale", "global_step/sec", "samples/sec"} <= tags


def test_training_resumes_from_the_latest_checkpoint(tmp_path):
    estimator = _estimator(tmp_path)
    estimator.train(_input_fn, max_steps=20)
    at_20 = {name: estimator.get_variable_value(name) for name in estimator.get_variable_names()}
    estimator.train(_input_fn, steps=10)
    assert estimator.get_variable_value("global_step") == 30
    moved = [name for name in at_20 if not np.array_equal(at_20[name], estimator.get_variable_value(name))]
    assert "fc1/kernel" in moved  # continued from step 20's weights, not from scratch
    estimator.train(_input_fn, max_steps=30)  # already there: nothing to do
    assert estimator.get_variable_value("global_step") == 30


def test_keep_checkpoint_max_is_honoured(tmp_path):
    _estimator(tmp_path, keep_checkpoint_max=2).train(_input_fn, max_steps=400)
    kept = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "model.ckpt-*.index")))
    assert kept == ["model.ckpt-300.index", "model.ckpt-400.index"]


def test_warm_start_from_a_checkpoint_copies_the_trainable_weights(tmp_path, monkeypatch):
    source = _estimator(tmp_path / "source")
    source.train(_input_fn, max_steps=20)
    warm = CerebrasEstimator(_model_fn, model_dir=str(tmp_path / "warm"), warm_start_from=str(tmp_path / "source"),
                             config=CSRunConfig(cs_ip="localhost:9000", tf_random_seed=1,
                                                save_checkpoints_steps=100), params={})
    spy = {}
    original = chief.warm_start_values

    def recording(settings, program):
        spy.update(original(settings, program))
        return spy

    monkeypatch.setattr(chief, "warm_start_values", recording)
    warm.train(_input_fn, max_steps=1)
    assert set(spy) == {"fc1/kernel", "fc1/bias", "fc2/kernel", "fc2/bias", "logits/kernel", "logits/bias"}
    np.testing.assert_array_equal(spy["fc1/kernel"], source.get_variable_value("fc1/kernel"))
    assert warm.get_variable_value("global_step") == 1  # the step counter is not warm-started


def test_evaluate_on_the_system_computes_host_call_metrics_like_the_estimator(tmp_path):
    def model_fn(features, labels, mode, params):
        spec = _model_fn(features, labels, mode, params)
        logits = tf.compat.v1.get_default_graph().get_tensor_by_name("logits/BiasAdd:0")
        metric = lambda l, y: {"accuracy": tf.compat.v1.metrics.accuracy(y, tf.argmax(l, 1))}  # noqa: E731
        return CSEstimatorSpec(mode, loss=spec.loss, train_op=spec.train_op, host_call=(metric, [logits, labels]))

    config = CSRunConfig(cs_ip="localhost:9000", tf_random_seed=1, save_checkpoints_steps=100)
    estimator = CerebrasEstimator(model_fn, model_dir=str(tmp_path), config=config, params={})
    estimator.train(_input_fn, max_steps=60)
    cerebras_tf.release_system()  # a new process, as on the real system (the fabric is programmed once)
    on_system = estimator.evaluate(_input_fn, steps=4, use_cs=True)
    on_cpu = estimator.evaluate(_input_fn, steps=4)
    assert on_system["global_step"] == on_cpu["global_step"] == 60
    assert on_system["accuracy"] == pytest.approx(on_cpu["accuracy"], abs=2 / 64)  # half precision may flip one
    assert on_system["loss"] == pytest.approx(on_cpu["loss"], rel=2e-2)
    assert glob.glob(str(tmp_path / "eval" / "events.out.tfevents.*"))
