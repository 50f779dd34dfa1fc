"""R1.8's appliance config: the appliance's CSConfig, DebugArgs with the FullConfig JSON, and what CSX runs reach."""
from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import json_format

import cerebras_tf
from cerebras_tf import CSRunConfig
from cerebras_tf.cs_config import FULL_CONFIG_FIELD, ApplianceCSConfig
from cerebras_tf.cs_messages import PROTO_FILES, DebugArgs, ExecutionStrategy, FullConfig
from cerebras_tf.csoft.appliance import get_debug_args
from cerebras_tf.errors import CerebrasError, ConfigError, ConfigTypeError, ConfigValueError
from estimator import EstimatorSpec

THIS_FILE = os.path.abspath(__file__)
TS_ENABLED = PROTO_FILES["tri_state"]["TS_ENABLED"]


def _debug_args(full_config_json: str | None = None) -> object:
    debug_args = DebugArgs()
    if full_config_json is None:
        full = FullConfig()
        full.matching.kernel.autogen_config.try_strip_outer_dim = TS_ENABLED
        full.matching.match_lair.disabled_converters.append("UnsortedGatherConverter")
        full_config_json = json_format.MessageToJson(full, preserving_proto_field_name=True)
    debug_args.debug_crd.pipeline_options.full_config = full_config_json
    return debug_args


def appliance_config(**fields: object) -> ApplianceCSConfig:
    """The CSConfig R1.8's run_appliance builds for a one-system pipelined run."""
    defaults: dict[str, object] = dict(num_csx=1, max_wgt_servers=1, max_act_per_csx=1, mgmt_address=None,
                                       debug_args=_debug_args(), mount_dirs=[], python_paths=[],
                                       num_workers_per_csx=0, execution_strategy=ExecutionStrategy.ES_PIPELINE,
                                       job_labels=[], disable_version_check=False)
    return ApplianceCSConfig(**{**defaults, **fields})


def test_an_appliance_config_targets_the_simulated_system_without_a_cs_ip():
    config = CSRunConfig(cs_config=appliance_config(mgmt_address="mgmt.example:443"))
    assert config.cs_ip is None and config.appliance
    assert config.execution_strategy == "pipeline" and config.num_csx == 1
    plain = CSRunConfig(cs_config={"use_cbfloat16": False})
    assert not plain.appliance


@pytest.mark.parametrize("fields, error, fragment", [
    ({"execution_strategy": 7}, ConfigValueError, "CSConfig(execution_strategy=7)"),
    ({"execution_strategy": "streaming"}, ConfigValueError, "unknown execution strategy"),
    ({"num_csx": -1}, ConfigValueError, "num_csx must be an integer >= 0"),
    ({"num_workers_per_csx": True}, ConfigValueError, "num_workers_per_csx must be an integer"),
    ({"mgmt_address": 443}, ConfigTypeError, "mgmt_address must be a string"),
    ({"mount_dirs": "/data"}, ConfigTypeError, "mount_dirs must be a list of strings"),
    ({"disable_version_check": "no"}, ConfigTypeError, "disable_version_check must be True or False"),
    ({"debug_args": {"debug_ini": {}}}, ConfigTypeError, "must be a DebugArgs message"),
    ({"debug_args": _debug_args("{not json")}, ConfigValueError, FULL_CONFIG_FIELD),
    ({"debug_args": _debug_args('{"matching": {"kernal": {}}}')}, ConfigValueError, "kernal"),
])
def test_a_bad_csconfig_field_is_refused_where_it_is_built(fields, error, fragment):
    with pytest.raises(error) as caught:
        appliance_config(**fields)  # this line
    assert fragment in caught.value.message
    assert caught.value.where.startswith(f"{THIS_FILE}:") and caught.value.fix


def test_a_bad_csconfig_names_the_users_line():
    with pytest.raises(ConfigValueError) as caught:
        ApplianceCSConfig(num_csx=1, execution_strategy="pipelined")
    assert caught.value.where == f"{THIS_FILE}:{caught.tb.tb_lineno}"


def test_a_cs_config_that_is_neither_a_message_nor_a_dict_is_refused_with_the_fix():
    with pytest.raises(ConfigTypeError, match="must be a dict, a CSConfig protobuf message") as caught:
        CSRunConfig(cs_config="pipeline")
    assert caught.value.where == f"{THIS_FILE}:{caught.tb.tb_lineno}"
    assert "not str 'pipeline'" in caught.value.fix


def test_get_debug_args_reads_text_format_and_names_a_bad_file(tmp_path):
    path = tmp_path / "debug_args.txt"
    path.write_text('debug_ini { frozen_content: "x" }\ndebug_mgr { labels { key: "a" value: "b" } }\n')
    assert get_debug_args(str(path)).debug_mgr.labels["a"] == "b"
    path.write_text("debug_ini { frozen_content: 3 ")
    with pytest.raises(ConfigValueError, match="not a DebugArgs message in protobuf text format"):
        get_debug_args(str(path))
    with pytest.raises(ConfigValueError, match="cannot be read"):
        get_debug_args(str(tmp_path / "missing.txt"))


