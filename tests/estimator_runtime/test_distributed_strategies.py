"""RunConfig(train_distribute=..., eval_distribute=...) on the Estimator runtime, against tf.estimator (TF 2.15).

Real processes (strategy_script.py) with two logical CPU devices each: MirroredStrategy and the other in-graph
forms tf.estimator takes train and evaluate as one device does at the same global batch; a two-worker
MultiWorkerMirroredStrategy cluster (workers alone, over 127.0.0.1) trains through train_and_evaluate to a
checkpoint tf.estimator reads; a V1 ParameterServerStrategy cluster (a chief and a ps) trains; the settings
tf.estimator refuses are refused with its words. tf.estimator runs in TF 2.15's Python: this one when it has
tensorflow-estimator, else $CEREBRAS_TF_OTHER_PYTHON or a .venv-3.11 (the repository's, or the main worktree's
for a git worktree); comparisons with it skip, saying so, when there is none. All the processes start together
when the module starts (the machine's cores are shared). CerebrasEstimator runs here, in this process.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import types
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import strategy_script as script
from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig, errors
from estimator import ModeKeys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(HERE, "strategy_script.py")
STEPS = 6
TIMEOUT = 240


def _has_tf_estimator() -> bool:
    try:
        import tensorflow_estimator  # noqa: F401
    except ImportError:
        return False
    return True


def _main_worktree() -> str | None:
    """The main worktree of the git repository ROOT is a linked worktree of (None otherwise)."""
    try:
        with open(os.path.join(ROOT, ".git"), encoding="utf-8") as handle:
            gitdir = handle.read().strip().removeprefix("gitdir:").strip()
    except OSError:  # .git is a directory (a main worktree) or absent
        return None
    return os.path.dirname(os.path.dirname(os.path.dirname(gitdir)))  # <main>/.git/worktrees/<name>


def _reference_python() -> str | None:
    """A Python with tf.estimator (TF 2.15)."""
    if _has_tf_estimator():
        return sys.executable
    if os.environ.get("CEREBRAS_TF_OTHER_PYTHON"):
        return os.environ["CEREBRAS_TF_OTHER_PYTHON"]
    for root in filter(None, (ROOT, _main_worktree())):
        python = os.path.join(root, ".venv-3.11", "bin", "python")
        if os.access(python, os.X_OK):
            return python
    return None


REFERENCE = _reference_python()
needs_reference = pytest.mark.skipif(REFERENCE is None, reason=(
    "no Python with tf.estimator (TF 2.15): set CEREBRAS_TF_OTHER_PYTHON or make .venv-3.11 "
    "(`PYTHON=3.11 ./dev setup`)"))


class Process:
    """strategy_script.py with some scenarios, started now; result() waits and parses its output."""

    def __init__(self, python: str, scenarios: dict[str, Any], log_dir: str, name: str) -> None:
        env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
        for variable in ("TF_CONFIG", "CEREBRAS_TF_ESTIMATOR", "TF_USE_LEGACY_KERAS"):
            env.pop(variable, None)
        self.name = name
        self._stderr = open(os.path.join(log_dir, f"{name}.stderr"), "w+", encoding="utf-8")
        self._process = subprocess.Popen([python, SCRIPT, json.dumps(scenarios)], stdout=subprocess.PIPE,
                                         stderr=self._stderr, text=True, env=env, cwd=ROOT)
        self._output: dict[str, Any] | None = None

    def result(self) -> dict[str, Any]:
        if self._output is None:
            stdout, _ = self._process.communicate(timeout=TIMEOUT)
            self._stderr.seek(0)
            assert self._process.returncode == 0, f"{self.name}:\n{self._stderr.read()[-4000:]}"
            self._output = json.loads(stdout.strip().splitlines()[-1])
        return self._output

    def stop(self) -> None:
        """Kill it if it still runs (a parameter server serves until killed)."""
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._stderr.close()


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


LOCAL_RUNS = [
    {"name": "single", "batch": 8},
    {"name": "mirrored", "strategy": "mirrored", "eval_strategy": "mirrored", "batch": 4},
    {"name": "mirrored_v1", "strategy": "mirrored_v1", "batch": 4, "train_and_evaluate": True},
    {"name": "ps_v1", "strategy": "ps_v1", "eval_strategy": "ps_v1", "batch": 8},
]


def _local_processes(tmp: str) -> dict[str, Process]:
    """The local runs and the refusals, on this runtime and (when there is one) on tf.estimator."""
    processes = {}
    stacks = [("runtime", sys.executable)] + ([("tf.estimator", REFERENCE)] if REFERENCE else [])
    for api, python in stacks:
        processes[api] = Process(python, {
            "local": {"api": api, "model_dir": os.path.join(tmp, api), "steps": STEPS, "runs": LOCAL_RUNS},
            "refusals": {"api": api, "model_dir": os.path.join(tmp, api + "-refusals")},
        }, tmp, api)
    return processes


def _cluster(tmp: str, jobs: dict[str, int], strategy: str, batch: int) -> dict[str, Process]:
    """One process per task of a TF_CONFIG cluster on 127.0.0.1 (train_and_evaluate with `strategy`)."""
    ports = iter(_free_ports(sum(jobs.values())))
    cluster = {job: [f"127.0.0.1:{next(ports)}" for _ in range(count)] for job, count in jobs.items()}
    model_dir = os.path.join(tmp, "model")
    return {f"{job}{index}": Process(sys.executable, {"worker": {
        "api": "runtime", "model_dir": model_dir, "steps": STEPS, "batch": batch, "strategy": strategy,
        "tf_config": {"cluster": cluster, "task": {"type": job, "index": index}}}}, tmp, f"{job}{index}")
        for job, count in jobs.items() for index in range(count)}


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory):
    processes = _local_processes(str(tmp_path_factory.mktemp("local")))
    yield processes
    for process in processes.values():
        process.stop()


@pytest.fixture(scope="module")
def mwms_cluster(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("mwms"))
    processes = _cluster(tmp, {"worker": 2}, "mwms", batch=4)
    yield types.SimpleNamespace(processes=processes, model_dir=os.path.join(tmp, "model"), tmp=tmp)
    for process in processes.values():
        process.stop()


@pytest.fixture(scope="module")
def ps_cluster(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("ps"))
    processes = _cluster(tmp, {"chief": 1, "ps": 1}, "ps_v1", batch=8)
    yield types.SimpleNamespace(processes=processes, model_dir=os.path.join(tmp, "model"))
    for process in processes.values():
        process.stop()


_PROCESS_FIXTURES = ("local_runs", "mwms_cluster", "ps_cluster")


@pytest.fixture(scope="module", autouse=True)
def _start_together(request):
    """Start the processes of every selected test of this module at once: they run side by side."""
    for item in request.session.items:
        if item.module is request.module:
            for name in item.fixturenames:
                if name in _PROCESS_FIXTURES:
                    request.getfixturevalue(name)


def _assert_same_variables(actual: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    assert sorted(actual) == sorted(expected), what
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=f"{what}: {name}")


def _assert_same_metrics(actual: dict[str, float], expected: dict[str, float], what: str) -> None:
    assert sorted(actual) == sorted(expected), what
    for name in expected:
        assert actual[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-6), f"{what}: {name}"


# --------------------------------------------------------------------------- in-graph strategies


def test_in_graph_strategies_train_and_evaluate_as_one_device_at_the_same_global_batch(local_runs):
    runs = local_runs["runtime"].result()["local"]
    single = runs["single"]
    assert single["checkpoint"] == f"model.ckpt-{STEPS}"
    for name in ("mirrored", "mirrored_v1", "ps_v1"):
        run = runs[name]
        # MirroredStrategy's two replicas on batches of 4 train as one device on batches of 8
        _assert_same_variables(run["variables"], single["variables"], name)
        _assert_same_metrics(run["metrics"], single["metrics"], name)
        assert run["checkpoint"] == f"model.ckpt-{STEPS}", name
        assert "eval" in run["files"], name
    assert not np.allclose(single["variables"]["output/kernel"], script.W2), "training changed nothing"


@needs_reference
def test_in_graph_strategies_give_what_tf_estimator_gives(local_runs):
    here = local_runs["runtime"].result()["local"]
    reference = local_runs["tf.estimator"].result()
    assert reference["tf"].startswith("2.15")
    for name, expected in reference["local"].items():
        _assert_same_variables(here[name]["variables"], expected["variables"], name)
        _assert_same_metrics(here[name]["metrics"], expected["metrics"], name)
        assert [f for f in here[name]["files"] if "tfevents" not in f] == [
            f for f in expected["files"] if "tfevents" not in f], name


# --------------------------------------------------------------------------- MultiWorkerMirroredStrategy


def test_multi_worker_mirrored_strategy_on_two_workers_ends_with_a_checkpoint_tf_estimator_reads(
        mwms_cluster, local_runs):
    chief, other = (mwms_cluster.processes[f"worker{i}"].result()["worker"] for i in (0, 1))
    # A cluster of workers alone: tf.estimator's RunConfig under the coordinator reads as a local one until
    # train_and_evaluate places the task; worker 0 is the chief.
    assert chief["config"] == other["config"] == {"task_type": "worker", "task_id": 0, "is_chief": True,
                                                  "master": "", "num_worker_replicas": 1,
                                                  "global_id_in_cluster": 0}
    assert chief["returned"] is None
    assert chief["checkpoint"] == f"model.ckpt-{STEPS}"
    assert "tmp_worker_1" in chief["files"]  # worker 1 writes its checkpoints and summaries aside
    # Each worker reads its shard of the input (InputContext) in batches of 4: one device on batches of 8.
    single = local_runs["runtime"].result()["local"]["single"]
    _assert_same_variables(chief["variables"], single["variables"], "MultiWorkerMirroredStrategy")
    if REFERENCE is None:
        pytest.skip("the checkpoint is not read by tf.estimator: no Python with tf.estimator (TF 2.15)")
    read = Process(REFERENCE, {"read": {"api": "tf.estimator", "model_dir": mwms_cluster.model_dir, "batch": 8}},
                   mwms_cluster.tmp, "read").result()
    assert read["tf"].startswith("2.15")
    assert read["read"]["checkpoint"] == f"model.ckpt-{STEPS}"
    _assert_same_variables(read["read"]["variables"], single["variables"], "read by tf.estimator")
    _assert_same_metrics(read["read"]["metrics"], single["metrics"], "evaluated by tf.estimator")


def test_parameter_server_strategy_v1_cluster_trains_through_train_and_evaluate(ps_cluster, local_runs):
    chief = ps_cluster.processes["chief0"].result()["worker"]  # the ps serves until the fixture kills it
    assert chief["returned"] is None
    assert chief["checkpoint"] == f"model.ckpt-{STEPS}"
    # The variables live on the ps, the chief is the one trainer: as one device.
    single = local_runs["runtime"].result()["local"]["single"]
    _assert_same_variables(chief["variables"], single["variables"], "ParameterServerStrategy cluster")


# --------------------------------------------------------------------------- refusals

REFUSED = {
    "v2_ps_train": "ValueError: Please use `tf.compat.v1.distribute.experimental.ParameterServerStrategy` for "
                   "parameter server strategy with estimator.",
    "both_train": "ValueError: Either `train_distribute` or`experimental_distribute.train_distribute` can be set.",
    "both_eval": "ValueError: Either `eval_distribute` or`experimental_distribute.eval_distribute` can be set.",
    "remote_and_tf_config": 'ValueError: Cannot set both "cluster_spec" of TF_CONFIG and '
                            "`experimental_distribute.remote_cluster`",
    "worker_cluster_without_strategy": 'ValueError: If "cluster" is set in TF_CONFIG, it must have one "chief" '
                                       "node.",
    "worker_cluster_eval_distribute_only": 'ValueError: If "cluster" is set in TF_CONFIG, it must have one "chief" '
                                           "node.",
    "train_in_cluster": "ValueError: Only `STANDALONE_CLIENT` mode is supported when you call `estimator.train`",
    "evaluate_in_cluster": "ValueError: Only `STANDALONE_CLIENT` mode is supported when you call "
                           "`Estimator.evaluate`",
    "evaluator_job": "ValueError: 'evaluator' job is not supported if you don't use `train_and_evaluate`",
    "standalone_between_graph": "ValueError: `Estimator.train` API is not supported for "
                                "CollectiveAllReduceStrategy with `STANDALONE_CLIENT` mode.",
    "saving_listeners_collective": "ValueError: Saving listenor is not supported by the current Distribution "
                                   "Strategies.",
}


def test_settings_tf_estimator_refuses_are_refused_with_its_words(local_runs):
    refusals = local_runs["runtime"].result()["refusals"]
    for case, message in REFUSED.items():
        assert refusals[case] == message, case
    assert refusals["v2_ps_eval"] == REFUSED["v2_ps_train"]
    assert refusals["worker_cluster_config"] == {  # accepted: no chief needed with a strategy
        "cluster_spec": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task_type": "worker", "task_id": 0,
        "is_chief": True, "master": "", "num_worker_replicas": 1, "num_ps_replicas": 0, "global_id_in_cluster": 0}


@needs_reference
def test_refusals_are_tf_estimators(local_runs):
    assert local_runs["runtime"].result()["refusals"] == local_runs["tf.estimator"].result()["refusals"]


# --------------------------------------------------------------------------- CerebrasEstimator


def _cs_model_fn(features, labels, mode, params):
    """strategy_script's model, returning a CSEstimatorSpec."""
    return script.make_model_fn(types.SimpleNamespace(EstimatorSpec=CSEstimatorSpec, ModeKeys=ModeKeys))(
        features, labels, mode, params)


