"""A tf.estimator-era script run by the stack tests in a subprocess, on this stack's Python or the other's.

  python stack_script.py train MODEL_DIR MAX_STEPS    train (resuming from MODEL_DIR's checkpoint) to MAX_STEPS
  python stack_script.py evaluate MODEL_DIR           evaluate the latest checkpoint on the data set

Prints one JSON line last: the Estimator in use, TensorFlow's version, and the result (evaluation metrics,
or the trained variables).
"""
from __future__ import annotations

import json
import sys

import numpy as np
import tensorflow as tf

from estimator import BACKEND, Estimator, EstimatorSpec, ModeKeys, RunConfig

X = np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(16, 4)
Y = (X @ np.array([[0.5], [-1.0], [2.0], [0.25]], np.float32) + 0.1).astype(np.float32)


def input_fn(params):
    # every batch is the whole data set: a resumed run (whose input starts over) sees what a straight one sees
    return tf.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(16, drop_remainder=True)


def model_fn(features, labels, mode, params):
    hidden = tf.compat.v1.layers.dense(features, 8, activation=tf.nn.tanh, name="hidden")
    predictions = tf.compat.v1.layers.dense(hidden, 1, name="out")
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions={"y": predictions})
    loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    metrics = {"mae": tf.compat.v1.metrics.mean_absolute_error(labels, predictions)}
    return EstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


def main(command: str, model_dir: str, *args: str) -> None:
    estimator = Estimator(model_fn, model_dir=model_dir, config=RunConfig(tf_random_seed=1, save_summary_steps=5))
    if command == "train":
        estimator.train(input_fn, max_steps=int(args[0]))
        result = {name: estimator.get_variable_value(name).tolist() for name in estimator.get_variable_names()
                  if not name.startswith("beta") and "Adam" not in name}
    else:
        result = {name: float(value) for name, value in estimator.evaluate(input_fn, steps=4).items()}
    print(json.dumps({"backend": BACKEND, "tensorflow": tf.__version__, "result": result}))


if __name__ == "__main__":
    main(*sys.argv[1:])
