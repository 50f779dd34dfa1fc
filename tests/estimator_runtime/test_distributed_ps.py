"""train_and_evaluate in clusters with parameter servers (between-graph replication), as tf.estimator 2.15 runs them.

A 1-chief/2-worker/1-ps/1-evaluator cluster runs as real processes on
127.0.0.1 (ps_cluster_task.py, one per task, TF_CONFIG naming it) on this
stack through cerebras-tf's Estimator runtime: the ps serves the variables
until it is stopped, the chief and workers train asynchronously to max_steps,
the chief saves, the evaluator evaluates each new checkpoint up to the last.
tf.estimator on TF 2.15 (this Python, or the other stack's: $CEREBRAS_TF_OTHER_PYTHON, else the repository's
.venv-3.11) then reads that checkpoint, and runs the same cluster itself for
a comparison of structure (which tasks train, save and evaluate; which files
appear): asynchronous SGD makes the numbers differ from run to run.

Also in process: where a `master` cluster puts the summary and step-counter
hooks (worker 0, as tf.estimator does), and the misconfiguration messages.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import runtime_models as models
from estimator import runtime

try:
    from tensorflow_estimator import estimator as tfe
except ImportError:  # TF >= 2.16
    tfe = None

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ps_cluster_task.py")
MAX_STEPS = 20
# Asynchronous trainers stop once they see max_steps: each may take a step after another reached it, and its
# StopAtStepHook reads the global step in the same run as its own increment (unordered, possibly stale), so
# the last step may pass max_steps by up to two steps per trainer (chief + 2 workers).
OVERSHOOT = 2 * 3
TASKS = [("ps", 0), ("chief", 0), ("worker", 0), ("worker", 1), ("evaluator", 0)]
CLUSTER_TIMEOUT_SECS = 150


def _reference_python() -> str | None:
    """A Python whose `estimator` is tf.estimator on TF 2.15: this one, or the other stack's."""
    if tfe is not None:
        return sys.executable
    given = os.environ.get("CEREBRAS_TF_OTHER_PYTHON")
    python = given or os.path.join(ROOT, ".venv-3.11", "bin", "python")
    return python if os.access(python, os.X_OK) else None


REFERENCE = _reference_python()
needs_reference = pytest.mark.skipif(REFERENCE is None, reason=(
    "tf.estimator on TF 2.15 is not here (the repository's .venv-3.11, or CEREBRAS_TF_OTHER_PYTHON): "
    "`PYTHON=3.11 ./dev setup` makes it"))


