"""tf.data service servers for TF_CONFIG's input workers: the chief's dispatcher,
a worker's server, the registration wait, shutdown, and the log line saying
what listens.

The dispatcher is configured with the fixed list of worker addresses: this is
what lets every worker learn its own index (tf.data service's static-sharding
"HINT" rewrite, see stream.py), and the dispatcher refuses workers that are not
in the list.

Registration: TF exposes only the number of registered workers
(`DispatchServer._num_workers()`, a private but stable method since TF 2.4), not
which ones. `wait_for_workers` polls that count; on timeout it names the missing
tasks by probing each worker address with a TCP connect (nothing listening =
not started). If every address answers but the count is short, it names them
all as unconfirmed, since TF cannot tell which one failed to register.

Exposure: TF's tf.data service servers listen on every interface of the
machine (`[::]:port`; their configs have no bind address), and tf.data service
has no authentication: whoever reaches a worker or the dispatcher can have it
run dataset graphs. So they are started only when TF_CONFIG names worker tasks
(in-process workers use no network, see stream.py), and each process says once
which of its ports listen and to whom (`log_listening`).
"""
from __future__ import annotations

import logging
import socket
import time
from typing import Sequence

import tensorflow as tf

from cerebras_tf.errors import InputWorkerError
from cerebras_tf.cluster import Cluster

log = logging.getLogger("cerebras_tf.input_workers")

_service = tf.data.experimental.service

_LOOPBACK_HOSTS = ("127.", "localhost", "::1", "[::1]")
_logged_ports: set[int] = set()

WORKER_HEARTBEAT_MS = 500
DISPATCHER_WORKER_TIMEOUT_MS = 3000


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (small race; fine for local servers)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_listening(address: str, timeout: float = 0.5) -> bool:
    """True if something accepts a TCP connection at 'host:port'."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def is_loopback(address: str) -> bool:
    """True if a 'host:port' names this machine's loopback interface."""
    return address.rsplit(":", 1)[0].lower().startswith(_LOOPBACK_HOSTS)


def log_listening(what: str, port: int, cluster: Cluster) -> None:
    """Say once per process and port that a tf.data service server listens on every interface, without
    authentication; a warning when every task of `cluster` is on this machine (nobody asked for the network)."""
    if port in _logged_ports:
        return
    _logged_ports.add(port)
    addresses = (cluster.chief, *cluster.workers)
    if all(is_loopback(address) for address in addresses):
        log.warning(
            "The %s listens on port %d of every network interface, although every TF_CONFIG task is on this "
            "machine: TF's tf.data service servers cannot be bound to loopback, and they have no authentication "
            "(anyone who reaches the port can have it run dataset graphs). For input workers on one machine use "
            "CSRunConfig(num_input_workers=N) without TF_CONFIG workers: they use no network.", what, port)
        return
    log.info(
        "The %s listens on port %d of every network interface (tf.data service has no authentication: keep the "
        "chief and the input workers %s on a trusted network, and this port closed to other hosts).",
        what, port, ", ".join(cluster.workers))


def start_dispatcher(port: int, worker_addresses: Sequence[str]) -> "tf.data.experimental.service.DispatchServer":
    """Start a dispatcher on `port` (0: any free port) that accepts exactly `worker_addresses`."""
    config = _service.DispatcherConfig(
        port=port,
        worker_addresses=list(worker_addresses),
        worker_timeout_ms=DISPATCHER_WORKER_TIMEOUT_MS,
    )
    try:
        return _service.DispatchServer(config)
    except tf.errors.OpError as exc:
        raise InputWorkerError(
            f"Could not start the tf.data service dispatcher on port {port}: {exc.message}",
            fix="Free that port, or give the chief another port in TF_CONFIG field 'cluster.chief'.",
        ) from None


