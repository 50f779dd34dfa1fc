"""Capture `input_fn` + `model_fn` for one mode into a fresh graph.

The graph is built in the same order as tf.estimator.Estimator builds it
(graph seed, global step, input_fn, iterator, model_fn), so op-level random
seeds, and therefore initial values, are the ones plain TensorFlow would get.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import tensorflow as tf
from tensorflow.python.training import training_util

from estimator.api import Estimator, EstimatorSpec, ModeKeys, parse_input_fn_result


@dataclasses.dataclass
class CapturedInput:
    """What `input_fn` returned, inside `graph`."""

    graph: tf.Graph
    mode: str
    result: Any  # the raw return value of input_fn
    global_step: tf.Variable | None

    @property
    def is_dataset(self) -> bool:
        return isinstance(self.result, tf.data.Dataset)


@dataclasses.dataclass
class CapturedModel:
    """A whole captured program: input, features/labels and the model_fn's spec."""

    input: CapturedInput
    features: Any
    labels: Any
    spec: EstimatorSpec

    @property
    def graph(self) -> tf.Graph:
        return self.input.graph


def capture_input(estimator: Estimator, input_fn: Callable[..., Any], mode: str) -> CapturedInput:
    """Build a fresh graph with the global step and call `input_fn` in it.

    The graph stays the default graph only inside this call: use
    `with captured.graph.as_default():` to continue building in it.
    """
    config = estimator.config
    graph = tf.Graph()
    with graph.as_default(), graph.device(estimator._device_fn):
        tf.compat.v1.random.set_random_seed(config.tf_random_seed)
        global_step = estimator._create_and_assert_global_step(graph)
        if global_step is not None and mode == ModeKeys.TRAIN:
            training_util._get_or_create_global_step_read(graph)
        result = estimator._call_input_fn(input_fn, mode)
    return CapturedInput(graph=graph, mode=mode, result=result, global_step=global_step)


def capture_model(estimator: Estimator, captured: CapturedInput,
                  call_model_fn: Callable[..., EstimatorSpec]) -> CapturedModel:
    """Turn the input into (features, labels) as the Estimator does and call the model_fn.

    `call_model_fn(features, labels, mode, config)` returns the spec; the caller
    chooses whether that is the raw user spec or the adapted one. The captured
    features and labels are the input's, as they were before model_fn ran: a
    model_fn may replace entries of the dict it is given (the Model Zoo's BERT
    casts features["input_mask"] in place).
    """
    with captured.graph.as_default(), captured.graph.device(estimator._device_fn):
        features, labels, _ = parse_input_fn_result(captured.result)
        if captured.mode == ModeKeys.PREDICT:
            labels = None  # the Estimator never passes labels to a PREDICT model_fn
        inputs = tf.nest.map_structure(lambda leaf: leaf, (features, labels))  # new containers, the same leaves
        spec = call_model_fn(features, labels, captured.mode, estimator.config)
    return CapturedModel(input=captured, features=inputs[0], labels=inputs[1], spec=spec)
