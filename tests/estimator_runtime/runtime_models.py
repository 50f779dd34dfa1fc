"""Models and inputs the runtime tests share: each runs on tf.estimator and on estimator.runtime.

A model_fn factory takes `api`, the module whose EstimatorSpec/ModeKeys it
uses (tf.estimator or estimator.runtime), so the same model can be given to
both Estimators. Variables use tf.compat.v1 initializers, which follow the
graph seed (the Keras defaults behind tf.compat.v1.layers draw seeds from
Python's `random` instead), so two runs with one tf_random_seed are equal.
"""
from __future__ import annotations

import contextlib
import logging
import re
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf

BATCH = 4
X = np.random.default_rng(7).normal(size=(16, 3)).astype(np.float32)
Y = (X @ np.array([[1.5], [-2.0], [0.5]], np.float32) + 0.3).astype(np.float32)


def input_fn(repeat: bool = True, batch: int = BATCH, shuffle: bool = False) -> Callable[..., tf.data.Dataset]:
    """(features [B, 3], labels [B, 1]) batches of (X, Y)."""

    def fn(params: dict[str, Any]) -> tf.data.Dataset:
        dataset = tf.data.Dataset.from_tensor_slices((X, Y))
        if shuffle:
            dataset = dataset.shuffle(16)
        return (dataset.repeat() if repeat else dataset).batch(batch)

    return fn


def dict_input_fn(repeat: bool = True) -> Callable[..., tf.data.Dataset]:
    """({"a": [B, 2], "b": [B, 1]}, labels) batches of (X, Y)."""

    def fn(params: dict[str, Any]) -> tf.data.Dataset:
        dataset = tf.data.Dataset.from_tensor_slices(({"a": X[:, :2], "b": X[:, 2:]}, Y))
        return (dataset.repeat() if repeat else dataset).batch(BATCH)

    return fn


def predict_input_fn() -> tf.data.Dataset:
    """Features only, 16 examples in batches of 4 (ends after 4 batches)."""
    return tf.data.Dataset.from_tensor_slices(X).batch(BATCH)


def _features(features: Any) -> tf.Tensor:
    return tf.concat([features["a"], features["b"]], axis=1) if isinstance(features, dict) else features


def dense_model_fn(api: Any, metrics: bool = False, layers: bool = True, dropout: float = 0.0,
                   optimizer: str = "sgd") -> Callable[..., Any]:
    """A one-hidden-layer regressor (tf.compat.v1.layers, or get_variable with layers=False).

    metrics: eval_metric_ops with MAE, RMSE and the mean prediction. dropout:
    a seeded-by-graph dropout in TRAIN mode (exercises op-level seeds).
    """

    def model_fn(features, labels, mode, params):
        inputs = _features(features)
        init = tf.compat.v1.glorot_uniform_initializer()
        if layers:
            hidden = tf.compat.v1.layers.dense(inputs, 8, activation=tf.nn.relu, kernel_initializer=init,
                                               name="hidden")
            if dropout:
                hidden = tf.nn.dropout(hidden, rate=dropout) if mode == api.ModeKeys.TRAIN else hidden
            output = tf.compat.v1.layers.dense(hidden, 1, kernel_initializer=init, name="output")
        else:
            w1 = tf.compat.v1.get_variable("hidden/kernel", [3, 8], initializer=init)
            b1 = tf.compat.v1.get_variable("hidden/bias", [8], initializer=tf.compat.v1.zeros_initializer())
            hidden = tf.nn.relu(tf.matmul(inputs, w1) + b1)
            w2 = tf.compat.v1.get_variable("output/kernel", [8, 1], initializer=init)
            b2 = tf.compat.v1.get_variable("output/bias", [1], initializer=tf.compat.v1.zeros_initializer())
            output = tf.matmul(hidden, w2) + b2
        predictions = {"y": output, "hidden": hidden}
        if mode == api.ModeKeys.PREDICT:
            return api.EstimatorSpec(mode, predictions=predictions)
        loss = tf.compat.v1.losses.mean_squared_error(labels, output)
        step = tf.compat.v1.train.get_global_step()
        opt = (tf.compat.v1.train.AdamOptimizer(0.01) if optimizer == "adam"
               else tf.compat.v1.train.GradientDescentOptimizer(params.get("lr", 0.05)))
        train_op = opt.minimize(loss, global_step=step) if mode == api.ModeKeys.TRAIN else None
        eval_metric_ops = None
        if metrics:
            eval_metric_ops = {
                "mae": tf.compat.v1.metrics.mean_absolute_error(labels, output),
                "rmse": tf.compat.v1.metrics.root_mean_squared_error(labels, output),
                "prediction/mean": tf.compat.v1.metrics.mean(output),
            }
        return api.EstimatorSpec(mode, loss=loss, train_op=train_op, predictions=predictions,
                                 eval_metric_ops=eval_metric_ops)

    return model_fn


LOSS_LINE = re.compile(r"^loss = (\S+), step = (\d+)")


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def tf_log_lines() -> Iterator[list[str]]:
    """Collect the messages TensorFlow logs at INFO level inside the block."""
    logger = tf.get_logger()
    handler, level = _Collect(), logger.level  # the logger's own level (often NOTSET), not the effective one
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def loss_lines(lines: list[str]) -> list[tuple[str, int]]:
    """The (loss, step) of every "loss = ..., step = ..." line (timings dropped)."""
    found = [LOSS_LINE.match(line) for line in lines]
    return [(m.group(1), int(m.group(2))) for m in found if m]


def assert_logged_steps(lines: list[str], expected: list[int]) -> None:
    """The steps of the "loss = ..., step = ..." lines, each as expected or one more.

    TF's LoggingTensorHook reads the global step in the same session.run as
    the train_op that increments it, with no order between the two (in
    tf.estimator as here), so the value logged may be the one after the step.
    """
    steps = [step for _, step in loss_lines(lines)]
    assert len(steps) == len(expected), steps
    assert all(step in (want, want + 1) for step, want in zip(steps, expected)), steps


def event_tags(directory: str) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, simple_value)]} of the scalar summaries in `directory`'s event files."""
    tags: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(tf.io.gfile.glob(f"{directory}/events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    tags.setdefault(value.tag, []).append((event.step, value.simple_value))
                else:
                    tags.setdefault(value.tag, [])
    return tags
