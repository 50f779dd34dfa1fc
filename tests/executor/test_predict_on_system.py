"""predict(use_cs=True) runs the PREDICT program on the simulated WSE from a checkpoint."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from estimator import ModeKeys
from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig, amp, set_default_tf_config
from cerebras_tf.errors import RunArgumentError
from cerebras_tf.wse import system

_X = np.random.default_rng(0).normal(size=(40, 6)).astype(np.float32)
_Y = (_X[:, 0] > 0).astype(np.int32)


@pytest.fixture(autouse=True)
def _tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    set_default_tf_config()


def _model_fn(features, labels, mode, params):
    init = tf.compat.v1.glorot_uniform_initializer(seed=5)
    hidden = tf.compat.v1.layers.dense(features, 16, activation=tf.nn.relu, kernel_initializer=init, name="fc1")
    logits = tf.compat.v1.layers.dense(hidden, 2, kernel_initializer=init, name="logits")
    if mode == ModeKeys.PREDICT:
        if params.get("single"):
            return CSEstimatorSpec(mode, predictions=logits)
        return CSEstimatorSpec(mode, predictions={"classes": tf.argmax(logits, axis=-1),
                                                  "probabilities": tf.nn.softmax(logits)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.AdamOptimizer(0.05).minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def _train_input_fn(params):
    return tf.data.Dataset.from_tensor_slices((_X, _Y)).repeat().batch(8, drop_remainder=True)


def _predict_input_fn(params):  # features only, finite: prediction ends with the data
    return tf.data.Dataset.from_tensor_slices(_X).batch(8, drop_remainder=True)


def _estimator(model_dir, **params):
    config = CSRunConfig(cs_ip="localhost:9000", tf_random_seed=1, save_checkpoints_steps=100)
    return CerebrasEstimator(_model_fn, model_dir=str(model_dir), config=config, params=params)


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("predict")
    _estimator(model_dir).train(_train_input_fn, max_steps=30, use_cs=False)
    return model_dir


def test_predictions_on_the_system_match_the_estimator_on_cpu(trained_dir):
    estimator = _estimator(trained_dir)
    previous = amp.get_half_dtype()
    amp.set_half_dtype("float32")
    try:
        on_system = list(estimator.predict(_predict_input_fn, use_cs=True))
    finally:
        amp.set_half_dtype(previous)
    on_cpu = list(estimator.predict(_predict_input_fn))
    assert len(on_system) == len(on_cpu) == 40
    assert set(on_system[0]) == {"classes", "probabilities"}
    assert [p["classes"] for p in on_system] == [p["classes"] for p in on_cpu]
    np.testing.assert_allclose(np.stack([p["probabilities"] for p in on_system]),
                               np.stack([p["probabilities"] for p in on_cpu]), rtol=1e-5, atol=1e-6)
    assert system.programmed_system("localhost:9000").mode == "infer"


def test_half_precision_batches_num_samples_and_predict_keys(trained_dir):
    estimator = _estimator(trained_dir)
    batches = list(estimator.predict(_predict_input_fn, predict_keys=["probabilities"], yield_single_examples=False,
                                     num_samples=20, use_cs=True))
    assert [len(b["probabilities"]) for b in batches] == [8, 8, 4] and set(batches[0]) == {"probabilities"}
    cpu = np.stack([p["probabilities"] for p in estimator.predict(_predict_input_fn)])[:20]
    np.testing.assert_allclose(np.concatenate([b["probabilities"] for b in batches]), cpu, atol=5e-3)  # float16


def test_a_single_predictions_tensor_yields_arrays(trained_dir):
    estimator = _estimator(trained_dir, single=True)
    rows = list(estimator.predict(_predict_input_fn, num_samples=3, use_cs=True))
    assert len(rows) == 3 and rows[0].shape == (2,)


def test_predict_without_a_checkpoint_is_refused_before_anything_is_written(tmp_path):
    estimator = _estimator(tmp_path / "empty")
    with pytest.raises(RunArgumentError, match=r"predict\(\) on the CS system found no checkpoint"):
        estimator.predict(_predict_input_fn, use_cs=True)
    assert not (tmp_path / "empty").exists() or not os.listdir(tmp_path / "empty")


def test_evaluation_on_the_system_reads_in_the_chief_and_stops_when_the_data_ends_as_the_estimator_does(
        trained_dir, monkeypatch):
    def finite_eval_input_fn(params):  # 5 batches
        return tf.data.Dataset.from_tensor_slices((_X, _Y)).batch(8, drop_remainder=True)

    estimator = _estimator(trained_dir)
    on_cpu = estimator.evaluate(finite_eval_input_fn, steps=100)
    # TF_CONFIG workers nobody runs: evaluation reads input_fn's data in the chief's process whatever it lists.
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}, '
                                    '"task": {"type": "chief", "index": 0}}')
    previous = amp.get_half_dtype()
    amp.set_half_dtype("float32")
    try:
        on_system = estimator.evaluate(finite_eval_input_fn, steps=100, use_cs=True)
    finally:
        amp.set_half_dtype(previous)
    assert on_system["global_step"] == on_cpu["global_step"] == 30
    assert on_system["loss"] == pytest.approx(on_cpu["loss"], rel=1e-5)
