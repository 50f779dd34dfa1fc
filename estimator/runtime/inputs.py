"""What an input_fn returned, as the (features, labels) the model_fn gets.

An input_fn returns a tf.data.Dataset (of (features, labels) or of features
alone), or the tensors themselves: a (features, labels) pair or features.
A dataset is read through an initializable iterator, initialized by a hook
when the session is created (so a resumed or repeated run starts the
pipeline afresh), as tf.estimator reads it.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf


class DatasetInitializerHook(tf.compat.v1.train.SessionRunHook):
    """Initializes an iterator once the session exists."""

    def __init__(self, iterator: Any) -> None:
        self._iterator = iterator
        self._initializer: Any = None

    def begin(self) -> None:
        self._initializer = self._iterator.initializer

    def after_create_session(self, session: Any, coord: Any) -> None:
        del coord
        session.run(self._initializer)


def split_features_and_labels(result: Any) -> tuple[Any, Any]:
    """A (features, labels) pair (list or tuple of two) split; anything else is features with labels None."""
    if isinstance(result, (list, tuple)):
        if len(result) != 2:
            raise ValueError("input_fn should return (features, labels) as a len 2 tuple.")
        return result[0], result[1]
    return result, None


def parse_input_fn_result(result: Any) -> tuple[Any, Any, list[tf.compat.v1.train.SessionRunHook]]:
    """(features, labels, input hooks) from input_fn's result, built in the current graph."""
    hooks: list[tf.compat.v1.train.SessionRunHook] = []
    if isinstance(result, tf.data.Dataset):
        iterator = tf.compat.v1.data.make_initializable_iterator(result)
        hooks.append(DatasetInitializerHook(iterator))
        result = iterator.get_next()
    features, labels = split_features_and_labels(result)
    return features, labels, hooks


def reads_from_input_pipeline(features: Any) -> bool:
    """True when `features` come from a tf.data iterator or a queue runner (so input can run out)."""
    tensors = [t for t in tf.nest.flatten(features) if isinstance(t, tf.Tensor)]
    if any(t.op.type == "IteratorGetNext" for t in tensors):
        return True
    return bool(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS))