def free_port() -> int:
    """A loopback port that was free a moment ago (the task's TF server binds it soon after)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(backend: str | None, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("TF_CONFIG", "TF_USE_LEGACY_KERAS", "CEREBRAS_TF_ESTIMATOR")}  # each stack sets its own
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", **extra)
    if backend:
        env["CEREBRAS_TF_ESTIMATOR"] = backend
    return env


def _run_cluster(python: str, backend: str | None, workdir: str) -> dict[str, Any]:
    """Start every task of a fresh cluster; wait for all but the ps, then stop the ps (it serves until killed).

    Returns model_dir, the wall time, and per task: exit code, its JSON line (None if it printed none), stderr.
    """
    cluster = {"chief": [f"127.0.0.1:{free_port()}"], "ps": [f"127.0.0.1:{free_port()}"],
               "worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]}
    model_dir, markers = os.path.join(workdir, "model"), os.path.join(workdir, "markers")
    os.makedirs(markers)
    processes: dict[str, subprocess.Popen] = {}
    logs: dict[str, tuple[Any, Any]] = {}
    started = time.time()
    try:
        for task_type, index in TASKS:
            name = f"{task_type}{index}"
            tf_config = json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})
            logs[name] = (open(os.path.join(workdir, name + ".out"), "w+"),
                          open(os.path.join(workdir, name + ".err"), "w+"))
            processes[name] = subprocess.Popen(
                [python, TASK_SCRIPT, model_dir, str(MAX_STEPS), markers], cwd=ROOT,
                env=_env(backend, TF_CONFIG=tf_config), stdout=logs[name][0], stderr=logs[name][1])
        deadline = started + CLUSTER_TIMEOUT_SECS
        codes: dict[str, Any] = {}
        for name, process in processes.items():
            if name != "ps0":
                try:
                    codes[name] = process.wait(timeout=max(1.0, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    codes[name] = "timed out"
        codes["ps0"] = processes["ps0"].poll()  # None: still serving, as a parameter server does
        seconds = time.time() - started
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    tasks = {}
    for name, (out, err) in logs.items():
        out.seek(0)
        err.seek(0)
        lines = out.read().strip().splitlines()
        tasks[name] = {"code": codes.get(name), "result": json.loads(lines[-1]) if lines else None,
                       "stderr": err.read()}
        out.close()
        err.close()
    return {"model_dir": model_dir, "seconds": seconds, "tasks": tasks}


def _failures(run: dict[str, Any]) -> str:
    return "\n".join(f"--- {name}: exit {task['code']}\n{task['stderr'][-2500:]}" for name, task in
                     run["tasks"].items() if task["code"] not in (0, None))


@pytest.fixture(scope="module")
def runtime_cluster(tmp_path_factory):
    """The cluster on this stack's Python through cerebras-tf's Estimator runtime."""
    return _run_cluster(sys.executable, "runtime", str(tmp_path_factory.mktemp("runtime_cluster")))


@pytest.fixture(scope="module")
def reference_cluster(tmp_path_factory):
    """The same cluster on tf.estimator (TF 2.15)."""
    if REFERENCE is None:
        pytest.skip("tf.estimator on TF 2.15 is not here")
    return _run_cluster(REFERENCE, None, str(tmp_path_factory.mktemp("tf_estimator_cluster")))


def _final_step(model_dir: str) -> int:
    return int(tf.train.load_variable(tf.train.latest_checkpoint(model_dir), "global_step"))


def _assert_finished(run: dict[str, Any]) -> None:
    """Every task but the ps exited 0; the ps was still serving when they had."""
    tasks = run["tasks"]
    assert all(task["code"] == 0 for name, task in tasks.items() if name != "ps0"), _failures(run)
    assert tasks["ps0"]["code"] is None, "the ps should serve until it is stopped: " + tasks["ps0"]["stderr"][-2500:]


def test_a_chief_two_workers_a_ps_and_an_evaluator_train_and_evaluate(runtime_cluster):
    _assert_finished(runtime_cluster)
    results = {name: task["result"] for name, task in runtime_cluster["tasks"].items() if name != "ps0"}
    assert {result["backend"] for result in results.values()} == {"runtime"}
    assert all(results[name]["steps"] > 0 for name in ("chief0", "worker0", "worker1")), results  # all trained
    assert results["chief0"]["saves"] > 0 and results["worker0"]["saves"] == results["worker1"]["saves"] == 0
    model_dir = runtime_cluster["model_dir"]
    final = _final_step(model_dir)
    assert MAX_STEPS <= final <= MAX_STEPS + OVERSHOOT, final
    assert os.path.exists(os.path.join(model_dir, f"model.ckpt-{final}.index"))
    # the evaluator evaluated a checkpoint at max_steps, then stopped (the chief's very last save may come after,
    # when a worker stepped on while the chief was stopping: as with tf.estimator)
    evaluated = results["evaluator0"]["evaluated"]
    assert evaluated and MAX_STEPS <= evaluated[-1] <= final, evaluated
    assert os.path.exists(os.path.join(model_dir, f"model.ckpt-{evaluated[-1]}.index"))
    assert all(results[name]["evaluated"] == [] for name in ("chief0", "worker0", "worker1"))
    eval_losses = dict(models.event_tags(os.path.join(model_dir, "eval"))["loss"])
    assert evaluated[-1] in eval_losses
    # the variables lived on the ps: the chief's checkpoint holds what all three trainers learned
    assert float(eval_losses[evaluated[-1]]) < float(np.mean(models.Y ** 2)) / 4


@needs_reference
def test_tf_estimator_on_tf_2_15_reads_the_checkpoint(runtime_cluster, tmp_path):
    _assert_finished(runtime_cluster)
    step = runtime_cluster["tasks"]["evaluator0"]["result"]["evaluated"][-1]  # the one our evaluator evaluated
    copy = str(tmp_path / "model")  # a copy: tf.estimator's evaluation writes eval_read/ into it
    shutil.copytree(runtime_cluster["model_dir"], copy)
    done = subprocess.run([REFERENCE, TASK_SCRIPT, "read", os.path.join(copy, f"model.ckpt-{step}")],
                          capture_output=True, text=True, timeout=120, env=_env(None), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert (read["backend"], read["tensorflow"][:4]) == ("tf.estimator", "2.15")
    checkpoint = os.path.join(runtime_cluster["model_dir"], f"model.ckpt-{step}")
    assert sorted(read["variables"]) == sorted(name for name, _ in tf.train.list_variables(checkpoint))
    assert sorted(read["variables"]) == ["global_step", "linear/b", "linear/w"]
    for name, value in read["variables"].items():
        np.testing.assert_array_equal(np.asarray(value), tf.train.load_variable(checkpoint, name), err_msg=name)
    assert read["metrics"]["global_step"] == step
    eval_losses = dict(models.event_tags(os.path.join(runtime_cluster["model_dir"], "eval"))["loss"])
    assert read["metrics"]["loss"] == pytest.approx(float(eval_losses[step]), rel=1e-5)  # what our evaluator got


def _layout(model_dir: str) -> dict[str, list[str]]:
    """model_dir's files by kind (checkpoint steps and event file names vary from run to run)."""
    def kind(name: str) -> str:
        name = re.sub(r"^model\.ckpt-\d+\.", "model.ckpt-N.", name)
        return re.sub(r"^events\.out\.tfevents\..*", "events.out.tfevents.*", name)

    return {os.path.relpath(top, model_dir): sorted({kind(name) for name in files})
            for top, _, files in os.walk(model_dir)}