def test_csx_runs_train_on_the_simulated_system_without_tf_config(model_dir, build_estimator, make_input_fn,
                                                                   monkeypatch, caplog):
    monkeypatch.delenv("TF_CONFIG", raising=False)  # the appliance manages its own cluster
    config = CSRunConfig(cs_config=appliance_config(mgmt_address="mgmt.example:443"), save_checkpoints_steps=None)
    estimator = build_estimator(model_dir, config=config)
    with caplog.at_level(logging.INFO):
        estimator.train(make_input_fn(), max_steps=3)
    messages = [record.getMessage() for record in caplog.records]
    assert any("no Cerebras appliance cluster is reachable" in m and "'mgmt.example:443' is not contacted" in m
               for m in messages), messages
    assert tf.train.latest_checkpoint(model_dir).endswith("model.ckpt-3")
    assert os.path.isdir(os.path.join(model_dir, "cs_compile"))  # compiled for the system: not a CPU run
    cerebras_tf.release_system("mgmt.example:443")  # the system this appliance config reached
    metrics = estimator.evaluate(make_input_fn(repeat=1), steps=2, use_cs=True)
    assert metrics["global_step"] == 3


def test_cpu_runs_of_an_appliance_config_stay_plain_tensorflow(model_dir, build_estimator, make_input_fn):
    estimator = build_estimator(model_dir, config=CSRunConfig(cs_config=appliance_config()))
    estimator.train(make_input_fn(), max_steps=2, use_cs=False)
    assert not os.path.exists(os.path.join(model_dir, "cs_compile"))


@pytest.mark.parametrize("fields, fragment", [
    ({"num_csx": 2}, "num_csx=2 asks for 2 CS systems in pipelined execution"),
])
def test_what_the_simulated_system_cannot_do_is_refused_before_anything_is_written(
        fields, fragment, model_dir, build_estimator, make_input_fn, assert_refused):
    estimator = build_estimator(model_dir, config=CSRunConfig(cs_config=appliance_config(**fields)))
    assert_refused(estimator, ConfigError, lambda: estimator.train(make_input_fn(), max_steps=2), fragment)


def _metric_ops_model_fn(features, labels, mode, params):
    """A model_fn that returns eval_metric_ops, as R1.8's GPT-2 (outside the pipeline estimator) and GPT-J do."""
    output = tf.compat.v1.layers.dense(features, 1, name="out",
                                       kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=3))
    loss = tf.reduce_mean(tf.square(output - labels))
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
    weights = tf.cast(labels > 0, tf.float32)
    metrics = {"eval/mae": tf.compat.v1.metrics.mean_absolute_error(labels, output, weights=weights),
               "eval/mean_output": tf.compat.v1.metrics.mean(output)}
    return EstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


def test_an_appliance_evaluation_runs_the_models_eval_metric_ops_on_the_host(
        model_dir, build_estimator, make_input_fn, float32_numerics):
    estimator = build_estimator(model_dir, _metric_ops_model_fn, config=CSRunConfig(cs_config=appliance_config()))
    estimator.train(make_input_fn(), max_steps=3, use_cs=False)
    on_system = estimator.evaluate(make_input_fn(shuffle=False, repeat=1), steps=2, use_cs=True)
    on_cpu = estimator.evaluate(make_input_fn(shuffle=False, repeat=1), steps=2)
    assert set(on_system) == set(on_cpu) == {"eval/mae", "eval/mean_output", "loss", "global_step"}
    for key in on_cpu:
        np.testing.assert_allclose(on_system[key], on_cpu[key], rtol=1e-5, err_msg=key)
    container = build_estimator(model_dir, _metric_ops_model_fn)  # a cs_ip: host_call is how metrics are computed
    with pytest.raises(CerebrasError, match="Detected unsupported eval_metric_ops in CS system evaluation run"):
        container.evaluate(make_input_fn(shuffle=False, repeat=1), steps=2, use_cs=True)


def test_weight_streaming_trains_evaluates_and_predicts_the_same_numbers_as_pipelined(
        tmp_path, build_estimator, make_input_fn, monkeypatch):
    """The simulated system computes the same math in both execution modes: only the layout differs."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    results = {}
    for strategy in ("pipeline", "weight_streaming"):
        model_dir = str(tmp_path / strategy)
        address = f"{strategy}.example:443"
        config = CSRunConfig(cs_config=appliance_config(mgmt_address=address, execution_strategy=strategy),
                             save_checkpoints_steps=None, tf_random_seed=11)
        estimator = build_estimator(model_dir, config=config)
        estimator.train(make_input_fn(shuffle=False), max_steps=3)
        cerebras_tf.release_system(address)
        metrics = estimator.evaluate(make_input_fn(repeat=1, shuffle=False), steps=2, use_cs=True)
        cerebras_tf.release_system(address)
        predicted = estimator.predict(make_input_fn(repeat=1, shuffle=False), use_cs=True)
        predictions = [p for _, p in zip(range(4), predicted)]
        cerebras_tf.release_system(address)
        weights = {name: estimator.get_variable_value(name) for name in estimator.get_variable_names()}
        report = json.loads(open(os.path.join(model_dir, "cs_compile", "train", "report.json")).read())
        results[strategy] = metrics, predictions, weights, report
    (m1, p1, w1, r1), (m2, p2, w2, r2) = results["pipeline"], results["weight_streaming"]
    assert "execution_strategy" not in r1 and r2["execution_strategy"] == "weight_streaming"
    assert all(np.array_equal(w1[name], w2[name]) for name in w1), {n: (w1[n], w2[n]) for n in w1}
    assert m1 == m2
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(p1, p2))
