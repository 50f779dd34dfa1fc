"""MLP classifier: dense layers (compat.v1, Keras and raw ops), relu/tanh/gelu, dropout, softmax cross entropy.

Trains with Adam and an exponentially decaying learning rate.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from cerebras_tf import CSEstimatorSpec, ModeKeys

DEFAULT_PARAMS: dict[str, Any] = {
    "batch_size": 8,
    "input_size": 20,
    "hidden_sizes": [32, 24, 16],
    "num_classes": 5,
    "dropout_rate": 0.1,
    "learning_rate": 1e-3,
    "num_examples": 64,
    "seed": 0,
}


def input_fn(params: dict[str, Any]) -> tf.data.Dataset:
    """Random features with labels from a fixed random linear map; repeats forever, fixed batch."""
    p = {**DEFAULT_PARAMS, **params}
    rng = np.random.default_rng(p["seed"])
    x = rng.standard_normal((p["num_examples"], p["input_size"])).astype(np.float32)
    w = rng.standard_normal((p["input_size"], p["num_classes"])).astype(np.float32)
    y = np.argmax(x @ w, axis=1).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    return ds.batch(p["batch_size"], drop_remainder=True)


def _gelu_dense(x: tf.Tensor, units: int, name: str) -> tf.Tensor:
    """A dense layer with exact GELU written with raw tf ops and variables."""
    with tf.compat.v1.variable_scope(name):
        w = tf.compat.v1.get_variable("kernel", [x.shape[-1], units],
                                      initializer=tf.compat.v1.glorot_uniform_initializer())
        b = tf.compat.v1.get_variable("bias", [units], initializer=tf.compat.v1.zeros_initializer())
        return tf.nn.gelu(tf.matmul(x, w) + b, approximate=False)


def model_fn(features: tf.Tensor, labels: tf.Tensor, mode: str, params: dict[str, Any]) -> CSEstimatorSpec:
    p = {**DEFAULT_PARAMS, **params}
    training = mode == ModeKeys.TRAIN
    h1, h2, h3 = p["hidden_sizes"]
    x = tf.compat.v1.layers.dense(features, h1, activation=tf.nn.relu, name="dense1")
    x = tf.compat.v1.layers.dropout(x, rate=p["dropout_rate"], training=training, name="dropout1")
    x = tf.keras.layers.Dense(h2, activation="tanh", name="dense2")(x)
    x = _gelu_dense(x, h3, "dense3")
    logits = tf.compat.v1.layers.dense(x, p["num_classes"], name="logits")
    probabilities = tf.nn.softmax(logits)
    predictions = {"classes": tf.argmax(logits, axis=-1), "probabilities": probabilities}
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions=predictions)

    onehot = tf.one_hot(labels, p["num_classes"])
    loss = tf.compat.v1.losses.softmax_cross_entropy(onehot, logits)
    train_op = None
    if training:
        step = tf.compat.v1.train.get_global_step()
        lr = tf.compat.v1.train.exponential_decay(p["learning_rate"], step, decay_steps=100, decay_rate=0.96)
        train_op = tf.compat.v1.train.AdamOptimizer(lr).minimize(loss, global_step=step)
    host_call = (_metrics, [labels, predictions["classes"]])
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op, predictions=predictions, host_call=host_call)


def _metrics(labels: tf.Tensor, classes: tf.Tensor) -> dict[str, Any]:
    return {"accuracy": tf.compat.v1.metrics.accuracy(labels, classes)}
