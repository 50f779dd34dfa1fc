"""InputStream in one process: local reading, in-process workers (no network), rules and faults; the
tf.data service dispatcher's registration wait and its log of what listens."""
from __future__ import annotations

import logging
import time

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf.errors import InputFunctionError, InputWorkerError
from cerebras_tf.input_workers import Cluster, InputServers, InputStream
from cerebras_tf.input_workers import service
from cerebras_tf.input_workers.service import is_listening
from cerebras_tf.settings import CSSettings

BATCH = 4


def input_fn(params):
    ds = tf.data.Dataset.range(64).shuffle(64)
    ds = ds.map(lambda i: (tf.fill([3], tf.cast(i, tf.float32)), tf.cast(i % 2, tf.int32)))
    return ds.batch(params["batch_size"], drop_remainder=True).repeat()


def _read_until(stream, predicate, max_batches=10**7, max_secs=30.0):
    deadline = time.monotonic() + max_secs
    for _ in range(max_batches):
        next(stream)
        if predicate() or time.monotonic() > deadline:
            return
    return


def test_local_stream_without_workers_starts_no_servers():
    with InputStream(input_fn, {"batch_size": BATCH}, cluster=Cluster("localhost:2222")) as stream:
        batches = [next(stream) for _ in range(20)]
        stats = stream.stats()
    assert stream.servers is None and stream.workers == ("chief",)
    assert all(f.shape == (BATCH, 3) and f.dtype == np.float32 and l.shape == (BATCH,) for f, l in batches)
    assert stats.samples == 20 * BATCH and stats.share("chief") == 1.0


def test_a_local_stream_reads_ahead_ends_with_finite_data_and_raises_pipeline_errors_as_they_are():
    def finite(params):
        return tf.data.Dataset.range(10).batch(5, drop_remainder=True)

    with InputStream(finite, {}, cluster=Cluster("localhost:2222")) as stream:
        assert [batch.tolist() for batch, _ in stream] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]

    def check(i):
        with tf.control_dependencies([tf.debugging.assert_less(i, tf.constant(3, tf.int64), message="too big")]):
            return tf.identity(i)

    def failing(params):
        return tf.data.Dataset.range(10).map(check).batch(2)

    with InputStream(failing, {}, cluster=Cluster("localhost:2222")) as stream:
        assert next(stream)[0].tolist() == [0, 1]
        with pytest.raises(tf.errors.InvalidArgumentError, match="too big"):
            next(stream)


def test_two_in_process_workers_send_fixed_batches_and_nothing_listens(listening_ports):
    listening_before = listening_ports()
    stream = InputStream(input_fn, {"batch_size": BATCH}, cluster=Cluster("localhost:2222"), num_input_workers=2)
    try:
        assert stream.servers is None and stream.workers == ("worker:0 (in-process)", "worker:1 (in-process)")
        shapes = set()
        _read_until(stream, lambda: min(stream.stats().samples_per_worker.values()) >= 16 * BATCH)
        for _ in range(10):
            features, labels = next(stream)
            shapes.add((features.shape, labels.shape))
        stats = stream.stats()
        assert shapes == {((BATCH, 3), (BATCH,))}
        assert all(count >= 16 * BATCH for count in stats.samples_per_worker.values()), stats
        assert stats.samples == stats.batches * BATCH
        assert abs(sum(stats.share(w) for w in stats.workers) - 1.0) < 1e-9
        summary = stats.summary_values()
        expected = {"input/samples_per_sec", "input/wait_secs", "input/worker_0_share", "input/worker_1_share"}
        assert expected <= set(summary)
        assert summary["input/samples_per_sec"] > 0 and summary["input/wait_secs"] > 0
        assert listening_ports() == listening_before  # no server, on any interface
    finally:
        stream.close()
    assert not any(thread.is_alive() for thread in stream._threads)


def test_in_process_workers_each_run_a_finite_dataset_whole():
    """Parallel epochs: each worker sends every batch once; the stream ends when both have ended."""
    def finite(params):
        return tf.data.Dataset.range(12).batch(3)

    with InputStream(finite, {}, cluster=Cluster("localhost:2222"), num_input_workers=2) as stream:
        batches = sorted(batch.tolist() for batch, _ in stream)
        stats = stream.stats()
        with pytest.raises(StopIteration):
            next(stream)
    assert batches == sorted(2 * [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]])
    assert stats.samples_per_worker == {"worker:0 (in-process)": 12, "worker:1 (in-process)": 12}


def test_each_worker_shuffles_differently():
    """Per-worker first epochs differ: the unseeded shuffle draws new seeds on every worker."""
    def first_epoch_input_fn(params):
        return tf.data.Dataset.range(64).shuffle(64).batch(64).repeat()

    with InputStream(first_epoch_input_fn, {}, cluster=Cluster("localhost:2222"), num_input_workers=2) as stream:
        orders: dict[str, list] = {}
        deadline = time.monotonic() + 30
        while len(orders) < 2 and time.monotonic() < deadline:
            before = stream.stats().samples_per_worker
            features, _ = next(stream)
            after = stream.stats().samples_per_worker
            worker = next(w for w in after if after[w] != before[w])
            orders.setdefault(worker, features.tolist())
    assert len(orders) == 2
    first, second = orders.values()
    assert sorted(first) == sorted(second) == list(range(64)) and first != second


