"""CS-system rules on the run configuration (rules 8-10) and CSRunConfig itself."""
from __future__ import annotations

import inspect
import json
import os
import re

import pytest
import tensorflow as tf
from tensorflow.python.distribute.distribute_config import DistributeConfig  # no public alias in TF 2.15

import estimator as estimator_api
from estimator import ModeKeys, RunConfig
from cerebras_tf import CSRunConfig, errors, set_default_tf_config
from cerebras_tf.errors import ConfigError
from cerebras_tf.rules.config import MIN_SAVE_CHECKPOINTS_STEPS

THIS_FILE = os.path.abspath(__file__)


def _place_on_cpu(op):
    return "/cpu:0"


# Each RunConfig parameter the Cerebras documentation lists as not supported, with a value that sets it.
UNSUPPORTED = {
    "save_checkpoints_secs": lambda: 60,
    "train_distribute": lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
    "device_fn": lambda: _place_on_cpu,
    "protocol": lambda: "grpc",
    "eval_distribute": lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
    "experimental_distribute": lambda: DistributeConfig(),
    "experimental_max_worker_delay_secs": lambda: 10,
}


# --------------------------------------------------------------------------- rule 8


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_each_unsupported_run_config_parameter_is_refused_on_cs(make_estimator, make_input_fn, assert_refused, name):
    estimator = make_estimator(**{name: UNSUPPORTED[name]()})
    assert_refused(estimator, errors.ConfigError, lambda: estimator.train(make_input_fn(), max_steps=5),
                   "[Unsupported Config]", f"RunConfig parameter {name}=", "is not supported on the CS system")


def test_plain_run_config_default_checkpoint_secs_is_refused(make_estimator, make_input_fn, assert_refused):
    plain = RunConfig()
    assert plain.save_checkpoints_secs == 600  # tf.estimator's default, which the CS system does not support
    estimator = make_estimator(config=plain)
    assert_refused(estimator, errors.ConfigError, lambda: estimator.compile(make_input_fn(), validate_only=True),
                   "save_checkpoints_secs=600", "600 is tf.estimator.RunConfig's default",
                   "cerebras_tf.CSRunConfig(cs_ip=...", "save_checkpoints_steps=N")


def test_cs_run_config_checkpoints_by_steps_by_default(make_estimator, make_input_fn):
    config = CSRunConfig(cs_ip="localhost:9000")
    assert config.save_checkpoints_secs is None
    assert config.save_checkpoints_steps >= MIN_SAVE_CHECKPOINTS_STEPS
    make_estimator(config=config).compile(make_input_fn(), validate_only=True)


def test_config_error_names_where_the_config_was_built(make_estimator, make_input_fn, assert_refused):
    config = CSRunConfig(cs_ip="localhost:9000", protocol="grpc")
    line = inspect.currentframe().f_lineno - 1
    estimator = make_estimator(config=config)
    assert_refused(estimator, errors.ConfigError, lambda: estimator.compile(make_input_fn(), validate_only=True),
                   f"Where: {THIS_FILE}:{line}")


# --------------------------------------------------------------------------- rule 9


def test_save_checkpoints_steps_below_the_lower_bound_is_refused(make_estimator, make_input_fn, assert_refused):
    too_often = MIN_SAVE_CHECKPOINTS_STEPS - 1
    estimator = make_estimator(save_checkpoints_steps=too_often)
    assert_refused(estimator, errors.ConfigError, lambda: estimator.train(make_input_fn(), max_steps=5),
                   f"save_checkpoints_steps={too_often}", f"lower bound of {MIN_SAVE_CHECKPOINTS_STEPS}")


@pytest.mark.parametrize("steps", [MIN_SAVE_CHECKPOINTS_STEPS, None])
def test_save_checkpoints_steps_at_the_bound_or_unset_is_accepted(make_estimator, make_input_fn, steps):
    estimator = make_estimator(save_checkpoints_steps=steps)
    assert estimator.config.save_checkpoints_secs is None
    estimator.compile(make_input_fn(), validate_only=True)


# --------------------------------------------------------------------------- rule 10


def _valid_tf_config_in(message: str) -> str:
    """The TF_CONFIG value the message suggests, checked to be a valid single-chief config."""
    match = re.search(r"TF_CONFIG='([^']+)'", message)
    assert match, message
    value = json.loads(match.group(1))
    assert value["cluster"]["chief"] and value["task"] == {"type": "chief", "index": 0}
    return match.group(1)


def test_missing_tf_config_is_refused_with_a_valid_value_that_then_works(
        make_estimator, make_input_fn, assert_refused, tf_config):
    tf_config.clear()
    estimator = make_estimator()
    error = assert_refused(estimator, errors.ConfigError, lambda: estimator.train(make_input_fn(), max_steps=5),
                           "The TF_CONFIG environment variable must be set for training on the CS system")
    tf_config.set(_valid_tf_config_in(str(error)))
    estimator.train(make_input_fn(), max_steps=5)  # now every rule passes: it trains on the simulated WSE
    assert tf.train.latest_checkpoint(estimator.model_dir).endswith("model.ckpt-5")


@pytest.mark.parametrize("value, fragment", [
    ("{not json", "TF_CONFIG field 'TF_CONFIG': not valid JSON"),
    (json.dumps({"cluster": {"worker": ["localhost:2223"]}, "task": {"type": "worker", "index": 0}}),
     "TF_CONFIG field 'cluster.chief': missing"),
    (json.dumps({"cluster": {"chief": ["localhost:2222"], "worker": ["localhost:2222"]}}),
     "TF_CONFIG field 'cluster.worker[0]': duplicate address 'localhost:2222', already used by cluster.chief[0]"),
])
def test_malformed_tf_config_is_refused(make_estimator, make_input_fn, assert_refused, tf_config, value, fragment):
    estimator = make_estimator()
    tf_config.set(value)  # after the RunConfig, which parses TF_CONFIG itself when built
    error = assert_refused(estimator, errors.ConfigError, lambda: estimator.train(make_input_fn(), max_steps=5),
                           fragment)
    _valid_tf_config_in(str(error))