@needs_reference
def test_same_cluster_structure_as_tf_estimator(runtime_cluster, reference_cluster):
    _assert_finished(runtime_cluster)
    _assert_finished(reference_cluster)
    ours = {name: task["result"] for name, task in runtime_cluster["tasks"].items() if task["result"]}
    theirs = {name: task["result"] for name, task in reference_cluster["tasks"].items() if task["result"]}
    assert sorted(ours) == sorted(theirs) == ["chief0", "evaluator0", "worker0", "worker1"]  # the ps printed nothing
    assert {result["backend"] for result in theirs.values()} == {"tf.estimator"}
    for name in ours:
        assert (ours[name]["steps"] > 0) == (theirs[name]["steps"] > 0), name  # who trains
        assert (ours[name]["saves"] > 0) == (theirs[name]["saves"] > 0), name  # who saves: the chief
        assert bool(ours[name]["evaluated"]) == bool(theirs[name]["evaluated"]), name  # who evaluates
    assert _layout(runtime_cluster["model_dir"]) == _layout(reference_cluster["model_dir"])
    for run in (runtime_cluster, reference_cluster):
        final = _final_step(run["model_dir"])
        assert MAX_STEPS <= final <= MAX_STEPS + OVERSHOOT
        assert MAX_STEPS <= run["tasks"]["evaluator0"]["result"]["evaluated"][-1] <= final


# ------------------------------------------------------------------ in process

class _SessionOpened(Exception):
    """Raised by the stand-in MonitoredTrainingSession once it has seen its arguments."""


def _session_arguments(api: Any, model_dir: str, monkeypatch: Any, tf_config: dict[str, Any]) -> dict[str, Any]:
    """The MonitoredTrainingSession arguments `api`'s Estimator.train gives this task (the session never runs)."""
    from tensorflow.python.training import training as training_module

    seen: dict[str, Any] = {}

    def session(**kwargs: Any) -> Any:
        seen.update(kwargs)
        raise _SessionOpened

    monkeypatch.setattr(tf.compat.v1.train, "MonitoredTrainingSession", session)
    monkeypatch.setattr(training_module, "MonitoredTrainingSession", session)
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    config = api.RunConfig(save_summary_steps=7, log_step_count_steps=9, save_checkpoints_steps=10)
    estimator = api.Estimator(models.dense_model_fn(api), model_dir=model_dir, config=config, params={})
    with pytest.raises(_SessionOpened):
        estimator.train(models.input_fn(), max_steps=5)
    hooks = {type(hook).__name__: hook for hook in seen["hooks"]}
    summaries = hooks.get("SummarySaverHook")
    counter = hooks.get("StepCounterHook")
    return {
        "save_summaries_steps": seen["save_summaries_steps"],
        "log_step_count_steps": seen["log_step_count_steps"],
        "summary_hook": summaries and (summaries._timer._every_steps, summaries._output_dir),
        "step_counter_hook": counter and (counter._timer._every_steps, counter._output_dir),
    }


