"""CNN classifier: conv2d, batch norm in training mode (fused and unfused), max/avg pooling, flatten.

Trains with Momentum and a piecewise-constant learning rate; batch-norm
moving averages run each step through UPDATE_OPS.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from cerebras_tf import CSEstimatorSpec, ModeKeys

DEFAULT_PARAMS: dict[str, Any] = {
    "batch_size": 4,
    "image_size": 8,
    "channels": 3,
    "filters": [4, 8, 8],
    "num_classes": 3,
    "learning_rate": 0.05,
    "num_examples": 32,
    "seed": 1,
}


def input_fn(params: dict[str, Any]) -> tf.data.Dataset:
    """Random NHWC images labelled by which third of the image is brightest; repeats forever."""
    p = {**DEFAULT_PARAMS, **params}
    rng = np.random.default_rng(p["seed"])
    size = p["image_size"]
    x = rng.random((p["num_examples"], size, size, p["channels"]), dtype=np.float32)
    thirds = np.array_split(x.mean(axis=(2, 3)), p["num_classes"], axis=1)
    y = np.argmax(np.stack([t.mean(axis=1) for t in thirds], axis=1), axis=1).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    return ds.batch(p["batch_size"], drop_remainder=True)


def model_fn(features: tf.Tensor, labels: tf.Tensor, mode: str, params: dict[str, Any]) -> CSEstimatorSpec:
    p = {**DEFAULT_PARAMS, **params}
    training = mode == ModeKeys.TRAIN
    f1, f2, f3 = p["filters"]
    x = tf.compat.v1.layers.conv2d(features, f1, 3, padding="same", use_bias=False, name="conv1")
    x = tf.compat.v1.layers.batch_normalization(x, training=training, name="bn1")  # fused
    x = tf.nn.relu(x)
    x = tf.compat.v1.layers.max_pooling2d(x, 2, 2, name="pool1")
    x = tf.keras.layers.Conv2D(f2, 3, padding="same", activation="relu", name="conv2")(x)
    x = tf.keras.layers.AveragePooling2D(2, name="pool2")(x)
    with tf.compat.v1.variable_scope("conv3"):
        kernel = tf.compat.v1.get_variable("kernel", [3, 3, f2, f3])
        x = tf.nn.conv2d(x, kernel, strides=1, padding="SAME")
    x = tf.compat.v1.layers.batch_normalization(x, training=training, fused=False, name="bn3")
    x = tf.nn.relu(x)
    x = tf.compat.v1.layers.flatten(x, name="flatten")
    logits = tf.compat.v1.layers.dense(x, p["num_classes"], name="logits")
    predictions = {"classes": tf.argmax(logits, axis=-1), "logits": logits}
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions=predictions)

    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = None
    if training:
        step = tf.compat.v1.train.get_global_step()
        base = p["learning_rate"]
        lr = tf.compat.v1.train.piecewise_constant(step, [100, 200], [base, base / 10, base / 100])
        optimizer = tf.compat.v1.train.MomentumOptimizer(lr, momentum=0.9)
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = optimizer.minimize(loss, global_step=step)
    host_call = (_metrics, [labels, predictions["classes"]])
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op, predictions=predictions, host_call=host_call)


def _metrics(labels: tf.Tensor, classes: tf.Tensor) -> dict[str, Any]:
    return {"accuracy": tf.compat.v1.metrics.accuracy(labels, classes)}
