"""train(use_cs=True) fed by input workers: in-process, and as `python -m cerebras_tf.input_workers` processes."""
from __future__ import annotations

import logging
import re
import time

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.summaries import read_scalars as scalars
from estimator import Estimator, EstimatorSpec
from cerebras_tf import CerebrasEstimator, CSRunConfig, set_default_tf_config
from cerebras_tf.run import chief
from cerebras_tf.errors import InputWorkerError
from cerebras_tf.input_workers import Cluster
from cerebras_tf.input_workers.service import free_port, is_listening
from cerebras_tf.wse.executor import Executor

BATCH = 16
CS_IP = "localhost:9000"


def input_fn(params):
    """Two noisy classes; shuffled with no seed, so each input worker sends its own order."""
    rng = np.random.RandomState(0)
    x = rng.randn(512, 10).astype(np.float32)
    y = (x[:, :3].sum(axis=1) > 0).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(512).repeat()
    return ds.batch(BATCH, drop_remainder=True)


def model_fn(features, labels, mode, params):
    init = tf.compat.v1.glorot_uniform_initializer(seed=3)
    hidden = tf.compat.v1.layers.dense(features, 32, activation=tf.nn.relu, kernel_initializer=init, name="fc1")
    logits = tf.compat.v1.layers.dense(hidden, 2, kernel_initializer=init, name="logits")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return EstimatorSpec(mode, loss=loss, train_op=train_op)


@pytest.fixture(autouse=True)
def _no_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    set_default_tf_config()


@pytest.fixture
def at_step(monkeypatch):
    """at_step(n, fn): call fn() right after the simulated WSE finishes global step n."""
    actions: dict[int, object] = {}

    class Instrumented(Executor):
        def step(self, *args, **kwargs):
            result = super().step(*args, **kwargs)
            action = actions.pop(self.global_step, None)
            if action is not None:
                action()
            return result

    monkeypatch.setattr(chief, "Executor", Instrumented)
    return actions.__setitem__


def train(model_dir, max_steps, **config):
    estimator = CerebrasEstimator(model_fn, model_dir=str(model_dir), params={},
                                  config=CSRunConfig(cs_ip=CS_IP, log_step_count_steps=20, **config))
    estimator.train(input_fn, max_steps=max_steps)
    return estimator


def cpu_loss(model_dir) -> float:
    evaluation = Estimator(model_fn, model_dir=str(model_dir), params={})
    return evaluation.evaluate(lambda params: input_fn(params).take(8), steps=8)["loss"]


def test_two_in_process_input_workers_feed_training_listen_nowhere_and_summaries_show_their_shares(
        tmp_path, caplog, at_step, listening_ports):
    listening_before = listening_ports()
    listening_during: list[set[int]] = []
    at_step(60, lambda: listening_during.append(listening_ports()))
    tf_logger = logging.getLogger("tensorflow")
    tf_logger.addHandler(caplog.handler)  # TF's logger does not propagate to the root logger
    try:
        with caplog.at_level("INFO", logger="tensorflow"):
            train(tmp_path, 120, num_input_workers=2)
    finally:
        tf_logger.removeHandler(caplog.handler)
    assert listening_during == [listening_before]  # the in-process workers use no network
    assert re.search(r"Trained steps 1-120 in [\d.]+ s on the simulated WSE \(\d+ samples/s on this host; "
                     r"the compiled placement estimates \d+ samples/s on the wafer\)", caplog.text), caplog.text
    assert "Streaming input from 2 input workers" in caplog.text
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-120")
    shares = [scalars(str(tmp_path), f"input/worker_{i}_share")[120] for i in range(2)]
    assert all(share > 0 for share in shares) and sum(shares) == pytest.approx(1.0)
    assert set(scalars(str(tmp_path), "input/wait_fraction")) == {20, 40, 60, 80, 100, 120}
    estimate = scalars(str(tmp_path), "wse/estimated_samples_per_sec")
    assert set(estimate) == {20, 40, 60, 80, 100, 120} and min(estimate.values()) > 0  # the compiled placement's
    assert min(scalars(str(tmp_path), "samples/sec").values()) > 0
    assert cpu_loss(tmp_path) < 0.45  # it learned (untrained: ~0.69)