_CLUSTERS = {
    "master": {"master": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"], "ps": ["127.0.0.1:4"]},
    "chief": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"], "ps": ["127.0.0.1:4"]},
}


def _expected(cluster: str, task: str, model_dir: str) -> dict[str, Any]:
    if cluster == "chief":  # each session adds its own (MonitoredTrainingSession: on the chief)
        return {"save_summaries_steps": 7, "log_step_count_steps": 9, "summary_hook": None,
                "step_counter_hook": None}
    on_worker_0 = task == "worker0"
    return {"save_summaries_steps": 0, "log_step_count_steps": None,
            "summary_hook": (7, model_dir) if on_worker_0 else None,
            "step_counter_hook": (9, model_dir) if on_worker_0 else None}


@pytest.mark.parametrize("cluster,task", [("master", "master0"), ("master", "worker0"), ("master", "worker1"),
                                          ("chief", "chief0"), ("chief", "worker0")])
def test_a_master_cluster_writes_summaries_and_steps_per_second_on_worker_0(tmp_path, monkeypatch, cluster, task):
    tf_config = {"cluster": _CLUSTERS[cluster], "task": {"type": task[:-1], "index": int(task[-1])}}
    model_dir = str(tmp_path / "runtime")
    ours = _session_arguments(runtime, model_dir, monkeypatch, tf_config)
    assert ours == _expected(cluster, task, model_dir)
    if tfe is not None:
        reference_dir = str(tmp_path / "tf_estimator")
        assert _session_arguments(tfe, reference_dir, monkeypatch, tf_config) == _expected(cluster, task,
                                                                                           reference_dir)


def _apis() -> list[Any]:
    return [runtime] if tfe is None else [runtime, tfe]


@pytest.mark.parametrize("api", _apis(), ids=lambda api: api.__name__.split(".")[0])
def test_a_ps_task_without_a_master_says_so(tmp_path, monkeypatch, api):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]},
                                                "task": {"type": "ps", "index": 0}, "session_master": ""}))
    estimator = api.Estimator(models.dense_model_fn(api), model_dir=str(tmp_path), params={})
    with pytest.raises(RuntimeError, match="^Could not start server; be sure to specify master in RunConfig or set "
                                           "the TF_CONFIG environment variable.$"):
        api.train_and_evaluate(estimator, api.TrainSpec(models.input_fn(), max_steps=3),
                               api.EvalSpec(models.input_fn(repeat=False)))


@pytest.mark.parametrize("api", _apis(), ids=lambda api: api.__name__.split(".")[0])
def test_an_unknown_task_type_lists_the_supported_ones(tmp_path, monkeypatch, api):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["127.0.0.1:1"], "trainer": ["127.0.0.1:2"]},
                                                "task": {"type": "trainer", "index": 0}}))
    estimator = api.Estimator(models.dense_model_fn(api), model_dir=str(tmp_path), params={})
    with pytest.raises(ValueError, match=re.escape("Task type trainer is not supported. Supported task types are "
                                                   "['chief', 'evaluator', 'master', 'ps', 'worker']")):
        api.train_and_evaluate(estimator, api.TrainSpec(models.input_fn(), max_steps=3),
                               api.EvalSpec(models.input_fn(repeat=False)))


@pytest.mark.parametrize("api", _apis(), ids=lambda api: api.__name__.split(".")[0])
def test_a_ps_task_cannot_train_directly(tmp_path, monkeypatch, api):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]},
                                                "task": {"type": "ps", "index": 0}}))
    estimator = api.Estimator(models.dense_model_fn(api), model_dir=str(tmp_path), params={})
    with pytest.raises(ValueError, match="^Train has been called wrong configuration. Please use "
                                         "tf.estimator.train_and_evaluate which calls proper API"):
        estimator.train(models.input_fn(), max_steps=3)
