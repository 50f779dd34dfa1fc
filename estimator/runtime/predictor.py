"""Estimator.predict's graph and loop: predictions batch by batch, or example by example.

The PREDICT graph is built lazily, when the first prediction is asked for
(predict() returns a generator, as tf.estimator's does), from the given or
latest checkpoint, or from initial values (or a warm start) when there is
none. It runs until the input ends (or a hook stops it).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import tensorflow as tf

from estimator.runtime.mode_keys import ModeKeys
from estimator.runtime.warm_start import maybe_warm_start

if TYPE_CHECKING:
    from estimator.runtime.estimator import Estimator


def predict_model(estimator: "Estimator", input_fn: Callable[..., Any], predict_keys: Sequence[str] | None,
                  hooks: list[Any], checkpoint_path: str | None, yield_single_examples: bool) -> Iterator[Any]:
    """Yield the model's predictions (see Estimator.predict)."""
    with tf.Graph().as_default() as graph:
        tf.compat.v1.random.set_random_seed(estimator.config.tf_random_seed)
        estimator._create_and_assert_global_step(graph)
        features, input_hooks = estimator._get_features_from_input_fn(input_fn, ModeKeys.PREDICT)
        spec = estimator._call_model_fn(features, None, ModeKeys.PREDICT, estimator.config)
        if not checkpoint_path:
            maybe_warm_start(estimator._warm_start_settings)
        predictions = select_keys(spec.predictions, predict_keys)
        creator = tf.compat.v1.train.ChiefSessionCreator(
            checkpoint_filename_with_path=checkpoint_path, master=estimator.config.master,
            scaffold=spec.scaffold, config=estimator.config.session_config)
        all_hooks = [*input_hooks, *hooks, *spec.prediction_hooks]
        with tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=all_hooks) as session:
            while not session.should_stop():
                batch = session.run(predictions)
                if not yield_single_examples:
                    yield batch
                elif not isinstance(predictions, dict):
                    yield from batch
                else:
                    for i in range(batch_length(batch)):
                        yield {key: value[i] for key, value in batch.items()}


def select_keys(predictions: Any, predict_keys: Sequence[str] | None) -> Any:
    """The predictions named in `predict_keys` (all of them when None or empty)."""
    if not predict_keys:
        return predictions
    if not isinstance(predictions, dict):
        raise ValueError("predict_keys argument is not valid in case of non-dict predictions.")
    selected = {key: value for key, value in predictions.items() if key in predict_keys}
    if not selected:
        raise ValueError(f"Expected to run at least one output from {predictions.keys()}, provided {predict_keys}.")
    return selected


def batch_length(batch: dict[str, Any]) -> int:
    """The common first dimension of a batch of dict predictions (one example per row)."""
    length = None
    for key, value in batch.items():
        length = length or value.shape[0]
        if value.shape[0] != length:
            raise ValueError(f"Batch length of predictions should be same. {key} has different batch length than "
                             "others.")
    return length or 0