def test_local_mode_reads_in_this_process_whatever_tf_config_lists(monkeypatch):
    """Evaluation and prediction on the system read through InputStream.local."""
    monkeypatch.setenv("TF_CONFIG", _two_loopback_workers().tf_config("chief", 0))
    with InputStream.local(input_fn, {"batch_size": BATCH}) as stream:
        assert next(stream)[0].shape == (BATCH, 3)
    assert stream.servers is None and stream.workers == ("chief",) and stream.plan.mode == "local"


def test_input_fn_errors_reach_the_user():
    def broken_input_fn(params):
        raise ValueError("no such data file: /data/train.tfrecord")

    with pytest.raises(ValueError, match="no such data file"):
        InputStream(broken_input_fn, {}, cluster=Cluster("localhost:2222"), num_input_workers=2)
    with pytest.raises(InputFunctionError, match="must return a tf.data.Dataset"):
        InputStream(lambda params: [1, 2], {}, cluster=Cluster("localhost:2222"))


def test_a_pipeline_error_on_a_worker_names_the_worker_and_the_user_line():
    def failing_input_fn(params):
        def check(i):
            tf.debugging.assert_less(i, tf.constant(40, tf.int64), message="sample id out of range in preprocess")
            return tf.cast(i, tf.float32)

        return tf.data.Dataset.range(64).map(check).batch(4, drop_remainder=True).repeat()

    with InputStream(failing_input_fn, {}, cluster=Cluster("localhost:2222"), num_input_workers=2) as stream:
        with pytest.raises(InputWorkerError) as info:
            for _ in range(100):
                next(stream)
    message = str(info.value)
    assert "The input pipeline failed on input worker worker:" in message and "(in-process)" in message
    assert "sample id out of range in preprocess" in message
    assert "test_embedded.py" in message  # the assert_less line in the user's input_fn


def test_registration_timeout_names_the_missing_task():
    addresses = tuple(f"127.0.0.1:{service.free_port()}" for _ in range(2))
    dispatcher = service.start_dispatcher(0, addresses)
    cluster = Cluster(f"127.0.0.1:{dispatcher.target.rsplit(':', 1)[1]}", addresses)
    servers = InputServers(cluster, dispatcher)
    try:
        servers.workers.append(service.start_worker(cluster.dispatcher_address, addresses[0]))
        started = time.monotonic()
        with pytest.raises(InputWorkerError) as info:
            service.wait_for_workers(dispatcher, cluster, timeout_secs=1.0)
        assert time.monotonic() - started < 10
    finally:
        servers.stop()
    message = str(info.value)
    assert "1 of 2 registered" in message
    assert f"worker:1 ({addresses[1]}): nothing listening" in message
    assert "worker:0" not in message.split("What to do")[0]
    assert "python -m cerebras_tf.input_workers;" in message and '"index": 1' in message


def test_a_cs_run_config_with_two_input_workers_streams_from_two_embedded_workers():
    from cerebras_tf import CSRunConfig

    config = CSRunConfig(cs_ip="localhost:9000", num_input_workers=2, input_worker_timeout_secs=30)
    settings = CSSettings.resolve(config, environ={})
    with InputStream.from_settings(input_fn, {"batch_size": BATCH}, settings.input_workers) as stream:
        assert (stream.plan.mode, len(stream.workers)) == ("embedded", 2)
        assert next(stream)[0].shape == (BATCH, 3)
    with pytest.raises(ValueError, match="input_worker_timeout_secs"):
        CSRunConfig(input_worker_timeout_secs=0)


def _two_loopback_workers() -> Cluster:
    return Cluster(f"127.0.0.1:{service.free_port()}", tuple(f"127.0.0.1:{service.free_port()}" for _ in range(2)))


def test_the_chief_names_the_tf_config_workers_that_never_registered():
    cluster = _two_loopback_workers()
    with pytest.raises(InputWorkerError) as info:
        InputStream(input_fn, {"batch_size": BATCH}, cluster=cluster, timeout_secs=1.0)
    message = str(info.value)
    assert "0 of 2 registered" in message
    assert cluster.worker_name(0) in message and cluster.worker_name(1) in message
    assert not is_listening(cluster.dispatcher_address)  # the dispatcher was stopped


def test_the_dispatcher_says_what_listens_and_warns_when_every_task_is_on_this_machine(caplog):
    """TF's servers listen on every interface without authentication: logged once per port."""
    local = _two_loopback_workers()
    remote = Cluster("10.1.2.3:2222", ("10.1.2.4:2223", "10.1.2.5:2224"))
    caplog.set_level(logging.INFO, logger="cerebras_tf.input_workers")
    service.log_listening("tf.data service dispatcher", 40001, local)
    service.log_listening("tf.data service dispatcher", 40001, local)  # once per port
    service.log_listening("input worker worker:0 (10.1.2.4:2223)", 40002, remote)
    records = [r for r in caplog.records if "listens on port" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.WARNING, logging.INFO]
    assert "port 40001 of every network interface" in records[0].getMessage()
    assert "num_input_workers=N" in records[0].getMessage()
    assert "no authentication" in records[1].getMessage() and "10.1.2.5:2224" in records[1].getMessage()
