"""TF_CONFIG parsing and where input runs: clear errors naming the field."""
from __future__ import annotations

import json

import pytest

from cerebras_tf.cluster import Cluster, check_num_input_workers, input_worker_count, parse_tf_config, \
    plan_input_workers
from cerebras_tf.errors import ConfigError


def _config(cluster: dict, task: dict | None = None) -> str:
    body: dict = {"cluster": cluster}
    if task is not None:
        body["task"] = task
    return json.dumps(body)


def test_parses_chief_and_workers_for_a_worker_task():
    cluster = parse_tf_config(_config(
        {"chief": ["127.0.0.1:5000"], "worker": ["127.0.0.1:5001", "127.0.0.1:5002"]},
        {"type": "worker", "index": 1},
    ))
    assert cluster == Cluster("127.0.0.1:5000", ("127.0.0.1:5001", "127.0.0.1:5002"), "worker", 1)
    assert cluster.worker_name(1) == "worker:1 (127.0.0.1:5002)"
    assert parse_tf_config(cluster.tf_config("worker", 0)).task_index == 0


def test_no_tf_config_is_a_lone_chief():
    cluster = parse_tf_config(None)
    assert cluster.workers == () and cluster.task_type == "chief"


@pytest.mark.parametrize(
    "raw, field, words",
    [
        ("{not json", "'TF_CONFIG'", "not valid JSON"),
        ("[1, 2]", "'TF_CONFIG'", "JSON object"),
        (_config({"worker": ["127.0.0.1:5001"]}), "'cluster.chief'", "missing"),
        (_config({"chief": ["a:1", "b:2"]}), "'cluster.chief'", "exactly one"),
        (_config({"chief": ["127.0.0.1:5000"], "worker": ["127.0.0.1:5001", "localhost:5001"]}),
         "'cluster.worker[1]'", "duplicate address 'localhost:5001', already used by cluster.worker[0]"),
        (_config({"chief": ["127.0.0.1:5000"], "worker": ["127.0.0.1:5000"]}),
         "'cluster.worker[0]'", "already used by cluster.chief[0]"),
        (_config({"chief": ["127.0.0.1:99999"]}), "'cluster.chief[0]'", "port in 1..65535"),
        (_config({"chief": ["127.0.0.1"]}), "'cluster.chief[0]'", "'host:port'"),
        (_config({"chief": ["a:1"], "ps": ["b:2"]}), "'cluster.ps'", "no parameter servers"),
        (_config({"chief": "a:1"}), "'cluster.chief'", "list"),
        (_config({"chief": ["a:1"]}, {"type": "worker", "index": 0}), "'task.type'", "not a task type"),
        (_config({"chief": ["a:1"], "worker": ["b:2"]}, {"type": "worker", "index": 3}), "'task.index'",
         "out of range"),
    ],
)
def test_bad_tf_config_names_the_field(raw, field, words):
    with pytest.raises(ConfigError) as info:
        parse_tf_config(raw)
    message = str(info.value)
    assert f"TF_CONFIG field {field}" in message and words in message
    assert "What to do" in message


def test_plan_local_embedded_and_cluster():
    lone = parse_tf_config(None)
    assert plan_input_workers(lone).mode == "local"
    assert plan_input_workers(lone, 1).mode == "local"
    assert (plan_input_workers(lone, 3).mode, plan_input_workers(lone, 3).num_workers) == ("embedded", 3)
    cluster = Cluster("127.0.0.1:5000", ("127.0.0.1:5001", "127.0.0.1:5002"))
    assert (plan_input_workers(cluster).mode, plan_input_workers(cluster).num_workers) == ("cluster", 2)
    assert plan_input_workers(Cluster("127.0.0.1:5000", ("127.0.0.1:5001",))).mode == "cluster"


def test_plan_refuses_a_worker_count_that_contradicts_tf_config():
    cluster = Cluster("127.0.0.1:5000", ("127.0.0.1:5001", "127.0.0.1:5002"))
    with pytest.raises(ConfigError, match=r"num_input_workers=3 does not match the 2 task\(s\).*'cluster.worker'"):
        plan_input_workers(cluster, 3)


@pytest.mark.parametrize("count", [0, -1, 1.5, True, "2"])
def test_a_worker_count_that_is_not_a_positive_integer_is_refused_where_it_is_handed_in(count):
    """One check, one error type: CSRunConfig and InputStream call it; the plan and CSSettings trust the count."""
    with pytest.raises(ValueError, match=r"CSRunConfig\(num_input_workers=.*\) must be a positive integer"):
        check_num_input_workers(count)
    assert check_num_input_workers(None) is None and check_num_input_workers(3) == 3


def test_the_worker_count_is_the_explicit_one_else_the_tf_config_workers_else_one():
    assert [input_worker_count(2, 3), input_worker_count(None, 3), input_worker_count(None, 0)] == [2, 3, 1]
