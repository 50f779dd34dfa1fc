"""Input functions: scikit-learn's digits (shipped with the package, no download)."""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

EVAL_FRACTION = 0.2
_SPLIT_SEED = 0  # the train/eval split is fixed; the shuffle order is not


def _split(train: bool) -> tuple[np.ndarray, np.ndarray]:
    images, labels = load_digits(return_X_y=True)
    order = np.random.RandomState(_SPLIT_SEED).permutation(len(labels))
    cut = int(len(labels) * (1 - EVAL_FRACTION))
    chosen = order[:cut] if train else order[cut:]
    return images[chosen].astype(np.float32), labels[chosen].astype(np.int32)


def _scale(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return image / 16.0, label  # pixel values are 0..16


def train_input_fn(params: dict[str, Any]) -> tf.data.Dataset:
    """Shuffled (no fixed seed), repeating forever, fixed batch size."""
    config = params["train_input"]
    images, labels = _split(train=True)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    dataset = dataset.shuffle(config["shuffle_buffer"]).repeat()
    dataset = dataset.map(_scale, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(config["batch_size"], drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def eval_input_fn(params: dict[str, Any]) -> tf.data.Dataset:
    """The held-out split in order, fixed batch size (the remainder is dropped)."""
    config = params["eval_input"]
    images, labels = _split(train=False)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).map(_scale)
    dataset = dataset.batch(config["batch_size"], drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)
