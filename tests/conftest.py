"""Shared fixtures for the CerebrasEstimator tests: a tiny model, an input_fn factory, a CS environment.

Everything is a fixture (test modules do not import this file): `data`,
`make_model_fn`, `make_input_fn`, `input_fn_lines`, `model_fn_lines`, `defined_at`, `build_estimator`,
`make_estimator`, `tf_config`, `model_dir` and `assert_refused`.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import functools
import json
import re
from typing import Any, Callable, NamedTuple

import numpy as np
import pytest
import tensorflow as tf

import cerebras_tf
from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig, amp
from cerebras_tf.errors import CerebrasError
from estimator import ModeKeys

CS_IP = "localhost:9000"
BATCH_SIZE = 4
NUM_FEATURES = 4
NUM_EXAMPLES = 10  # not a multiple of BATCH_SIZE: without drop_remainder the last batch is short
HIDDEN_UNITS = 8
LEARNING_RATE = 0.1
# What the Cerebras example scripts set by default: a single chief.
DEFAULT_TF_CONFIG = {"cluster": {"chief": ["localhost:2222"]}, "task": {"type": "chief", "index": 0}}

THIS_FILE = os.path.abspath(__file__)


class Data(NamedTuple):
    """The whole (tiny) data set every input_fn serves, in order."""

    x: np.ndarray  # float32 [NUM_EXAMPLES, NUM_FEATURES]
    y: np.ndarray  # float32 [NUM_EXAMPLES, 1]


def _make_data() -> Data:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, NUM_FEATURES)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32) + 0.25).astype(np.float32)
    return Data(x, y)


DATA = _make_data()

@pytest.fixture(scope="session")
def data() -> Data:
    return DATA


# --------------------------------------------------------------------------- model_fn


def _dense(value: Any) -> tf.Tensor:
    """Whatever structure an input pipeline produced, as one dense float tensor (so model_fn runs on it)."""
    if isinstance(value, dict):
        return _dense([value[key] for key in sorted(value)])
    if isinstance(value, (tuple, list)):
        return tf.concat([_dense(v) for v in value], axis=1)
    if isinstance(value, tf.SparseTensor):
        return tf.sparse.to_dense(value)
    if isinstance(value, tf.RaggedTensor):
        return value.to_tensor(shape=[None, NUM_FEATURES])
    if value.dtype == tf.string:
        return tf.strings.to_number(value)
    return value


def _mse_metric(labels: tf.Tensor, predictions: tf.Tensor) -> dict[str, Any]:
    return {"mse": tf.compat.v1.metrics.mean_squared_error(labels, predictions)}


def _mae_metric(labels: tf.Tensor, predictions: tf.Tensor) -> dict[str, Any]:
    return {"mae": tf.compat.v1.metrics.mean_absolute_error(labels, predictions)}


def make_model_fn(eval_metric_ops: bool = False, host_call: str | None = None, **spec_hooks: Any) -> Callable:
    """A two-layer MLP regressor (variables hidden/*, output/*) returning a CSEstimatorSpec.

    eval_metric_ops: add {"mean_label": mean(labels)} to the spec in every mode.
    host_call: None, "list" -> (fn, [labels, predictions]) computing "mse",
      or "dict" -> (fn, {"labels", "predictions"}) computing "mae"; in every mode but PREDICT.
    spec_hooks: spec hook fields (training_hooks=[...], evaluation_hooks=[...], ...), in every mode.
    """

    def model_fn(features, labels, mode, params):
        # An explicit tf.compat.v1 initializer: the Keras default behind tf.compat.v1.layers ignores the
        # graph seed (tf_random_seed) in TF 2.15, so runs would not be reproducible.
        init = tf.compat.v1.glorot_uniform_initializer()
        hidden = tf.compat.v1.layers.dense(_dense(features), HIDDEN_UNITS, activation=tf.nn.relu,
                                           kernel_initializer=init, name="hidden")
        predictions = tf.compat.v1.layers.dense(hidden, 1, kernel_initializer=init, name="output")
        if mode == ModeKeys.PREDICT:
            return CSEstimatorSpec(mode, predictions={"y": predictions}, **spec_hooks)
        labels = _dense(labels)
        loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
        train_op = None
        if mode == ModeKeys.TRAIN:
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(params.get("learning_rate", LEARNING_RATE))
            train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
        calls = {
            None: None,
            "list": (_mse_metric, [labels, predictions]),
            "dict": (_mae_metric, {"labels": labels, "predictions": predictions}),
        }
        metrics = {"mean_label": tf.compat.v1.metrics.mean(labels)} if eval_metric_ops else None  # marker: metric
        return CSEstimatorSpec(mode, loss=loss, train_op=train_op, predictions={"y": predictions},
                               eval_metric_ops=metrics, host_call=calls[host_call], **spec_hooks)

    return model_fn


@pytest.fixture(name="make_model_fn", scope="session")
def make_model_fn_fixture() -> Callable[..., Callable]:
    return make_model_fn


# --------------------------------------------------------------------------- input_fn


def _elements(element: str, data: Data) -> Any:
    """The per-example components of the dataset, in the structure `element` names."""
    x, y = data
    return {
        "tensor": lambda: (x, y),
        "dict": lambda: ({"x": x}, y),
        "nested": lambda: ((x[:, :2], x[:, 2:]), y),
        "triple": lambda: (x, y, np.ones(len(y), np.float32)),
        "sparse": lambda: (tf.sparse.from_dense(x), y),
        "ragged": lambda: (tf.RaggedTensor.from_tensor(x), y),
        "string_features": lambda: (x.astype(str), y),
        "string_labels": lambda: (x, y.astype(str)),
    }[element]()


def make_input_fn(
    element: str = "tensor",
    shuffle: bool = True,
    shuffle_seed: int | None = None,
    repeat: int | None | bool = None,
    drop_remainder: bool = True,
    dataset: bool = True,
) -> Callable[[dict[str, Any]], Any]:
    """An input_fn(params) over DATA: shuffle -> repeat -> batch(params["batch_size"]) -> prefetch.

    element: the element structure (see _elements): "tensor" is the supported (features, labels).
    shuffle_seed: shuffle(seed=...); repeat: None repeats forever, an int that many epochs,
    False not at all. dataset=False returns a (features, labels) tuple of tensors instead.
    """

    def input_fn(params):
        if not dataset:
            return tf.constant(DATA.x[:BATCH_SIZE]), tf.constant(DATA.y[:BATCH_SIZE])  # marker: tensors
        ds = tf.data.Dataset.from_tensor_slices(_elements(element, DATA))
        if shuffle:
            ds = ds.shuffle(NUM_EXAMPLES, seed=shuffle_seed)  # marker: shuffle
        if repeat is not False:
            ds = ds.repeat(repeat)  # marker: repeat
        ds = ds.batch(params["batch_size"], drop_remainder=drop_remainder)  # marker: batch
        return ds.prefetch(1)

    return input_fn


@pytest.fixture(name="make_input_fn", scope="session")
def make_input_fn_fixture() -> Callable[..., Callable]:
    return make_input_fn


_MARKER = re.compile(r"# marker: (\w+)$")


def _marker_lines() -> dict[str, str]:
    with open(THIS_FILE, encoding="utf-8") as handle:
        found = ((number, _MARKER.search(line.rstrip())) for number, line in enumerate(handle, 1))
        return {match.group(1): f"{THIS_FILE}:{number}" for number, match in found if match}


def defined_at(fn: Callable) -> str:
    """'file:line' where a function is defined, as the errors show it."""
    return f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}"


@pytest.fixture(name="defined_at", scope="session")
def defined_at_fixture() -> Callable[[Callable], str]:
    return defined_at


@pytest.fixture(scope="session")
def input_fn_lines() -> dict[str, str]:
    """'file:line' of the shuffle, repeat and batch calls in make_input_fn's pipeline, and of the tensors it
    returns with dataset=False ("tensors")."""
    return _marker_lines()


@pytest.fixture(scope="session")
def model_fn_lines() -> dict[str, str]:
    """'file:line' of the lines of make_model_fn that errors name: "metric" (its eval_metric_ops)."""
    return _marker_lines()


# --------------------------------------------------------------------------- environment, estimators


class TFConfig:
    """Sets or clears the TF_CONFIG environment variable for one test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._monkeypatch = monkeypatch

    def set(self, value: dict[str, Any] | str = DEFAULT_TF_CONFIG) -> None:
        self._monkeypatch.setenv("TF_CONFIG", value if isinstance(value, str) else json.dumps(value))

    def clear(self) -> None:
        self._monkeypatch.delenv("TF_CONFIG", raising=False)


@pytest.fixture
def tf_config(monkeypatch) -> TFConfig:
    """TF_CONFIG starts as the default single chief (what the example scripts set); .set()/.clear() change it."""
    config = TFConfig(monkeypatch)
    config.set()
    return config


@pytest.fixture
def model_dir(tmp_path) -> str:
    """A model_dir that does not exist yet."""
    return str(tmp_path / "model")


def build_estimator(model_dir: str, model_fn: Callable | None = None, cs_ip: str | None = CS_IP, config: Any = None,
                    params: dict[str, Any] | None = None, **config_kwargs: Any) -> CerebrasEstimator:
    """A CerebrasEstimator on `model_dir` with params {"batch_size": BATCH_SIZE, **params}.

    model_fn defaults to make_model_fn(); config to CSRunConfig(cs_ip=cs_ip, **config_kwargs), built now
    (so with the TF_CONFIG of the moment).
    """
    return CerebrasEstimator(
        model_fn or make_model_fn(),
        model_dir=model_dir,
        config=config if config is not None else CSRunConfig(cs_ip=cs_ip, **config_kwargs),
        params={"batch_size": BATCH_SIZE, **(params or {})},
    )


@pytest.fixture(name="build_estimator", scope="session")
def build_estimator_fixture() -> Callable[..., CerebrasEstimator]:
    """build_estimator(model_dir, model_fn=None, cs_ip=CS_IP, config=None, params=None, **CSRunConfig kwargs)."""
    return build_estimator


@pytest.fixture
def make_estimator(model_dir, tf_config) -> Callable[..., CerebrasEstimator]:
    """build_estimator on this test's `model_dir`, after TF_CONFIG is set (the default single chief)."""
    return functools.partial(build_estimator, model_dir)


def assert_model_dir_untouched(model_dir: str) -> None:
    assert not os.path.exists(model_dir) or not os.listdir(model_dir), (
        f"model_dir was written to: {sorted(os.listdir(model_dir))}"
    )


def assert_refused(estimator: CerebrasEstimator, error_type: type[CerebrasError], action: Callable[[], Any],
                   *fragments: str) -> CerebrasError:
    """action() raises exactly `error_type` holding every fragment, each problem has a fix, model_dir is untouched."""
    with pytest.raises(CerebrasError) as info:
        action()
    error = info.value
    message = str(error)
    assert type(error) is error_type, f"expected {error_type.__name__}, got {type(error).__name__}:\n{message}"
    missing = [fragment for fragment in fragments if fragment not in message]
    assert not missing, f"{missing} not in the message:\n{message}"
    assert all(problem.fix for problem in getattr(error, "problems", [error])), message
    assert_model_dir_untouched(estimator.model_dir)
    return error


@pytest.fixture(name="assert_refused")
def assert_refused_fixture() -> Callable[..., CerebrasError]:
    return assert_refused


@pytest.fixture(autouse=True)
def _release_simulated_systems():
    """Each test starts with no simulated CS system programmed (as a fresh process would)."""
    cerebras_tf.release_system()
    yield
    cerebras_tf.release_system()


@pytest.fixture
def float32_numerics():
    """The simulated WSE computes in float32 (no half rounding) for the test, so it matches TF on CPU."""
    previous = amp.get_half_dtype()
    amp.set_half_dtype("float32")
    try:
        yield
    finally:
        amp.set_half_dtype(previous)
        cerebras_tf.release_system()
