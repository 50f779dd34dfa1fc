"""InputStream: numpy (features, labels) batches for the simulated WSE, read in
the chief's process (by one reader, or by several in-process workers), or
streamed from TF_CONFIG's input workers over tf.data service.

How it works:
- input_fn(params) runs once, on the chief, in eager mode. Every worker runs
  the whole pipeline (parallel epochs): an in-process worker is a reader
  thread with its own iterator of the dataset; a TF_CONFIG worker receives the
  dataset graph from tf.data service. An unseeded shuffle draws fresh random
  seeds for every iterator, so each worker sends its own order. The CS rules on the pipeline
  (no fixed shuffle seed with several workers, no Python functions for remote
  workers) are not checked here: precheck applies them, once, to the dataset
  it captured (rules/input.py), before any server starts.
- In-process workers use no network at all: nothing listens, and each reader
  thread knows its index. Their speed-up over one reader comes from TF running
  the iterators' GetNext (which releases the GIL) on several cores at once.
- Worker attribution over tf.data service: it does not say which worker produced an
  element, so each worker tags its elements with its own index. The dataset is
  zipped with `range(N).shard(SHARD_HINT, SHARD_HINT).repeat()`, and the
  dispatcher's static-sharding HINT policy rewrites the placeholders to
  (number of workers, this worker's index); the index is the worker's position
  in TF_CONFIG 'cluster.worker'. Nothing else is sharded: the user's data is not
  touched, so every worker still runs the whole dataset. The tag is stripped
  before a batch is yielded.
- Background threads read the tf.data service iterator (or the local
  iterators) into a small buffer, so input overlaps the
  training steps; the consumer's wait on that buffer is the input-wait time.
  Elements travel uncompressed (numeric batches compress poorly; compressing costs worker and
  chief CPU). The client is tf.data service's private `_distribute`, for its
  task_refresh_interval_hint_ms (how fast a new or lost worker is noticed).
- Faults of TF_CONFIG workers: a monitor probes each worker address (TCP connect) every
  `probe_interval_secs`; two failed probes in a row mark a worker lost
  (warning naming it; tf.data service keeps reading from the others). When all
  are lost the stream raises InputWorkerError once the buffer is drained
  (tf.data service itself would wait forever). An error raised by the pipeline
  on a worker arrives as "Failed to get element from worker <address>: ..."
  (taken apart in failures.py); the stream raises InputWorkerError naming the
  worker, the TF error, and the line of the user's input_fn that created the
  failing op (estimator.dataset.failing_op_location). An in-process
  worker's pipeline error gets the same InputWorkerError; an in-process
  worker cannot be lost on its own (it dies with the chief).
- Evaluation and prediction on the system read through the same class in local
  mode (InputStream.local): input_fn's data in the chief's process, read ahead.
"""
from __future__ import annotations

import dataclasses
import gc
import logging
import queue
import threading
import time
import warnings
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.python.data.experimental.ops import data_service_ops

from cerebras_tf.cluster import LOCAL_PLAN, Cluster, InputPlan, check_num_input_workers, cluster_from_environ, \
    plan_input_workers
from cerebras_tf.errors import InputFunctionError, InputWorkerError, InputWorkerWarning
from cerebras_tf.input_workers.failures import parse_worker_error
from cerebras_tf.input_workers.service import InputServers, is_listening
from cerebras_tf.settings import InputWorkerSettings
from estimator.dataset import failing_op_location
from estimator.eager import eager_thread, eagerly
from estimator.source import function_location

log = logging.getLogger("cerebras_tf.input_workers")

Batch = tuple[Any, Any]  # (features, labels or None) as numpy arrays

_LOST_AFTER_FAILED_PROBES = 2


@dataclasses.dataclass
class InputStats:
    """Counters of one stream; `samples` counts batches' leading dimension."""

    workers: tuple[str, ...]
    samples_per_worker: dict[str, int]
    batches: int = 0
    input_wait_secs: float = 0.0
    elapsed_secs: float = 0.0
    lost_workers: tuple[str, ...] = ()

    @property
    def samples(self) -> int:
        return sum(self.samples_per_worker.values())

    @property
    def samples_per_sec(self) -> float:
        return self.samples / self.elapsed_secs if self.elapsed_secs > 0 else 0.0

    def share(self, worker: str) -> float:
        """Fraction of all samples that `worker` produced."""
        return self.samples_per_worker.get(worker, 0) / self.samples if self.samples else 0.0

    def summary_values(self) -> dict[str, float]:
        """Scalars for TensorBoard: throughput, input wait, per-worker share."""
        values = {
            "input/samples_per_sec": self.samples_per_sec,
            "input/wait_secs": self.input_wait_secs,
            "input/wait_fraction": self.input_wait_secs / self.elapsed_secs if self.elapsed_secs > 0 else 0.0,
            "input/workers_lost": float(len(self.lost_workers)),
        }
        for index, worker in enumerate(self.workers):
            values[f"input/worker_{index}_share"] = self.share(worker)
        return values


