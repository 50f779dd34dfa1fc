"""Input workers as separate processes: `python -m cerebras_tf.input_workers` x2 + the chief's dispatcher."""
from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import tensorflow as tf

from cerebras_tf.errors import InputWorkerError, InputWorkerWarning
from cerebras_tf.input_workers import Cluster, InputServers, InputStream
from cerebras_tf.input_workers.service import free_port, is_listening


BATCH = 8
ROOT = pathlib.Path(__file__).resolve().parents[2]


def input_fn(params):
    ds = tf.data.Dataset.range(1000).shuffle(1000)
    ds = ds.map(lambda i: (tf.fill([5], tf.cast(i, tf.float32)), i))
    return ds.batch(params["batch_size"], drop_remainder=True).repeat()


def failing_input_fn(params):
    def check(i):
        tf.debugging.assert_less(i, tf.constant(30, tf.int64), message="label id out of range")
        return i

    return tf.data.Dataset.range(100).map(check).batch(4, drop_remainder=True).repeat()


def _loopback_cluster(num_workers: int) -> Cluster:
    return Cluster(f"127.0.0.1:{free_port()}", tuple(f"127.0.0.1:{free_port()}" for _ in range(num_workers)))


def test_two_worker_processes_stream_and_survive_a_kill_9(spawn_worker):
    cluster = _loopback_cluster(2)
    procs = [spawn_worker(cluster.tf_config("worker", i), "--chief-gone-secs", "1") for i in range(2)]
    servers = InputServers.for_cluster(cluster, timeout_secs=90)  # waits for both workers to register
    stream = None
    try:
        # A pipeline error on a worker process reaches the chief, naming the worker and the user's line.
        with InputStream(failing_input_fn, {}, cluster=cluster, servers=servers) as failing:
            with pytest.raises(InputWorkerError) as info:
                for _ in range(1000):
                    next(failing)
        assert "The input pipeline failed on input worker worker:" in str(info.value)
        assert "label id out of range" in str(info.value) and "test_multiprocess.py" in str(info.value)

        stream = InputStream(input_fn, {"batch_size": BATCH}, cluster=cluster, servers=servers,
                             probe_interval_secs=0.2)
        assert stream.plan.mode == "cluster" and stream.workers == (cluster.worker_name(0), cluster.worker_name(1))
        deadline = time.monotonic() + 30
        while min(stream.stats().samples_per_worker.values()) < 10 * BATCH and time.monotonic() < deadline:
            features, labels = next(stream)
            assert features.shape == (BATCH, 5) and labels.shape == (BATCH,)
        assert min(stream.stats().samples_per_worker.values()) >= 10 * BATCH, stream.stats()

        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(timeout=10)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            deadline = time.monotonic() + 30
            while not stream.stats().lost_workers and time.monotonic() < deadline:
                next(stream)
            for _ in range(30):  # what worker 1 sent before it died may still be buffered
                next(stream)
        before = stream.stats().samples_per_worker
        for _ in range(50):
            next(stream)
        after = stream.stats().samples_per_worker
        lost = [str(w.message) for w in caught if issubclass(w.category, InputWorkerWarning)]
        assert lost and cluster.worker_name(1) in lost[0], lost
        assert after[cluster.worker_name(1)] == before[cluster.worker_name(1)]
        assert after[cluster.worker_name(0)] == before[cluster.worker_name(0)] + 50 * BATCH
    finally:
        if stream is not None:
            stream.close()
        servers.stop()
    assert not is_listening(cluster.dispatcher_address)
    # The surviving worker serves until the chief finishes, then exits cleanly by itself.
    output, _ = procs[0].communicate(timeout=30)
    assert procs[0].returncode == 0, output
    assert "registered with the dispatcher" in output and "is gone (training finished); stopping" in output


def test_input_worker_command_refuses_bad_tf_config(env_for):
    no_worker_task = json.dumps({"cluster": {"chief": ["127.0.0.1:5000"]}})
    # The second through the old module name, kept as an alias.
    for module, raw, field in (("cerebras_tf.input_workers", "{oops", "'TF_CONFIG'"),
                               ("cerebras_tf.input_worker", no_worker_task, "'task.type'")):
        result = subprocess.run([sys.executable, "-m", module], cwd=ROOT, env=env_for(raw),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and field in result.stderr, result.stderr


_ALL_LOST_CHIEF = textwrap.dedent("""
    import json, os, signal, subprocess, sys
    import tensorflow as tf
    from cerebras_tf.errors import InputWorkerError
    from cerebras_tf.input_workers import Cluster, InputStream

    def input_fn(params):
        return tf.data.Dataset.range(100).shuffle(100).batch(4, drop_remainder=True).repeat()

    cluster = Cluster(sys.argv[1], tuple(sys.argv[2:]))
    workers = [subprocess.Popen([sys.executable, "-m", "cerebras_tf.input_workers"],
                                env=dict(os.environ, TF_CONFIG=cluster.tf_config("worker", i)),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    stream = InputStream(input_fn, {}, cluster=cluster, probe_interval_secs=0.2, timeout_secs=90)
    for _ in range(10):
        next(stream)
    for worker in workers:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    try:
        for _ in range(100000):
            next(stream)
        print("NO ERROR")
    except InputWorkerError as exc:
        print("RAISED", exc)
    stream.close()
""")


def test_the_run_stops_with_a_clear_error_when_all_workers_are_lost(env_for):
    # In its own process: tf.data service's client keeps retrying forever in a
    # thread once no worker is left; the process exit ends it.
    cluster = _loopback_cluster(2)
    result = subprocess.run([sys.executable, "-c", _ALL_LOST_CHIEF, cluster.chief, *cluster.workers], cwd=ROOT,
                            env=env_for(""), capture_output=True, text=True, timeout=180)
    assert "RAISED [Input Workers] All 2 input workers are lost" in result.stdout, result.stdout + result.stderr
    assert "worker:0" in result.stdout and "worker:1" in result.stdout