def _cluster_tf_config(monkeypatch, num_workers: int) -> Cluster:
    cluster = Cluster(f"127.0.0.1:{free_port()}", tuple(f"127.0.0.1:{free_port()}" for _ in range(num_workers)))
    monkeypatch.setenv("TF_CONFIG", cluster.tf_config("chief", 0))
    return cluster


def test_two_worker_processes_train_the_example_like_one_process_and_survive_a_kill_9(
        tmp_path, monkeypatch, spawn_worker, at_step, caplog):
    from examples.fc_digits import run as example

    params = example.load_params(example.DEFAULT_PARAMS)
    params["runconfig"].update(max_steps=300, log_step_count_steps=20)
    example.run("train", params=params, model_dir=str(tmp_path / "one_process"), cs_ip=CS_IP)
    one_process = example.run("eval", params=params, model_dir=str(tmp_path / "one_process"))

    cluster = _cluster_tf_config(monkeypatch, 2)
    workers = [spawn_worker(cluster.tf_config("worker", i), "--chief-gone-secs", "1") for i in range(2)]
    # Killed at step 100; the pause lets the chief's probes (every 0.5 s) notice before training ends.
    at_step(100, lambda: (workers[1].kill(), workers[1].wait(timeout=10), time.sleep(2)))
    with caplog.at_level("WARNING"):
        example.run("train", params=params, model_dir=str(tmp_path / "workers"), cs_ip=CS_IP)
    monkeypatch.delenv("TF_CONFIG")
    with_workers = example.run("eval", params=params, model_dir=str(tmp_path / "workers"))

    assert with_workers["global_step"] == one_process["global_step"] == 300
    assert f"Lost input worker {cluster.worker_name(1)}" in caplog.text
    model_dir = str(tmp_path / "workers")
    shares = scalars(model_dir, "input/worker_1_share")
    assert shares[100] > 0 and shares[300] < shares[100]  # worker 1 sent data, then stopped
    assert scalars(model_dir, "input/workers_lost")[300] == 1
    # Observed: accuracy 0.96-0.99 either way (chance is 0.1).
    assert min(with_workers["accuracy"], one_process["accuracy"]) > 0.9, (with_workers, one_process)
    assert abs(with_workers["accuracy"] - one_process["accuracy"]) < 0.05, (with_workers, one_process)
    output, _ = workers[0].communicate(timeout=30)  # the survivor stops by itself once the chief is done
    assert workers[0].returncode == 0, output
    assert not is_listening(cluster.dispatcher_address)


def test_losing_every_worker_stops_training_with_a_clear_error_and_saves_progress(tmp_path, monkeypatch,
                                                                                   spawn_worker, at_step):
    cluster = _cluster_tf_config(monkeypatch, 1)
    worker = spawn_worker(cluster.tf_config("worker", 0), "--chief-gone-secs", "1")
    at_step(130, lambda: (worker.kill(), worker.wait(timeout=10)))
    with pytest.raises(InputWorkerError, match="All 1 input workers are lost") as info:
        train(tmp_path, 100_000, save_checkpoints_steps=100)
    monkeypatch.delenv("TF_CONFIG")
    assert "resume training from the last checkpoint" in str(info.value)
    latest = tf.train.latest_checkpoint(str(tmp_path))
    step = int(latest.rsplit("-", 1)[1])
    assert 130 <= step < 200  # the steps trained after model.ckpt-100, until the input stopped, are saved:
    assert tf.train.load_checkpoint(latest).get_tensor("global_step") == step
    assert not is_listening(cluster.dispatcher_address)