def test_compile_does_not_need_tf_config_but_its_report_warns_that_training_will(
        make_estimator, make_input_fn, tf_config):
    tf_config.clear()
    estimator = make_estimator()
    result = estimator.compile(make_input_fn(), validate_only=True)
    assert result.validate_only
    assert "TF_CONFIG" not in os.environ
    [warning] = result.warnings
    assert isinstance(warning, errors.ConfigError)
    assert warning.message == "The TF_CONFIG environment variable must be set for training on the CS system."
    head, _, warnings = result.report.partition("\nWarnings (")
    assert "TF_CONFIG" not in head
    assert warning.message in warnings and "train(use_cs=True)" in warnings
    _valid_tf_config_in(warnings)
    evaluation = estimator.compile(make_input_fn(), validate_only=True, mode=ModeKeys.EVAL)
    assert not evaluation.warnings  # evaluation does not need TF_CONFIG

    tf_config.set()
    result = estimator.compile(make_input_fn(), validate_only=True)
    assert not result.warnings and "Warnings" not in result.report


def test_set_default_tf_config_sets_a_chief_and_keeps_an_existing_value(tf_config):
    tf_config.clear()
    set_default_tf_config()
    _valid_tf_config_in(f"TF_CONFIG='{os.environ['TF_CONFIG']}'")
    tf_config.set({"cluster": {"chief": ["host:1"]}, "task": {"type": "chief", "index": 0}})
    set_default_tf_config()
    assert json.loads(os.environ["TF_CONFIG"])["cluster"]["chief"] == ["host:1"]


# --------------------------------------------------------------------------- CSRunConfig


def test_cs_run_config_is_a_run_config_for_cpu_by_default():
    config = CSRunConfig(tf_random_seed=3)
    assert isinstance(config, estimator_api.RunConfig)
    if estimator_api.BACKEND == "tf.estimator":
        assert isinstance(config, tf.estimator.RunConfig)
    assert (config.cs_ip, config.system_name, config.tf_random_seed) == (None, None, 3)
    assert (config.cs_config, config.stack_params) == ({}, {})


@pytest.mark.parametrize("cs_ip", ["", "   ", 9000])
def test_cs_ip_must_be_a_non_empty_string(cs_ip):
    with pytest.raises(ValueError, match="cs_ip must be a non-empty 'host:port' string or None"):
        CSRunConfig(cs_ip=cs_ip)


def test_system_name_defaults_to_the_cs_ip():
    assert CSRunConfig(cs_ip="10.0.0.1:9000").system_name == "10.0.0.1:9000"
    assert CSRunConfig(cs_ip="10.0.0.1:9000", system_name="cs2-a").system_name == "cs2-a"


@pytest.mark.parametrize("kwargs, error", [
    ({"cs_config": ["fabric"]}, TypeError),
    ({"stack_params": "x"}, TypeError),
    ({"num_input_workers": 0}, ValueError),
])
def test_invalid_cs_arguments_are_refused(kwargs, error):
    with pytest.raises(error, match=next(iter(kwargs))):
        CSRunConfig(cs_ip="localhost:9000", **kwargs)


def test_num_input_workers_comes_from_the_tf_config_worker_count(tf_config):
    assert CSRunConfig(cs_ip="localhost:9000").num_input_workers == 1  # the default single chief
    tf_config.set({"cluster": {"chief": ["localhost:2222"], "worker": ["w:1", "w:2", "w:3"]},
                   "task": {"type": "chief", "index": 0}})
    assert CSRunConfig(cs_ip="localhost:9000").num_input_workers == 3
    assert CSRunConfig(cs_ip="localhost:9000", num_input_workers=2).num_input_workers == 2
    tf_config.clear()
    assert CSRunConfig(cs_ip="localhost:9000").num_input_workers == 1


@pytest.mark.parametrize("value, fragment", [
    ('{"cluster": not json', "TF_CONFIG field 'TF_CONFIG': not valid JSON"),
    ("[]", "TF_CONFIG field 'TF_CONFIG': expected a JSON object, got list"),
    ("", "TF_CONFIG is set but empty"),
    ('{"cluster": ["localhost:2222"]}', "TF_CONFIG field 'cluster': expected an object"),
    ('{"cluster": {"chief": ["localhost:2222"]}, "task": "chief"}', "TF_CONFIG field 'task': expected an object"),
])
def test_a_malformed_tf_config_is_named_when_the_config_is_built(value, fragment, monkeypatch):
    """tf.estimator's RunConfig reads TF_CONFIG when built and fails with a raw JSONDecodeError/AttributeError."""
    monkeypatch.setenv("TF_CONFIG", value)
    with pytest.raises(ConfigError) as caught:
        CSRunConfig(cs_ip="localhost:9000")
    assert fragment in caught.value.message and caught.value.fix
    assert caught.value.where == f"{os.path.abspath(__file__)}:{caught.tb.tb_lineno}"


def test_a_tf_config_with_parameter_servers_still_builds_a_config_for_cpu_runs(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["localhost:2222"], "ps": ["localhost:2223"]},
                                                "task": {"type": "chief", "index": 0}}))
    assert CSRunConfig().cs_ip is None  # distribution is the parent Estimator's business on CPU/GPU
