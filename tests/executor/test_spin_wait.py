"""The host's cores kept from idling while a step runs: idle-priority spinners (wse/spin_wait.py)."""
from __future__ import annotations

import multiprocessing
import os
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from estimator import EstimatorSpec, ModeKeys
from cerebras_tf import CerebrasEstimator, CSRunConfig
from cerebras_tf.compiler import initial
from cerebras_tf.precheck import precheck
from cerebras_tf.run.host_kernels_tf import TENSORFLOW_HOST_KERNELS
from cerebras_tf.wse import spin_wait
from cerebras_tf.wse.kernels import NUMPY_HOST_KERNELS
from cerebras_tf.wse.executor import Executor

pytestmark = pytest.mark.skipif(not spin_wait.available(), reason="Linux's SCHED_IDLE with numba only")


def _cpu_seconds(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def _until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_one_spinner_per_core_at_idle_priority_spins_only_within_a_block():
    with spin_wait.cores_awake():
        assert spin_wait.spinning()
        spinners = spin_wait.spinner_threads()
        cores = sorted(os.sched_getaffinity(0))
        assert len(spinners) == len(cores)
        for spinner, core in zip(spinners, cores):
            assert spinner.native_id is not None
            assert os.sched_getscheduler(spinner.native_id) == os.SCHED_IDLE
            assert os.sched_getaffinity(spinner.native_id) == {core}
        before = [_cpu_seconds(s) for s in spinners]
        # at idle priority a spinner runs whenever its core has nothing else (on a loaded machine, rarely)
        assert _until(lambda: all(_cpu_seconds(s) > b for s, b in zip(spinners, before)))
    assert not spin_wait.spinning()

    def settled() -> bool:  # after the grace reads, the spinners wait for the next block without running
        first = [_cpu_seconds(s) for s in spinners]
        time.sleep(0.1)
        return all(_cpu_seconds(s) - f < 0.005 for s, f in zip(spinners, first))
    assert _until(settled)
    with spin_wait.cores_awake():
        assert spin_wait.spinner_threads() == spinners  # the same threads spin again


def test_overlapping_blocks_on_two_threads_spin_until_the_last_ends():
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with spin_wait.cores_awake():
            inside.set()
            leave.wait(10)
    thread = threading.Thread(target=other)
    with spin_wait.cores_awake():
        thread.start()
        assert inside.wait(10)
    assert spin_wait.spinning()  # the other thread's block is still open
    leave.set()
    thread.join(10)
    assert not spin_wait.spinning()


@pytest.mark.parametrize("files, capped", [
    ({"0::/job": "", "job/cpu.max": "max 100000"}, False),
    ({"0::/job": "", "job/cpu.max": "200000 100000"}, True),  # a container's --cpus=2
    ({"4:cpu,cpuacct:/job": "", "cpu,cpuacct/job/cpu.cfs_quota_us": "-1"}, False),
    ({"4:cpu,cpuacct:/job": "", "cpu,cpuacct/job/cpu.cfs_quota_us": "150000"}, True),
    ({"4:cpu,cpuacct:/": "", "cpu,cpuacct/cpu.cfs_quota_us": "50000"}, True),
    ({"0::/job": ""}, False),  # no such file: cannot tell
])
def test_no_spinning_where_the_cgroup_caps_the_process_cpu_time(tmp_path, files, capped):
    """A spinner's time would count against a cgroup's CPU cap and throttle the step's own threads."""
    membership = "\n".join(line for line in files if ":" in line)
    (tmp_path / "cgroup").write_text(membership)
    for name, text in files.items():
        if ":" not in name:
            (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "fs" / name).write_text(text)
    assert spin_wait.cpu_capped(str(tmp_path / "fs"), str(tmp_path / "cgroup")) is capped
    assert spin_wait.cpu_capped(str(tmp_path / "fs"), str(tmp_path / "missing")) is False


def test_the_environment_turns_it_off(monkeypatch):
    monkeypatch.setenv(spin_wait.ENV_VAR, "0")
    with spin_wait.cores_awake():
        assert not spin_wait.spinning()


def _in_child(queue) -> None:
    with spin_wait.cores_awake():
        queue.put((spin_wait.spinning(), len(spin_wait.spinner_threads())))


def test_a_forked_child_starts_its_own_spinners():
    with spin_wait.cores_awake():  # the parent's spinners exist (and spin) when it forks
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_in_child, args=(queue,))
        child.start()
        spinning, count = queue.get(timeout=60)
        child.join(60)
    assert child.exitcode == 0
    assert spinning and count == len(os.sched_getaffinity(0))


def _input_fn(params):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).repeat().batch(16, drop_remainder=True)


def _model_fn(features, labels, mode, params):
    hidden = tf.compat.v1.layers.dense(features, 16, activation=tf.nn.relu, name="hidden")
    loss = tf.compat.v1.losses.mean_squared_error(labels, tf.compat.v1.layers.dense(hidden, 1, name="out"))
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_a_step_on_tensorflows_kernels_spins_and_computes_the_same_bits_as_without(tmp_path, monkeypatch):
    """With the "tensorflow" provider (whose pool each dense kernel wakes) every kernel of a step runs while the
    spinners spin, and the results are those of a run without them; the numpy provider's steps do not spin."""
    estimator = CerebrasEstimator(_model_fn, model_dir=str(tmp_path / "model"),
                                  config=CSRunConfig(cs_ip="localhost:9000"))
    model = precheck(estimator, _input_fn, ModeKeys.TRAIN)
    program = estimator.compile(_input_fn).program
    with model.graph.as_default(), tf.compat.v1.Session(graph=model.graph) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        values = initial.initial_values(model, program)
    batches = list(_input_fn({}).take(4).as_numpy_iterator())
    seen: list[bool] = []
    call = Executor._call

    def recording(*args):
        seen.append(spin_wait.spinning())
        return call(*args)
    monkeypatch.setattr(Executor, "_call", staticmethod(recording))
    runs = {}
    for spin, provider in (("1", TENSORFLOW_HOST_KERNELS), ("0", TENSORFLOW_HOST_KERNELS), ("1", NUMPY_HOST_KERNELS)):
        monkeypatch.setenv(spin_wait.ENV_VAR, spin)
        seen.clear()
        executor = Executor(program, {k: np.copy(v) for k, v in values.items()}, half_dtype="float32",
                            host_kernels=provider)
        losses = [executor.step(*batch).loss for batch in batches]
        spins = spin == "1" and provider.spinning_pool
        assert seen and all(s == spins for s in seen)  # every kernel ran while the spinners spun (or none did)
        assert not spin_wait.spinning()  # and they stop with the step
        runs[spin, provider.name] = (losses, executor.variables())
    with_spin, without = runs["1", "tensorflow"], runs["0", "tensorflow"]
    assert with_spin[0] == without[0]  # float32 losses as Python floats: exact
    for name, value in with_spin[1].items():
        assert value.tobytes() == without[1][name].tobytes(), name