class _End:
    pass


class _Failure:
    """A reader error, and the in-process worker whose reader raised it (None: tf.data service's reader).
    From tf.data service it is kept as text only: the exception's frames would keep the iterator (and its
    service client) alive after the dispatcher stops. A local error is kept whole: the chief's lone reader
    re-raises it as it is."""

    def __init__(self, error: BaseException, worker: int | None, keep: bool = False) -> None:
        self.kind = type(error).__name__
        self.text = getattr(error, "message", None) or str(error)
        self.worker = worker
        self.error = error if keep else None


class InputStream:
    """Iterate numpy (features, labels) batches of `input_fn(params)`.

    Args:
      input_fn: the user's input function, called once, with `params` only.
      params: the params dict passed to input_fn.
      cluster: the TF_CONFIG cluster; default: parsed from the environment.
      num_input_workers: >1 without TF_CONFIG workers reads with that many
        in-process workers (no network); 1/None with no TF_CONFIG workers reads locally.
      plan: where input runs, already decided (CSSettings' plan, or LOCAL_PLAN);
        replaces num_input_workers.
      timeout_secs: how long to wait for TF_CONFIG workers to register.
      probe_interval_secs: how often the worker addresses are probed.
      buffer_size: batches read ahead (from tf.data service, or locally).
      servers: an already running dispatcher for TF_CONFIG workers to stream
        through (e.g. kept for several streams, so the workers do not see the
        chief go away in between); the stream leaves it running on close().

    A CS run builds it with `from_settings` (training) or `local` (evaluation,
    prediction). Use as a context manager, or call close(): it stops its
    reader threads and the dispatcher it started for TF_CONFIG workers.
    """

    def __init__(
        self,
        input_fn: Callable[[Mapping[str, Any]], tf.data.Dataset],
        params: Mapping[str, Any] | None = None,
        *,
        cluster: Cluster | None = None,
        num_input_workers: int | None = None,
        plan: InputPlan | None = None,
        timeout_secs: float = 120.0,
        probe_interval_secs: float = 0.5,
        buffer_size: int = 8,
        servers: InputServers | None = None,
    ) -> None:
        self._params = dict(params or {})
        self._cluster = cluster if cluster is not None else cluster_from_environ()
        if plan is None:
            plan = plan_input_workers(self._cluster, check_num_input_workers(num_input_workers, "InputStream"))
        if servers is not None:
            plan = InputPlan("cluster", len(servers.cluster.workers))
        self.plan: InputPlan = plan
        self._input_fn = input_fn
        self._probe_interval = probe_interval_secs
        self._servers: InputServers | None = servers
        self._owns_servers = servers is None
        self._readers = 0  # reader threads started; the stream ends when every one has ended
        self._ended = 0
        self._failure: _Failure | None = None
        self._closed = False
        self._stop = threading.Event()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, buffer_size))
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._lost: set[int] = set()
        self._failed_probes: dict[int, int] = {}
        self._started_at: float | None = None

        with eagerly():  # the Dataset is iterated in Python, also where the script disabled eager execution
            self._start(input_fn, timeout_secs)
        self._stats = InputStats(self._worker_names, {name: 0 for name in self._worker_names})

    def _start(self, input_fn: Callable[[Mapping[str, Any]], tf.data.Dataset], timeout_secs: float) -> None:
        """Build input_fn's Dataset (and, for TF_CONFIG workers, the dispatcher) and start reading it."""
        dataset = _call_input_fn(input_fn, self._params)
        self._dataset = dataset
        if self.plan.mode == "local":
            self._worker_names: tuple[str, ...] = ("chief",)
            self._start_reader(0, _elements(dataset))
        elif self.plan.mode == "embedded":
            self._worker_names = tuple(f"worker:{i} (in-process)" for i in range(self.plan.num_workers))
            for index in range(self.plan.num_workers):
                self._start_reader(index, _elements(dataset))
        else:
            if self._servers is None:
                self._servers = InputServers.for_cluster(self._cluster, timeout_secs)
            try:
                self._worker_names = tuple(
                    self._servers.cluster.worker_name(i) for i in range(len(self._servers.cluster.workers))
                )
                self._start_threads(_tag_by_worker(dataset, len(self._worker_names)), self._servers.target)
            except BaseException:
                self.close()
                raise

    @classmethod
    def from_settings(cls, input_fn: Callable[[Mapping[str, Any]], tf.data.Dataset],
                      params: Mapping[str, Any] | None, settings: InputWorkerSettings,
                      **kwargs: Any) -> "InputStream":
        """The stream of a CS training run: the cluster, plan and registration timeout its CSSettings resolved."""
        kwargs.setdefault("timeout_secs", settings.timeout_secs)
        return cls(input_fn, params, cluster=settings.cluster, plan=settings.plan, **kwargs)

    @classmethod
    def local(cls, input_fn: Callable[[Mapping[str, Any]], tf.data.Dataset], params: Mapping[str, Any] | None,
              **kwargs: Any) -> "InputStream":
        """input_fn's batches read in this process, whatever TF_CONFIG says (evaluation and prediction on the
        system read their input in the chief's process)."""
        return cls(input_fn, params, cluster=Cluster("localhost:2222"), plan=LOCAL_PLAN, **kwargs)

    # -- public API --------------------------------------------------------

    @property
    def servers(self) -> InputServers | None:
        """The tf.data service dispatcher this stream started for TF_CONFIG workers (None when reading in this
        process)."""
        return self._servers

    @property
    def workers(self) -> tuple[str, ...]:
        return self._worker_names

    def stats(self) -> InputStats:
        """A snapshot of the counters."""
        with self._lock:
            elapsed = time.monotonic() - self._started_at if self._started_at is not None else 0.0
            return dataclasses.replace(
                self._stats,
                samples_per_worker=dict(self._stats.samples_per_worker),
                elapsed_secs=elapsed,
                lost_workers=tuple(self._worker_names[i] for i in sorted(self._lost)),
            )

    def __iter__(self) -> "InputStream":
        return self

    def __next__(self) -> Batch:
        if self._closed:
            raise InputWorkerError("The input stream is closed.", fix="Create a new InputStream.")
        if self._started_at is None:
            self._started_at = time.monotonic()
        waited_from = time.monotonic()
        worker, batch = self._next_from_reader()  # StopIteration once every reader's dataset has ended
        with self._lock:
            self._stats.input_wait_secs += time.monotonic() - waited_from
            self._stats.batches += 1
            self._stats.samples_per_worker[self._worker_names[worker]] += batch_size(batch)
        return batch

    def close(self) -> None:
        """Stop the reader threads and every server this stream started."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        wait_secs = 0.5 if self._all_lost() else 5.0  # with no worker left the reader is stuck in tf.data service
        for thread in self._threads:
            thread.join(timeout=wait_secs)
            if thread.is_alive():  # blocked inside tf.data service with no worker left
                log.warning("Input reader thread %s did not stop; abandoning it.", thread.name)
        while not self._queue.empty():
            self._queue.get_nowait()
        if self._servers is not None:
            # Destroy the tf.data service iterator (it sits in reference cycles) while
            # the dispatcher can still release its job.
            gc.collect()
            if self._owns_servers:
                self._servers.stop()

    def __enter__(self) -> "InputStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- reading -----------------------------------------------------------

    def _start_threads(self, dataset: tf.data.Dataset, target: str) -> None:
        distributed = dataset.apply(
            data_service_ops._distribute(
                processing_mode=tf.data.experimental.service.ShardingPolicy.HINT,
                service=target,
                task_refresh_interval_hint_ms=200,
                compression=None,
            )
        )
        self._start_reader(None, ((int(tag), element) for element, tag in _elements(distributed)))
        monitor = threading.Thread(target=self._monitor, name="cerebras-input-monitor", daemon=True)
        self._threads.append(monitor)
        monitor.start()

    def _start_reader(self, worker: int | None, elements: Iterator[Any]) -> None:
        """A thread reading elements ahead into the buffer, so input overlaps the steps: those of in-process
        worker `worker`, or (worker None) tf.data service's (worker index, element) pairs."""
        name = "cerebras-input-reader" if worker is None else f"cerebras-input-worker-{worker}"
        reader = threading.Thread(target=eager_thread(self._read), args=(worker, elements), name=name, daemon=True)
        self._threads.append(reader)
        self._readers += 1
        reader.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _read(self, worker: int | None, elements: Iterator[Any]) -> None:
        try:
            while not self._stop.is_set():
                try:
                    item = next(elements)
                except StopIteration:
                    self._put(_End())
                    return
                index, element = item if worker is None else (worker, item)
                if not self._put((index, _to_numpy(element))):
                    return
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            self._put(_Failure(exc, worker, keep=worker is not None))
        finally:
            del elements

    def _monitor(self) -> None:
        addresses = self._servers.cluster.workers if self._servers else ()
        while not self._stop.wait(self._probe_interval):
            for index, address in enumerate(addresses):
                up = is_listening(address, timeout=min(0.5, self._probe_interval))
                with self._lock:
                    failures = 0 if up else self._failed_probes.get(index, 0) + 1
                    self._failed_probes[index] = failures
                    lost_now = failures == _LOST_AFTER_FAILED_PROBES and index not in self._lost
                    back_now = up and index in self._lost
                    if lost_now:
                        self._lost.add(index)
                    if back_now:
                        self._lost.discard(index)
                    remaining = len(addresses) - len(self._lost)
                if lost_now:
                    message = f"Lost input worker {self._worker_names[index]}: nothing answers at its address. " + (
                        f"Training continues on the remaining {remaining} worker(s)." if remaining
                        else "No input worker is left.")
                    log.warning(message)
                    warnings.warn(message, InputWorkerWarning, stacklevel=1)
                if back_now:
                    log.warning("Input worker %s is reachable again.", self._worker_names[index])

    def _all_lost(self) -> bool:
        with self._lock:
            return bool(self._worker_names) and len(self._lost) == len(self._worker_names)

    def _next_from_reader(self) -> tuple[int, Batch]:
        if self._failure is not None:  # keeps reporting the first failure
            raise self._failure_error(self._failure) from None
        if self._ended >= self._readers:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=0.1)
                break
            except queue.Empty:
                if self._all_lost():
                    raise InputWorkerError(
                        f"All {len(self._worker_names)} input workers are lost ({', '.join(self._worker_names)}); "
                        "no input can reach the CS system.",
                        fix="Check the worker machines' logs, restart `python -m cerebras_tf.input_workers` on "
                        "them with the same TF_CONFIG, and resume training from the last checkpoint.",
                    ) from None
        if isinstance(item, _End):
            self._ended += 1
            if self._ended >= self._readers:
                raise StopIteration
            return self._next_from_reader()  # the other workers go on (parallel epochs)
        if isinstance(item, _Failure):
            self._failure = item
            raise self._failure_error(item) from None
        return item

    def _failure_error(self, failure: _Failure) -> BaseException:
        """The chief's lone reader raises the pipeline's error as it is; a worker's is an InputWorkerError."""
        if failure.error is not None and self.plan.mode == "local":
            return failure.error
        return self._worker_failure(failure)

    def _worker_failure(self, failure: _Failure) -> InputWorkerError:
        error = parse_worker_error(failure.text)
        worker = "an input worker"
        if failure.worker is not None:
            worker = f"input worker {self._worker_names[failure.worker]}"
        elif error.address is not None and self._servers is not None:
            cluster = self._servers.cluster
            if error.address in cluster.workers:
                worker = f"input worker {cluster.worker_name(cluster.workers.index(error.address))}"
            else:
                worker = f"the input worker at {error.address}"
        where = failing_op_location(self._dataset, error.nodes) or function_location(self._input_fn)
        return InputWorkerError(
            f"The input pipeline failed on {worker} ({failure.kind}): {error.message}",
            where=where,
            fix="Fix the input pipeline at the location above: each worker runs the dataset that input_fn builds "
            "(input_fn itself runs on the chief), so run input_fn locally to reproduce the error.",
        )


