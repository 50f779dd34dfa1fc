"""model_fn: an MLP classifier returning a CSEstimatorSpec (metrics through host_call)."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from cerebras_tf import CSEstimatorSpec

ModeKeys = tf.estimator.ModeKeys
_ACTIVATIONS = {"relu": tf.nn.relu, "tanh": tf.nn.tanh, "gelu": tf.nn.gelu}


def _optimizer(config: dict[str, Any]) -> tf.compat.v1.train.Optimizer:
    name, rate = config["name"], config["learning_rate"]
    if name == "sgd":
        return tf.compat.v1.train.GradientDescentOptimizer(rate)
    if name == "momentum":
        return tf.compat.v1.train.MomentumOptimizer(rate, config.get("momentum", 0.9))
    if name == "adam":
        return tf.compat.v1.train.AdamOptimizer(rate)
    raise ValueError(f"params optimizer.name={name!r}: choose sgd, momentum or adam.")


def build_eval_metric_ops(logits: tf.Tensor, labels: tf.Tensor) -> dict[str, Any]:
    """Runs on the host over tensors streamed off the wafer."""
    return {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, axis=-1))}


def model_fn(features: tf.Tensor, labels: tf.Tensor, mode: str, params: dict[str, Any]) -> CSEstimatorSpec:
    config = params["model"]
    activation = _ACTIVATIONS[config["activation"]]
    training = mode == ModeKeys.TRAIN
    hidden = features
    for index, size in enumerate(config["hidden_sizes"]):
        hidden = tf.compat.v1.layers.dense(hidden, size, activation=activation, name=f"fc{index}")
        hidden = tf.compat.v1.layers.dropout(hidden, rate=config["dropout"], training=training)
    logits = tf.compat.v1.layers.dense(hidden, config["num_classes"], name="fc_output")

    if mode == ModeKeys.PREDICT:
        predictions = {"classes": tf.argmax(logits, axis=-1), "probabilities": tf.nn.softmax(logits)}
        return CSEstimatorSpec(mode, predictions=predictions)

    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = None
    host_call = None
    if training:
        train_op = _optimizer(params["optimizer"]).minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    else:
        host_call = (build_eval_metric_ops, [logits, labels])
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op, host_call=host_call)
