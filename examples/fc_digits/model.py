"""model_fn: an MLP classifier returning a CSEstimatorSpec (metrics through host_call)."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from cerebras_tf import CSEstimatorSpec, ModeKeys

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
    """host_call fn: accuracy, run on the host over the logits and labels streamed off the wafer."""
    return {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, axis=-1))}


def model_fn(features: tf.Tensor, labels: tf.Tensor | None, mode: str, params: dict[str, Any]) -> CSEstimatorSpec:
    """MLP (params["model"]: hidden_sizes, activation, dropout, num_classes) with softmax cross entropy.

    TRAIN: train_op from params["optimizer"]. EVAL: accuracy through host_call
    (no eval_metric_ops, a CS-system rule). PREDICT: classes and probabilities.
    """
    config = params["model"]
    if config["activation"] not in _ACTIVATIONS:
        raise ValueError(f"params model.activation={config['activation']!r}: choose one of {sorted(_ACTIVATIONS)}.")
    activation = _ACTIVATIONS[config["activation"]]
    training = mode == ModeKeys.TRAIN
    # An explicit tf.compat.v1 initializer: the Keras default behind tf.compat.v1.layers ignores the graph
    # seed in TF 2.15, so runconfig.tf_random_seed would not make runs reproducible.
    initializer = tf.compat.v1.glorot_uniform_initializer()
    hidden = features
    for index, size in enumerate(config["hidden_sizes"]):
        hidden = tf.compat.v1.layers.dense(hidden, size, activation=activation, kernel_initializer=initializer,
                                           name=f"fc{index}")
        hidden = tf.compat.v1.layers.dropout(hidden, rate=config["dropout"], training=training)
    logits = tf.compat.v1.layers.dense(hidden, config["num_classes"], kernel_initializer=initializer,
                                       name="fc_output")

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
