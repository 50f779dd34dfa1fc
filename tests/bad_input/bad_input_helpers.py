"""Helpers of the malformed-input cases (issue 16): model_dir snapshots, a refusal check, small models.

`snapshot(path)` records a tree byte for byte (every name, size, mtime and
content hash; None for a path that does not exist). `refused(action, type,
*fragments, model_dir=...)` runs the action, checks the error's type and
message and that model_dir is as it was. `regressor()` is tests/conftest.py's
MLP with knobs a user edits; `estimator()` builds a CerebrasEstimator for it.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Callable

import numpy as np
import pytest
import tensorflow as tf

import cerebras_tf
from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig, amp
from estimator import ModeKeys

CS_IP = "localhost:9000"
BATCH = 4
CHIEF_TF_CONFIG = '{"cluster": {"chief": ["localhost:2222"]}, "task": {"type": "chief", "index": 0}}'

Snapshot = dict[str, tuple[Any, ...]] | None


def snapshot(path: str) -> Snapshot:
    """Every entry under `path` (itself included): directories with their mtime, files with size, mtime and
    SHA-256. None when nothing exists at `path`."""
    if not os.path.lexists(path):
        return None
    found: dict[str, tuple[Any, ...]] = {}

    def record(full: str, relative: str) -> None:
        info = os.lstat(full)
        if os.path.isdir(full) and not os.path.islink(full):
            found[relative] = ("dir", info.st_mtime_ns)
            for name in sorted(os.listdir(full)):
                record(os.path.join(full, name), os.path.join(relative, name))
        else:
            with open(full, "rb") as handle:
                digest = hashlib.sha256(handle.read()).hexdigest()
            found[relative] = ("file", info.st_size, info.st_mtime_ns, digest)

    record(path, ".")
    return found


def checkpoint_files(path: str) -> Snapshot:
    """snapshot() of a model_dir restricted to its checkpoints (model.ckpt-* and the `checkpoint` index)."""
    tree = snapshot(path)
    if tree is None:
        return None
    return {name: entry for name, entry in tree.items()
            if os.path.basename(name) == "checkpoint" or os.path.basename(name).startswith("model.ckpt")}


def refused(action: Callable[[], Any], error_type: type[BaseException], *fragments: str, model_dir: str,
            exact: bool = True) -> BaseException:
    """action() raises `error_type` (exactly, unless exact=False) whose message holds every fragment, and
    model_dir is byte for byte as it was (still absent if it was)."""
    before = snapshot(model_dir)
    with pytest.raises(BaseException) as info:
        action()
    error = info.value
    if exact:
        assert type(error) is error_type, f"expected {error_type.__name__}, got {type(error).__name__}: {error}"
    else:
        assert isinstance(error, error_type), f"expected a {error_type.__name__}, got {type(error).__name__}: {error}"
    message = str(error)
    missing = [fragment for fragment in fragments if fragment not in message]
    assert not missing, f"{missing} not in the message:\n{message}"
    if isinstance(error, cerebras_tf.CerebrasError):
        assert all(problem.fix for problem in getattr(error, "problems", [error])), message
    assert snapshot(model_dir) == before, f"model_dir changed:\n{before}\n->\n{snapshot(model_dir)}"
    return error


# --------------------------------------------------------------------------- models and data

X = np.random.default_rng(0).normal(size=(12, 4)).astype(np.float32)
Y = (X @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype(np.float32)
CLASSES = 3
LABELS = np.array([0, 1, 2, 1, 0, 2, 1, 1, 0, 2, 2, 0], np.int32)


def regression_input_fn(x: np.ndarray = X, y: np.ndarray = Y) -> Callable[[dict[str, Any]], tf.data.Dataset]:
    """input_fn(params) over (x, y), unshuffled, repeating forever, batch params['batch_size']."""

    def input_fn(params):
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(params["batch_size"], drop_remainder=True)

    return input_fn


def regressor(hidden: int = 8, hidden_name: str = "hidden", optimizer: str = "sgd", extra_layer: bool = False,
              dtype: tf.DType = tf.float32) -> Callable:
    """A two-layer MLP regressor (hidden/*, output/*, as tests/conftest.py's model) whose shape can be edited,
    as users edit a model whose checkpoints stay in model_dir."""

    def model_fn(features, labels, mode, params):
        init = tf.compat.v1.glorot_uniform_initializer()
        inputs = tf.cast(features, dtype)
        net = tf.compat.v1.layers.dense(inputs, hidden, activation=tf.nn.relu, kernel_initializer=init,
                                        name=hidden_name)
        if extra_layer:
            net = tf.compat.v1.layers.dense(net, hidden, activation=tf.nn.relu, kernel_initializer=init, name="extra")
        predictions = tf.cast(tf.compat.v1.layers.dense(net, 1, kernel_initializer=init, name="output"), tf.float32)
        if mode == ModeKeys.PREDICT:
            return CSEstimatorSpec(mode, predictions={"y": predictions})
        loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
        train_op = None
        if mode == ModeKeys.TRAIN:
            opt = (tf.compat.v1.train.AdamOptimizer(1e-3) if optimizer == "adam"
                   else tf.compat.v1.train.GradientDescentOptimizer(0.01))
            train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
        return CSEstimatorSpec(mode, loss=loss, train_op=train_op, predictions={"y": predictions})

    return model_fn


def classification_input_fn(labels: np.ndarray = LABELS, x: np.ndarray = X) -> Callable:
    """input_fn(params) over (x, int32 labels), unshuffled, repeating forever, batch params['batch_size']."""
    return regression_input_fn(x, labels)


def classifier(grad_scaler: Any = "default") -> Callable:
    """A linear CLASSES-way classifier with sparse softmax cross entropy (its labels must lie in [0, CLASSES)).
    grad_scaler: "default" trains with optimizer.minimize (the system's default dynamic loss scaling), else
    amp.optimizer_step with that GradScaler."""

    def model_fn(features, labels, mode, params):
        logits = tf.compat.v1.layers.dense(features, CLASSES, name="logits")
        if mode == ModeKeys.PREDICT:
            return CSEstimatorSpec(mode, predictions={"class": tf.argmax(logits, axis=1)})
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        train_op = None
        if mode == ModeKeys.TRAIN:
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.01)
            train_op = (optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
                        if grad_scaler == "default" else amp.optimizer_step(loss, optimizer, grad_scaler))
        return CSEstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


def estimator(model_dir: str, model_fn: Callable | None = None, params: Any = None, compile_dir: str | None = None,
              **config: Any) -> CerebrasEstimator:
    """A CerebrasEstimator on the simulated CS system (cs_ip set unless given) with params {'batch_size': 4}."""
    config.setdefault("cs_ip", CS_IP)
    return CerebrasEstimator(model_fn or regressor(), model_dir=model_dir, compile_dir=compile_dir,
                             config=CSRunConfig(**config), params={"batch_size": BATCH} if params is None else params)