def test_cerebras_estimator_without_cs_ip_trains_and_evaluates_with_a_strategy(tmp_path, monkeypatch, local_runs):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    mirrored = tf.distribute.MirroredStrategy(script.DEVICES)
    session_config = tf.compat.v1.ConfigProto(allow_soft_placement=True, device_count={"CPU": 2})
    estimator = CerebrasEstimator(_cs_model_fn, model_dir=str(tmp_path), params={"batch": 4},
                                  config=CSRunConfig(save_checkpoints_steps=STEPS, session_config=session_config,
                                                     train_distribute=mirrored, eval_distribute=mirrored))
    estimator.train(script.input_fn, max_steps=STEPS)  # use_cs=True, but no cs_ip: the parent Estimator
    metrics = estimator.evaluate(script.eval_input_fn)
    single = local_runs["runtime"].result()["local"]["single"]
    variables = {name: estimator.get_variable_value(name) for name in single["variables"]}
    _assert_same_variables(variables, single["variables"], "CerebrasEstimator, MirroredStrategy")
    _assert_same_metrics({name: float(value) for name, value in metrics.items()}, single["metrics"],
                         "CerebrasEstimator, MirroredStrategy")


@pytest.mark.parametrize("argument", ["train_distribute", "eval_distribute"])
def test_cerebras_estimator_with_cs_ip_refuses_a_strategy_on_the_cs_system(make_estimator, make_input_fn,
                                                                            assert_refused, argument):
    # conftest's CS-ready model, input and TF_CONFIG (the single chief the Cerebras scripts set)
    estimator = make_estimator(**{argument: tf.distribute.MirroredStrategy(script.DEVICES)})
    assert_refused(estimator, errors.ConfigError, lambda: estimator.train(make_input_fn(), max_steps=STEPS),
                   "[Unsupported Config]", f"RunConfig parameter {argument}=", "is not supported on the CS system")