def start_worker(dispatcher_address: str, worker_address: str, *, dispatcher_timeout_ms: int | None = None
                 ) -> "tf.data.experimental.service.WorkerServer":
    """Start a worker serving at `worker_address` that registers with the dispatcher.

    Blocks (holding the GIL) until the dispatcher answers; call it once the
    dispatcher is known to be listening.
    """
    port = int(worker_address.rsplit(":", 1)[1])
    config = _service.WorkerConfig(
        dispatcher_address=dispatcher_address,
        worker_address=worker_address,
        port=port,
        heartbeat_interval_ms=WORKER_HEARTBEAT_MS,
        dispatcher_timeout_ms=dispatcher_timeout_ms,
    )
    return _service.WorkerServer(config)


def registered_workers(dispatcher: "tf.data.experimental.service.DispatchServer") -> int:
    """How many workers have registered with `dispatcher` (TF keeps lost workers in this count)."""
    return int(dispatcher._num_workers())


def wait_for_workers(
    dispatcher: "tf.data.experimental.service.DispatchServer",
    cluster: Cluster,
    timeout_secs: float,
    poll_secs: float = 0.1,
) -> None:
    """Block until every worker of `cluster` has registered, or raise InputWorkerError naming the missing ones."""
    expected = len(cluster.workers)
    deadline = time.monotonic() + timeout_secs
    count = registered_workers(dispatcher)
    if count < expected:
        log.info("Waiting up to %.0f s for %d input worker(s) to register with the dispatcher at %s.",
                 timeout_secs, expected, cluster.dispatcher_address)
    while count < expected and time.monotonic() < deadline:
        time.sleep(poll_secs)
        count = registered_workers(dispatcher)
    if count >= expected:
        log.info("All %d input worker(s) registered.", expected)
        return
    silent = [i for i, address in enumerate(cluster.workers) if not is_listening(address)]
    if silent:
        missing = "; ".join(f"{cluster.worker_name(i)}: nothing listening at its address" for i in silent)
    else:
        missing = "; ".join(
            f"{cluster.worker_name(i)}: listening, registration unconfirmed" for i in range(expected)
        )
    commands = " ".join(
        f"[on {cluster.workers[i].rsplit(':', 1)[0]}] TF_CONFIG='{cluster.tf_config('worker', i)}' "
        "python -m cerebras_tf.input_workers;"
        for i in (silent or range(expected))
    )
    raise InputWorkerError(
        f"Timed out after {timeout_secs:g} s waiting for input workers to register with the dispatcher at "
        f"{cluster.dispatcher_address}: {count} of {expected} registered. Missing tasks: {missing}.",
        fix=f"Start each missing worker with the same cluster in TF_CONFIG: {commands} "
        "or raise CSRunConfig(input_worker_timeout_secs=...).",
    )


class InputServers:
    """The dispatcher (and, in tests, workers started in this process) of one input stream.

    `stop()` is idempotent and stops workers before the dispatcher.
    """

    def __init__(self, cluster: Cluster, dispatcher: "tf.data.experimental.service.DispatchServer",
                 workers: Sequence["tf.data.experimental.service.WorkerServer"] = ()) -> None:
        self.cluster = cluster
        self.dispatcher = dispatcher
        self.workers = list(workers)
        self._stopped = False

    @property
    def target(self) -> str:
        """What tf.data service's `distribute(service=...)` takes."""
        return self.dispatcher.target

    @classmethod
    def for_cluster(cls, cluster: Cluster, timeout_secs: float = 120.0) -> "InputServers":
        """The chief's dispatcher on its TF_CONFIG port; waits for the TF_CONFIG workers to register."""
        port = int(cluster.chief.rsplit(":", 1)[1])
        servers = cls(cluster, start_dispatcher(port, cluster.workers))
        log_listening("tf.data service dispatcher for the input workers", port, cluster)
        try:
            wait_for_workers(servers.dispatcher, cluster, timeout_secs)
        except BaseException:
            servers.stop()
            raise
        return servers

    def stop_worker(self, index: int) -> None:
        """Stop one worker started in this process (tests: a lost worker)."""
        self.workers[index].stop()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for worker in self.workers:
            try:
                worker.stop()
            except tf.errors.OpError as exc:  # already stopped
                log.debug("Stopping an input worker: %s", exc)
        self.dispatcher.stop()
        log.info("Stopped the input dispatcher at %s.", self.cluster.dispatcher_address)

    def __enter__(self) -> "InputServers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
