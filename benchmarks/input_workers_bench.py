"""Input-worker benchmark: an input-bound pipeline streamed with 1 and 2 workers.

Usage: python benchmarks/input_workers_bench.py [--secs 8] [--cost 32] [--processes]

The pipeline's map is expensive (a chain of small matmuls per sample) and runs
sequentially with one intra-op thread, so one worker uses about one core: what
a second worker adds is a second core's worth of input. Modes, in one run:
  local      input in the chief's process, no tf.data service (the 1-worker default)
  1 worker   one tf.data service worker (embedded, or a process with --processes)
  2 workers  two tf.data service workers
Prints samples/s for each and the 2-worker / 1-worker ratio (target >= 1.6x on
2 cores). Exits non-zero if the ratio is below the target.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from cerebras_tf.input_workers import Cluster, InputStream  # noqa: E402
from cerebras_tf.input_workers.service import free_port  # noqa: E402

TARGET_RATIO = 1.6
BATCH = 32
FEATURES = 64


def input_fn(params):
    """An input-bound pipeline: every sample pays `cost` 64x64 matmuls."""
    cost = params["cost"]

    def expensive(i):
        x = tf.random.uniform([FEATURES, FEATURES], seed=None) + tf.cast(i % 7, tf.float32)
        w = tf.eye(FEATURES) * 0.5
        for _ in range(cost):
            x = tf.tanh(tf.matmul(x, w) + x)
        return x[0], tf.cast(i % 10, tf.int32)

    options = tf.data.Options()
    options.threading.max_intra_op_parallelism = 1
    options.threading.private_threadpool_size = 1
    options.autotune.enabled = False
    ds = tf.data.Dataset.range(10_000_000).shuffle(1000).map(expensive)  # sequential: one core per worker
    return ds.batch(params["batch_size"], drop_remainder=True).repeat().prefetch(2).with_options(options)


def measure(stream: InputStream, secs: float) -> tuple[float, dict[str, int], float]:
    """samples/s over `secs` after a warm-up, the per-worker sample counts, and the input-wait fraction."""
    warm_until = time.monotonic() + min(2.0, secs / 3)
    while time.monotonic() < warm_until:
        next(stream)
    start_stats, start = stream.stats(), time.monotonic()
    while time.monotonic() - start < secs:
        next(stream)
    end = stream.stats()
    elapsed = time.monotonic() - start
    per_worker = {w: end.samples_per_worker[w] - start_stats.samples_per_worker[w] for w in end.workers}
    wait = (end.input_wait_secs - start_stats.input_wait_secs) / elapsed
    return sum(per_worker.values()) / elapsed, per_worker, wait


def _worker_processes(n: int) -> tuple[Cluster, list[subprocess.Popen]]:
    cluster = Cluster(f"127.0.0.1:{free_port()}", tuple(f"127.0.0.1:{free_port()}" for _ in range(n)))
    procs = []
    for i in range(n):
        env = dict(os.environ, TF_CONFIG=cluster.tf_config("worker", i), PYTHONPATH=ROOT)
        procs.append(subprocess.Popen([sys.executable, "-m", "cerebras_tf.input_worker", "--chief-gone-secs", "1"],
                                      cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return cluster, procs


def run(mode: str, workers: int, params: dict, secs: float) -> tuple[float, dict[str, int], float]:
    procs: list[subprocess.Popen] = []
    if mode == "local":
        stream = InputStream(input_fn, params, cluster=Cluster("localhost:2222"))
    elif mode == "processes":
        cluster, procs = _worker_processes(workers)
        stream = InputStream(input_fn, params, cluster=cluster, timeout_secs=120)
    else:
        stream = InputStream(input_fn, params, cluster=Cluster("localhost:2222"), num_input_workers=workers,
                             force_service=True)
    try:
        return measure(stream, secs)
    finally:
        stream.close()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secs", type=float, default=8.0, help="measured seconds per configuration")
    parser.add_argument("--cost", type=int, default=32, help="matmuls per sample in the map")
    parser.add_argument("--processes", action="store_true",
                        help="run workers as `python -m cerebras_tf.input_worker` processes, not embedded")
    args = parser.parse_args(argv)
    params = {"batch_size": BATCH, "cost": args.cost}
    service_mode = "processes" if args.processes else "embedded"
    print(f"input-bound pipeline: batch {BATCH}, {args.cost} matmuls {FEATURES}x{FEATURES} per sample; "
          f"{os.cpu_count()} cores; workers: {service_mode}")
    rows = []
    for label, mode, workers in (("local (no service)", "local", 1), ("1 worker", service_mode, 1),
                                 ("2 workers", service_mode, 2)):
        rate, per_worker, wait = run(mode, workers, params, args.secs)
        shares = " / ".join(f"{count / max(1, sum(per_worker.values())):.0%}" for count in per_worker.values())
        rows.append((label, rate, shares, wait))
    print(f"{'configuration':<20} {'samples/s':>10} {'worker shares':>16} {'input wait':>11}")
    for label, rate, shares, wait in rows:
        print(f"{label:<20} {rate:>10.0f} {shares:>16} {wait:>10.0%}")
    ratio = rows[2][1] / rows[1][1]
    print(f"2 workers / 1 worker: {ratio:.2f}x (target >= {TARGET_RATIO}x); "
          f"2 workers / local: {rows[2][1] / rows[0][1]:.2f}x")
    return 0 if ratio >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
