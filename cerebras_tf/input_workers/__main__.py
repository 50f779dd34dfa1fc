"""An input worker: `python -m cerebras_tf.input_workers` on each worker machine.

Reads TF_CONFIG (this task must be {"type": "worker", "index": i}), waits for the
chief's tf.data service dispatcher at the 'cluster.chief' address, starts a
tf.data service worker at its own 'cluster.worker[i]' address that registers
with it, and serves the chief's input pipeline until the dispatcher goes away
(the chief finished) or the process gets SIGTERM/SIGINT. Exit status: 0 after a
normal end, 2 for a bad TF_CONFIG, 3 if the chief never appeared, 4 if the
worker server could not start (e.g. its port is taken).

    export TF_CONFIG='{"cluster": {"chief": ["chief:2222"], "worker": ["w0:2223", "w1:2224"]},
                       "task": {"type": "worker", "index": 0}}'
    python -m cerebras_tf.input_workers

(`python -m cerebras_tf.input_worker` is an alias kept for existing scripts.)
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from typing import Sequence

from cerebras_tf.errors import ConfigError
from cerebras_tf.cluster import parse_tf_config

log = logging.getLogger("cerebras_tf.input_workers")


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m cerebras_tf.input_workers", description=__doc__.split("\n")[0])
    parser.add_argument("--wait-for-chief-secs", type=float, default=600.0,
                        help="how long to wait for the chief's dispatcher to start (default 600)")
    parser.add_argument("--chief-gone-secs", type=float, default=3.0,
                        help="stop once the dispatcher has not answered for this long (default 3)")
    parser.add_argument("--poll-secs", type=float, default=0.5, help="how often to check the dispatcher")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s input_worker %(levelname)s: %(message)s")
    try:
        cluster = parse_tf_config(os.environ.get("TF_CONFIG"))
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    if cluster.task_type != "worker":
        log.error("TF_CONFIG field 'task.type' is %r; an input worker needs {\"type\": \"worker\", \"index\": i}.",
                  cluster.task_type)
        return 2
    name = cluster.worker_name(cluster.task_index)
    address = cluster.workers[cluster.task_index]

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("Got signal %d; stopping.", signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    from cerebras_tf.input_workers.service import is_listening, log_listening, start_worker  # imports TensorFlow

    log.info("Input worker %s: waiting up to %.0f s for the chief's dispatcher at %s.",
             name, args.wait_for_chief_secs, cluster.dispatcher_address)
    deadline = time.monotonic() + args.wait_for_chief_secs
    while not is_listening(cluster.dispatcher_address):
        if stop.is_set():
            return 0
        if time.monotonic() > deadline:
            log.error("The chief's dispatcher at %s did not start within %.0f s (TF_CONFIG field 'cluster.chief'). "
                      "Start the chief's training script, or check the address.",
                      cluster.dispatcher_address, args.wait_for_chief_secs)
            return 3
        stop.wait(args.poll_secs)

    try:
        server = start_worker(cluster.dispatcher_address, address)
    except Exception as exc:  # noqa: BLE001 - e.g. the port is taken
        log.error("Could not start input worker %s (TF_CONFIG field 'cluster.worker[%d]'): %s. Free the port or "
                  "give this worker another address in TF_CONFIG on every machine.", name, cluster.task_index,
                  getattr(exc, "message", exc))
        return 4
    log.info("Input worker %s registered with the dispatcher at %s; serving.", name, cluster.dispatcher_address)
    log_listening(f"input worker {name}", int(address.rsplit(":", 1)[1]), cluster)
    try:
        gone_since: float | None = None
        while not stop.wait(args.poll_secs):
            if is_listening(cluster.dispatcher_address):
                gone_since = None
                continue
            gone_since = gone_since or time.monotonic()
            if time.monotonic() - gone_since >= args.chief_gone_secs:
                log.info("The chief's dispatcher at %s is gone (training finished); stopping.",
                         cluster.dispatcher_address)
                break
    finally:
        server.stop()
        log.info("Input worker %s stopped.", name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
