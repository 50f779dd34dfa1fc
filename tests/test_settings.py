"""CSSettings: a run's config and environment, resolved once, frozen, and passed down."""
from __future__ import annotations

import dataclasses
import inspect
import json
import os
import pathlib
import re

import pytest
import tensorflow as tf

from estimator import RunConfig
from cerebras_tf import CSRunConfig, errors
from cerebras_tf import cluster as cluster_module
from cerebras_tf import run_config as run_config_module
from cerebras_tf.cs_config import PIPELINE, WEIGHT_STREAMING
from cerebras_tf.input_workers import InputStream
from cerebras_tf.input_workers import stream as stream_module
from cerebras_tf.rules.config import check_tf_config
from cerebras_tf.run_config import DEFAULT_INPUT_WORKER_TIMEOUT_SECS
from cerebras_tf.settings import DEFAULT_LOG_STEP_COUNT_STEPS, CSSettings
from cerebras_tf.wse.fabric import WSE1, WSE2

ROOT = pathlib.Path(__file__).resolve().parents[1]
THIS_FILE = os.path.abspath(__file__)
CS_IP = "localhost:9000"
TWO_WORKERS = json.dumps({"cluster": {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223", "127.0.0.1:2224"]},
                          "task": {"type": "chief", "index": 0}})


def test_a_plain_run_config_resolves_to_the_cs_defaults():
    settings = CSSettings.resolve(RunConfig(), environ={})
    assert not settings.on_cs_system
    assert (settings.cs_ip, settings.system_name, settings.fabric, settings.half_dtype) == (None, None, WSE2, None)
    assert (settings.num_csx, settings.execution_strategy, settings.created_at) == (1, PIPELINE, None)
    workers = settings.input_workers
    assert (workers.plan.mode, workers.num_workers, workers.cluster.workers) == ("local", 1, ())
    assert workers.timeout_secs == DEFAULT_INPUT_WORKER_TIMEOUT_SECS and workers.global_seed is None
    assert settings.save_checkpoints_steps is None and settings.run_config_args["save_checkpoints_secs"] == 600
    assert (settings.log_step_count_steps, settings.keep_checkpoint_max) == (100, 5)
    assert (settings.tf_config, settings.tf_config_error, settings.input_workers_error) == (None, None, None)


def test_a_cs_run_config_resolves_to_its_fields():
    line = inspect.currentframe().f_lineno + 1
    config = CSRunConfig(cs_ip=CS_IP, system_name="cs2-a", num_input_workers=2, input_worker_timeout_secs=7,
                         tf_random_seed=3, save_checkpoints_steps=200, log_step_count_steps=None,
                         cs_config={"fabric": "WSE-1", "use_cbfloat16": True, "num_csx": 2,
                                    "execution_strategy": "weight_streaming"})
    settings = CSSettings.resolve(config, environ={})
    assert settings.on_cs_system and (settings.cs_ip, settings.system_name) == (CS_IP, "cs2-a")
    assert (settings.fabric, settings.half_dtype, settings.num_csx) == (WSE1, "cbfloat16", 2)
    assert settings.execution_strategy == WEIGHT_STREAMING
    assert (settings.input_workers.plan.mode, settings.input_workers.num_workers) == ("embedded", 2)
    assert (settings.input_workers.timeout_secs, settings.tf_random_seed) == (7.0, 3)
    assert (settings.save_checkpoints_steps, settings.log_step_count_steps) == (200, DEFAULT_LOG_STEP_COUNT_STEPS)
    assert "save_checkpoints_secs" not in settings.run_config_args
    assert settings.created_at == f"{THIS_FILE}:{line}"


def test_settings_are_frozen():
    settings = CSSettings.resolve(CSRunConfig(cs_ip=CS_IP), environ={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.cs_ip = "elsewhere:1"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.input_workers.timeout_secs = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        settings.run_config_args["protocol"] = "grpc"  # type: ignore[index]


def test_tf_config_is_read_from_the_environment_when_the_run_starts():
    config = CSRunConfig(cs_ip=CS_IP)  # built before TF_CONFIG lists the workers
    settings = CSSettings.resolve(config, environ={"TF_CONFIG": TWO_WORKERS})
    assert (settings.input_workers.plan.mode, settings.input_workers.num_workers) == ("cluster", 2)
    assert settings.input_workers.cluster.workers == ("127.0.0.1:2223", "127.0.0.1:2224")
    assert settings.tf_config == TWO_WORKERS and check_tf_config(settings) == []


def test_the_global_seed_is_resolved_when_the_run_starts():
    tf.random.set_seed(5)
    try:
        assert CSSettings.resolve(CSRunConfig(), environ={}).input_workers.global_seed == 5
    finally:
        tf.random.set_seed(None)
    assert CSSettings.resolve(CSRunConfig(), environ={}).input_workers.global_seed is None


# --------------------------------------------------------------------------- each rule once, one error type


def test_resolving_never_raises_and_tf_config_problems_are_reported_once_by_the_rule():
    malformed = CSSettings.resolve(CSRunConfig(cs_ip=CS_IP), environ={"TF_CONFIG": "{not json"})
    assert isinstance(malformed.tf_config_error, errors.ConfigError)
    assert malformed.input_workers.plan.mode == "local"  # a lone chief meanwhile (compile() ignores TF_CONFIG)
    [problem] = check_tf_config(malformed)
    assert "TF_CONFIG field 'TF_CONFIG': not valid JSON" in problem.message and "export TF_CONFIG=" in problem.fix

    contradicting = CSSettings.resolve(CSRunConfig(cs_ip=CS_IP, num_input_workers=3),
                                       environ={"TF_CONFIG": TWO_WORKERS})
    assert contradicting.tf_config_error is None and contradicting.input_workers.num_workers == 3
    assert check_tf_config(contradicting) == [contradicting.input_workers_error]
    assert "num_input_workers=3 does not match the 2 task(s)" in contradicting.input_workers_error.message

    [unset] = check_tf_config(CSSettings.resolve(CSRunConfig(cs_ip=CS_IP), environ={}))
    assert "must be set" in unset.message


def test_a_worker_count_contradicting_tf_config_refuses_training_before_anything_is_written(
        make_estimator, make_input_fn, assert_refused, tf_config):
    tf_config.set(TWO_WORKERS)
    estimator = make_estimator(num_input_workers=3)
    assert_refused(estimator, errors.ConfigError, lambda: estimator.train(make_input_fn(), max_steps=2),
                   "num_input_workers=3 does not match the 2 task(s) in TF_CONFIG field 'cluster.worker'")
    estimator.compile(make_input_fn(), validate_only=True)  # compile() does not apply the TF_CONFIG rule


def test_the_worker_count_is_checked_once_when_the_config_is_built(monkeypatch):
    calls = []

    def counting(value, caller="CSRunConfig"):
        calls.append(caller)
        return cluster_module.check_num_input_workers(value, caller)

    monkeypatch.setattr(run_config_module, "check_num_input_workers", counting)
    monkeypatch.setattr(stream_module, "check_num_input_workers", counting)
    with pytest.raises(ValueError, match=r"CSRunConfig\(num_input_workers=0\) must be a positive integer"):
        CSRunConfig(cs_ip=CS_IP, num_input_workers=0)
    calls.clear()
    config = CSRunConfig(cs_ip=CS_IP, num_input_workers=1)
    settings = CSSettings.resolve(config, environ={})
    with InputStream.from_settings(lambda params: tf.data.Dataset.range(4).batch(2), {},
                                   settings.input_workers) as stream:
        assert next(stream)[0].tolist() == [0, 1]
    assert calls == ["CSRunConfig"]  # the settings and the stream take the validated count


def test_each_call_resolves_the_settings_once_and_passes_them_down(
        make_estimator, make_input_fn, monkeypatch, float32_numerics):
    resolved = []
    original = CSSettings.resolve.__func__

    def counting(cls, config, environ=os.environ, **where):
        resolved.append(config)
        return original(cls, config, environ, **where)

    monkeypatch.setattr(CSSettings, "resolve", classmethod(counting))
    estimator = make_estimator(save_checkpoints_steps=None)
    estimator.train(make_input_fn(), max_steps=2)
    estimator.compile(make_input_fn(), validate_only=True)
    assert len(resolved) == 2


def test_only_the_settings_module_reads_cs_fields_off_a_config():
    pattern = re.compile(r"getattr\((self\.|estimator\.)?config\b|(?<!\w)_num_input_workers")
    allowed = {"cerebras_tf/settings.py", "cerebras_tf/run_config.py"}
    offending = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(ROOT.joinpath("cerebras_tf").rglob("*.py"))
        if str(path.relative_to(ROOT)) not in allowed
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offending
