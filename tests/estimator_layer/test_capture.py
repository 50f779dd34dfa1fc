"""The estimator layer captures graphs exactly as tf.estimator builds them."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from estimator import EstimatorBase, EstimatorSpec, ModeKeys, RunConfig, capture_input, capture_model

_recorded: dict[str, list[tuple[str, str]]] = {}


def _input_fn(params):
    x = np.arange(48, dtype=np.float32).reshape(12, 4) / 48.0
    y = (np.arange(12) % 3).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(12).repeat()
    return ds.batch(params["batch_size"], drop_remainder=True)


def _model_fn(features, labels, mode, params):
    hidden = tf.compat.v1.layers.dense(features, 5, activation=tf.nn.relu)
    hidden = tf.compat.v1.layers.dropout(hidden, rate=0.5, training=mode == ModeKeys.TRAIN)
    logits = tf.compat.v1.layers.dense(hidden, 3)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf.compat.v1.train.get_global_step()
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=step)
    ops = tf.compat.v1.get_default_graph().get_operations()
    _recorded[params["tag"]] = [(op.name, op.type) for op in ops]
    return EstimatorSpec(mode, loss=loss, train_op=train_op, predictions={"logits": logits})


@pytest.mark.parametrize("mode", [ModeKeys.TRAIN, ModeKeys.EVAL])
def test_capture_builds_the_same_ops_in_the_same_order_as_the_estimator(tmp_path, mode):
    config = RunConfig(tf_random_seed=11)
    estimator = EstimatorBase(_model_fn, model_dir=str(tmp_path), config=config,
                              params={"batch_size": 4, "tag": "estimator"})
    estimator.train(_input_fn, max_steps=1)
    if mode == ModeKeys.EVAL:
        estimator.evaluate(_input_fn, steps=1)
    reference = _recorded["estimator"]

    capturer = EstimatorBase(_model_fn, model_dir=str(tmp_path / "unused"), config=config,
                             params={"batch_size": 4, "tag": "capture"})
    captured = capture_model(capturer, capture_input(capturer, _input_fn, mode), capturer.call_user_model_fn)

    assert _recorded["capture"] == reference  # same names, types and order => same op-level seeds
    assert captured.spec.mode == mode
    assert captured.features.shape.as_list() == [4, 4]
    assert captured.labels.shape.as_list() == [4]
    assert not (tmp_path / "unused").exists()


def test_predict_capture_passes_no_labels(tmp_path):
    estimator = EstimatorBase(_model_fn, model_dir=str(tmp_path), params={"batch_size": 2, "tag": "predict"})
    captured = capture_model(estimator, capture_input(estimator, _input_fn, ModeKeys.PREDICT),
                             lambda f, labels, mode, config: _spy_labels(labels))
    assert captured.labels is None
    assert captured.spec == "no labels"


def _spy_labels(labels):
    return "no labels" if labels is None else "labels"


def test_capture_input_keeps_the_raw_result_for_the_rules(tmp_path):
    estimator = EstimatorBase(_model_fn, model_dir=str(tmp_path), params={"batch_size": 2, "tag": "raw"})
    captured = capture_input(estimator, lambda params: (tf.zeros([2, 4]), tf.zeros([2])), ModeKeys.TRAIN)
    assert not captured.is_dataset
    assert isinstance(captured.result, tuple)
    assert captured.global_step is not None
