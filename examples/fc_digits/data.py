"""Input functions: scikit-learn's digits (shipped with the package, no download).

Both take only `params` (a CS-system rule) and return a tf.data.Dataset of
(features float32[batch, 64], labels int32[batch]) with a fixed batch size.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

EVAL_FRACTION = 0.2
MAX_PIXEL = 16.0  # load_digits pixels are integers 0..16
_SPLIT_SEED = 0  # the train/eval split is fixed; the shuffle order is not


@functools.lru_cache(maxsize=2)
def _split(train: bool) -> tuple[np.ndarray, np.ndarray]:
    """The deterministic train (80%) or eval (20%) part of the 1797 digits, as loaded (float64, int64)."""
    images, labels = load_digits(return_X_y=True)
    order = np.random.RandomState(_SPLIT_SEED).permutation(len(labels))
    cut = int(len(labels) * (1 - EVAL_FRACTION))
    chosen = order[:cut] if train else order[cut:]
    return images[chosen], labels[chosen]


def _preprocess(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Pixels scaled to [0, 1] as float32, labels as int32."""
    return tf.cast(image, tf.float32) / MAX_PIXEL, tf.cast(label, tf.int32)


def train_input_fn(params: dict[str, Any]) -> tf.data.Dataset:
    """The training split: shuffled (no fixed seed), repeating forever, fixed batch size."""
    config = params["train_input"]
    dataset = tf.data.Dataset.from_tensor_slices(_split(train=True))
    # No shuffle seed: with several input workers each must send a different order.
    dataset = dataset.shuffle(config["shuffle_buffer"]).repeat()
    dataset = dataset.map(_preprocess, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(config["batch_size"], drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def eval_input_fn(params: dict[str, Any]) -> tf.data.Dataset:
    """The held-out split in order, one pass, fixed batch size (the remainder is dropped)."""
    config = params["eval_input"]
    dataset = tf.data.Dataset.from_tensor_slices(_split(train=False))
    dataset = dataset.map(_preprocess, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(config["batch_size"], drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)