# -- helpers -----------------------------------------------------------------


def _call_input_fn(input_fn: Callable[..., Any], params: Mapping[str, Any]) -> tf.data.Dataset:
    """input_fn(params), which must be a Dataset to be streamed (for a CS run, precheck's
    rules.input.check_returns_dataset has reported it already, with the other problems)."""
    dataset = input_fn(params)
    if not isinstance(dataset, tf.data.Dataset):
        raise InputFunctionError(
            "Input function must return a tf.data.Dataset",
            where=function_location(input_fn),
            fix=f"It returned {type(dataset).__name__}; build and return a tf.data.Dataset of (features, labels).",
        )
    return dataset


def _elements(dataset: tf.data.Dataset) -> Iterator[Any]:
    """The Dataset's elements, iterated lazily (its iterator is made on the reader thread, in eager mode)."""
    yield from dataset


def _tag_by_worker(dataset: tf.data.Dataset, num_workers: int) -> tf.data.Dataset:
    """Zip each element with the index of the worker that produced it (see module docstring)."""
    hint = tf.data.experimental.SHARD_HINT
    tags = tf.data.Dataset.range(num_workers).shard(hint, hint).repeat()
    return tf.data.Dataset.zip((dataset, tags))


def _to_numpy(element: Any) -> Batch:
    element = tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, element)
    if isinstance(element, tuple) and len(element) == 2:
        return element[0], element[1]
    return element, None


def batch_size(batch: Batch) -> int:
    """Samples in a (features, labels) batch: the leading dimension of its first features array
    (features may be a nest, e.g. the Model Zoo's dict of input_ids, input_mask, ...)."""
    leaves = [leaf for leaf in tf.nest.flatten(batch[0]) if isinstance(leaf, np.ndarray) and leaf.ndim]
    return int(leaves[0].shape[0]) if leaves else 1
