"""Issue 16, classes 6 and 7, and issue 13 item 6: arguments the CS path cannot use. params that is not a dict,
a bad input-worker count, an unusable model_dir or compile_dir, an unknown compile mode, an input_fn that is not
callable, a pipeline that cannot be built (batch(0)), a plain tf.estimator.RunConfig: each refused with what was
wrong, before the first byte is written."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import tensorflow as tf
from bad_input_helpers import BATCH, X, Y, estimator, refused, regression_input_fn, regressor

from cerebras_tf import CerebrasEstimator, CSRunConfig
from cerebras_tf.errors import (
    ConfigError,
    ConfigValueError,
    EstimatorArgumentError,
    InputFunctionError,
    ModelDirError,
)
from estimator import RunConfig  # tf.estimator.RunConfig (or the runtime's, which has the same defaults)

HERE = __file__


def _line_of(text: str) -> str:
    """'file:line' of the first line of this file containing `text`."""
    with open(HERE, encoding="utf-8") as handle:
        return next(f"{HERE}:{n}" for n, line in enumerate(handle, 1) if text in line)


# --------------------------------------------------------------------------- params


@pytest.mark.parametrize("params, shown", [
    ([1, 2], "got list [1, 2]"),
    ("batch_size=4", "got str 'batch_size=4'"),
    (4, "got int 4"),
    ((("batch_size", 4),), "got tuple (('batch_size', 4),)"),
])
@pytest.mark.parametrize("call", ["train", "compile"])
def test_params_that_is_not_a_dict(model_dir, params, shown, call):
    config = CSRunConfig(cs_ip="localhost:9000")
    est = CerebrasEstimator(regressor(), model_dir, config=config, params=params)  # marker: params
    action = {"train": lambda: est.train(regression_input_fn(), max_steps=2),
              "compile": lambda: est.compile(regression_input_fn(), validate_only=True)}[call]
    error = refused(action, EstimatorArgumentError, "params must be a dict", shown,
                    f"Where: {_line_of('# marker: params')}", model_dir=model_dir)
    assert "CerebrasEstimator(params={...})" in error.fix


# --------------------------------------------------------------------------- CSRunConfig arguments


@pytest.mark.parametrize("kwargs, message", [
    ({"num_input_workers": True}, "CSRunConfig(num_input_workers=True) must be a positive integer."),
    ({"num_input_workers": 0}, "CSRunConfig(num_input_workers=0) must be a positive integer."),
    ({"num_input_workers": "2"}, "CSRunConfig(num_input_workers='2') must be a positive integer."),
    ({"num_input_workers": 2.5}, "CSRunConfig(num_input_workers=2.5) must be a positive integer."),
    ({"cs_ip": ""}, "cs_ip must be a non-empty 'host:port' string or None."),
    ({"cs_ip": 9000}, "CSRunConfig(cs_ip=9000)"),
    ({"cs_ip": "localhost:9000:9000"}, "CSRunConfig(cs_ip='localhost:9000:9000'): cs_ip must be 'host' or "
                                        "'host:port'"),
    ({"cs_ip": "10.0.0.1:99999"}, "a port from 1 to 65535"),
    ({"cs_ip": "cs 1:9000"}, "cs_ip must be 'host' or 'host:port'"),
    ({"input_worker_timeout_secs": -1}, "CSRunConfig(input_worker_timeout_secs=-1) must be a positive number."),
])
def test_csrunconfig_arguments_are_refused_when_the_config_is_built(model_dir, kwargs, message):
    error = refused(lambda: CSRunConfig(**kwargs), ConfigValueError, message, model_dir=model_dir)
    assert isinstance(error, ValueError)  # as tf.estimator.RunConfig refuses its own arguments


# --------------------------------------------------------------------------- model_dir and compile_dir


def test_model_dir_that_is_a_regular_file(tmp_path):
    path = tmp_path / "model"
    path.write_text("a file where the model_dir should be")
    est = estimator(str(path))
    refused(lambda: est.train(regression_input_fn(), max_steps=2), ModelDirError,
            f"model_dir {path} is a regular file, not a directory.", "CerebrasEstimator(model_dir=...)",
            model_dir=str(path))


def test_model_dir_inside_a_regular_file(tmp_path):
    parent = tmp_path / "runs"
    parent.write_text("")
    est = estimator(str(parent / "model"))
    refused(lambda: est.train(regression_input_fn(), max_steps=2), ModelDirError,
            f"model_dir {parent / 'model'} cannot be created: {parent} is a regular file.", model_dir=str(parent))


def test_model_dir_that_is_read_only(tmp_path, read_only_dir):
    path = read_only_dir(str(tmp_path / "model"))
    est = estimator(path)
    refused(lambda: est.train(regression_input_fn(), max_steps=2), ModelDirError,
            f"model_dir {path} is not writable by this process.", "chmod u+w", model_dir=path)


def test_model_dir_under_a_read_only_directory(tmp_path, read_only_dir):
    parent = read_only_dir(str(tmp_path / "runs"))
    est = estimator(os.path.join(parent, "model"))
    refused(lambda: est.train(regression_input_fn(), max_steps=2), ModelDirError,
            f"cannot be created: {parent} is not writable by this process.", model_dir=parent)


def test_a_read_only_model_dir_with_a_checkpoint_refuses_evaluation_on_the_system(prior_checkpoint, read_only_dir):
    read_only_dir(prior_checkpoint)  # evaluation writes its summaries to model_dir/eval
    est = estimator(prior_checkpoint)
    refused(lambda: est.evaluate(regression_input_fn(), steps=1, use_cs=True), ModelDirError, "is not writable",
            model_dir=prior_checkpoint)


def test_compile_dir_that_is_a_regular_file(model_dir, tmp_path):
    compile_dir = tmp_path / "artifact"
    compile_dir.write_text("")
    est = estimator(model_dir, compile_dir=str(compile_dir))
    refused(lambda: est.compile(regression_input_fn()), ModelDirError,
            f"compile_dir {compile_dir} is a regular file", "CerebrasEstimator(compile_dir=...)", model_dir=model_dir)
    assert compile_dir.read_text() == ""


def test_compile_dir_that_is_read_only(model_dir, tmp_path, read_only_dir):
    compile_dir = read_only_dir(str(tmp_path / "artifact"))
    est = estimator(model_dir, compile_dir=compile_dir)
    refused(lambda: est.train(regression_input_fn(), max_steps=2), ModelDirError,
            f"compile_dir {compile_dir} is not writable", model_dir=model_dir)


def test_validation_writes_nothing_so_it_needs_no_writable_model_dir(tmp_path):
    path = tmp_path / "model"
    path.write_text("")
    result = estimator(str(path)).compile(regression_input_fn(), validate_only=True)
    assert result.validate_only and path.read_text() == ""


# --------------------------------------------------------------------------- compile(mode=...)


@pytest.mark.parametrize("mode", ["serve", "training", "TRAIN", None, 0])
def test_compile_mode_must_be_one_of_the_estimators(model_dir, mode):
    est = estimator(model_dir)
    refused(lambda: est.compile(regression_input_fn(), mode=mode), EstimatorArgumentError,
            f"compile(mode={mode!r}): unknown mode; the valid modes are 'train', 'eval', 'infer'.",
            f"Where: {HERE}", model_dir=model_dir)


# --------------------------------------------------------------------------- input_fn


def _dataset():
    return tf.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(BATCH, drop_remainder=True)


@pytest.mark.parametrize("input_fn, shown, fix", [
    (5, "got int 5", "Pass the function itself"),
    (None, "got NoneType None", "Pass the function itself"),
    ("input_fn", "got str 'input_fn'", "Pass the function itself"),
    ((X, Y), "got tuple", "not its result"),
    ("dataset", "got a tf.data.Dataset", "Pass the function that builds it"),
])
def test_input_fn_that_is_not_callable(model_dir, input_fn, shown, fix):
    input_fn = _dataset() if input_fn == "dataset" else input_fn
    est = estimator(model_dir)
    error = refused(lambda: est.train(input_fn, max_steps=2), InputFunctionError,  # marker: train(input_fn)
                    "input_fn must be a callable that returns a tf.data.Dataset", shown,
                    f"Where: {_line_of('# marker: train(input_fn)')}", model_dir=model_dir)
    assert fix in error.fix


def _batched(size):
    def input_fn(params):
        return tf.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(size, drop_remainder=True)  # marker: batch
    return input_fn


@pytest.mark.parametrize("size, tf_message", [
    (0, "Batch size must be greater than zero."),  # TF: when the pipeline first runs ("Graph execution error")
    (-1, "Dimension -1 must be >= 0"),  # TF: a ValueError from inside Dataset.batch, as input_fn defines it
])
def test_a_batch_size_that_is_not_positive(model_dir, size, tf_message):
    est = estimator(model_dir)
    refused(lambda: est.train(_batched(size), max_steps=2), InputFunctionError,
            f"dataset.batch({size}): the batch size must be a positive integer, got {size}",
            tf_message, f"Where: {_line_of('# marker: batch')}", model_dir=model_dir)


def test_a_batch_size_of_zero_from_params(model_dir):
    est = estimator(model_dir, params={"batch_size": 0})
    refused(lambda: est.compile(regression_input_fn(), validate_only=True), InputFunctionError,
            "dataset.batch(0)", "params['batch_size']", model_dir=model_dir)


def test_another_pipeline_op_that_cannot_be_built(model_dir):
    def input_fn(params):
        dataset = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(0)  # marker: shuffle
        return dataset.repeat().batch(params["batch_size"], drop_remainder=True)

    est = estimator(model_dir)
    refused(lambda: est.train(input_fn, max_steps=2), InputFunctionError,
            "ShuffleDataset fails with: buffer_size must be greater than zero",
            f"Where: {_line_of('# marker: shuffle')}", model_dir=model_dir)


# --------------------------------------------------------------------------- a plain tf.estimator.RunConfig


def test_a_plain_run_config_names_its_default_checkpoint_secs(model_dir):
    est = CerebrasEstimator(regressor(), model_dir=model_dir, config=RunConfig(),  # marker: plain
                            params={"batch_size": BATCH})
    error = refused(lambda: est.compile(regression_input_fn(), validate_only=True), ConfigError,
                    "save_checkpoints_secs=600 is not supported on the CS system. 600 is tf.estimator.RunConfig's "
                    "default", f"Where: {_line_of('# marker: plain')}", model_dir=model_dir)
    assert "cerebras_tf.CSRunConfig(cs_ip=...," in error.fix and "save_checkpoints_steps=N" in error.fix


def test_an_explicit_checkpoint_secs_is_not_called_a_default(model_dir):
    config = CSRunConfig(cs_ip="localhost:9000", save_checkpoints_secs=600)
    est = CerebrasEstimator(regressor(), model_dir=model_dir, config=config, params={"batch_size": BATCH})
    error = refused(lambda: est.compile(regression_input_fn(), validate_only=True), ConfigError,
                    "save_checkpoints_secs=600 is not supported", model_dir=model_dir)
    assert "default" not in error.message


@pytest.mark.parametrize("config, level, words", [
    (RunConfig(), logging.WARNING, "config is a plain tf.estimator.RunConfig, which has no cs_ip"),
    (CSRunConfig(), logging.INFO, "the CSRunConfig has no cs_ip"),
])
def test_use_cs_without_a_cs_ip_says_so_in_one_line(model_dir, caplog, config, level, words):
    est = CerebrasEstimator(regressor(), model_dir=model_dir, config=config, params={"batch_size": BATCH})
    with caplog.at_level(logging.INFO, logger="tensorflow"):
        est.train(regression_input_fn(), max_steps=1, use_cs=True)
        est.evaluate(regression_input_fn(), steps=1)  # use_cs=False by default: nothing to say
    lines = [r for r in caplog.records if "use_cs=True) runs on CPU/GPU" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == level and words in lines[0].getMessage()
    assert lines[0].getMessage().startswith("train(use_cs=True) runs on CPU/GPU with the plain Estimator")
    assert np.isfinite(est.evaluate(regression_input_fn(), steps=1)["loss"])


# --------------------------------------------------------------------------- model_fn


@pytest.mark.parametrize("model_fn, shown", [
    (None, "got NoneType None"),
    ("model_fn", "got str 'model_fn'"),
    (5, "got int 5"),
])
def test_a_model_fn_that_is_not_callable_is_refused_where_the_estimator_is_built(tmp_path, model_fn, shown):
    model_dir = tmp_path / "model"
    with pytest.raises(EstimatorArgumentError) as info:
        CerebrasEstimator(model_fn, model_dir=str(model_dir))  # not callable
    message = str(info.value)
    assert "model_fn must be a function" in message and shown in message
    assert _line_of("CerebrasEstimator(model_fn, model_dir=str(model_dir))  # not callable") in message
    assert not model_dir.exists()
