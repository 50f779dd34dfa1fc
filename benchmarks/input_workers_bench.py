"""Input-worker benchmark: an input-bound pipeline trained on the simulated WSE with 1 and 2 input workers.

Usage: ./dev bench input_workers_bench [--steps 240] [--cost 256] [--embedded] [--stream-only]

The pipeline's map is expensive (a chain of small matmuls per sample) and runs
sequentially with one intra-op thread, so one worker uses about one core: what
a second worker adds is a second core's worth of input. The model is small, so
the simulated WSE waits for data. The default cost (256) keeps the chief's own
per-step work (executor step, tf.data service client) small next to the input;
with a cheap map (--cost 32, ~4,500 samples/s) the chief shares the 2 cores with
the workers and becomes the limit. In one run, CerebrasEstimator.train(use_cs=True)
trains the same model with:
  chief only   input in the chief's process (no TF_CONFIG workers, the default)
  1 worker     TF_CONFIG with one `python -m cerebras_tf.input_workers` process
  2 workers    TF_CONFIG with two worker processes
(--embedded: CSRunConfig(num_input_workers=N) in-process workers instead: reader
threads in the chief's process, no network; 1 in-process worker is the chief alone.)
samples/s is what training reports in its `samples/sec` summaries (mean after
the first logging window). Prints the table and the 2-worker / 1-worker ratio
(target >= 1.6x on 2 cores); exits non-zero below it. --stream-only measures
the InputStream alone, without training.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the worker processes import from here
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import cerebras_tf  # noqa: E402
from benchmarks.summaries import read_scalars  # noqa: E402
from cerebras_tf import CerebrasEstimator, CSRunConfig  # noqa: E402
from cerebras_tf.input_workers import Cluster, InputStream  # noqa: E402
from cerebras_tf.input_workers.service import free_port  # noqa: E402
from estimator import EstimatorSpec  # noqa: E402

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


def model_fn(features, labels, mode, params):
    """A small classifier: the simulated WSE's step is cheap next to the input pipeline."""
    hidden = tf.compat.v1.layers.dense(features, 32, activation=tf.nn.relu, name="fc1")
    logits = tf.compat.v1.layers.dense(hidden, 10, name="logits")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return EstimatorSpec(mode, loss=loss, train_op=train_op)


def _worker_processes(n: int) -> tuple[Cluster, list[subprocess.Popen]]:
    cluster = Cluster(f"127.0.0.1:{free_port()}", tuple(f"127.0.0.1:{free_port()}" for _ in range(n)))
    procs = []
    for i in range(n):
        env = dict(os.environ, TF_CONFIG=cluster.tf_config("worker", i), PYTHONPATH=ROOT)
        procs.append(subprocess.Popen([sys.executable, "-m", "cerebras_tf.input_workers", "--chief-gone-secs", "1"],
                                      cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return cluster, procs


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


def train(workers: int, embedded: bool, params: dict, steps: int, log_every: int) -> tuple[float, str, float]:
    """Train on the simulated WSE; returns samples/s, worker shares and the input-wait fraction it reported."""
    procs: list[subprocess.Popen] = []
    config = {"cs_ip": "localhost:9000", "log_step_count_steps": log_every, "save_checkpoints_steps": None}
    if embedded and workers:
        config["num_input_workers"] = workers
    elif workers:
        cluster, procs = _worker_processes(workers)
        os.environ["TF_CONFIG"] = cluster.tf_config("chief", 0)
    try:
        with tempfile.TemporaryDirectory() as model_dir:
            estimator = CerebrasEstimator(model_fn, model_dir=model_dir, params=params, config=CSRunConfig(**config))
            estimator.train(input_fn, max_steps=steps)
            rates = read_scalars(model_dir, "samples/sec")
            measured = [rates[step] for step in sorted(rates)[1:]]  # the first window includes start-up
            shares = [read_scalars(model_dir, f"input/worker_{i}_share").get(steps) for i in range(max(workers, 1))]
            wait = read_scalars(model_dir, "input/wait_fraction").get(steps, float("nan"))
    finally:
        os.environ.pop("TF_CONFIG", None)
        cerebras_tf.set_default_tf_config()  # a lone chief
        cerebras_tf.release_system()
        _stop(procs)
    share_text = " / ".join(f"{share:.0%}" for share in shares if share is not None) if workers > 1 else "-"
    return float(np.mean(measured)), share_text, wait


def run_stream(mode: str, workers: int, params: dict, secs: float) -> tuple[float, dict[str, int], float]:
    """The InputStream alone (--stream-only): samples/s, per-worker counts, input-wait fraction."""
    procs: list[subprocess.Popen] = []
    if mode == "local":
        stream = InputStream(input_fn, params, cluster=Cluster("localhost:2222"))
    elif mode == "processes":
        cluster, procs = _worker_processes(workers)
        stream = InputStream(input_fn, params, cluster=cluster, timeout_secs=120)
    else:
        stream = InputStream(input_fn, params, cluster=Cluster("localhost:2222"), num_input_workers=workers)
    try:
        return measure(stream, secs)
    finally:
        stream.close()
        _stop(procs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=240, help="training steps per configuration")
    parser.add_argument("--cost", type=int, default=256, help="matmuls per sample in the map")
    parser.add_argument("--embedded", action="store_true",
                        help="in-process workers (CSRunConfig(num_input_workers=N)) instead of worker processes")
    parser.add_argument("--stream-only", action="store_true", help="measure the InputStream alone, no training")
    parser.add_argument("--secs", type=float, default=8.0, help="--stream-only: measured seconds per configuration")
    args = parser.parse_args(argv)
    cerebras_tf.set_default_tf_config()
    params = {"batch_size": BATCH, "cost": args.cost}
    kind = "in-process" if args.embedded else "processes"
    what = "InputStream alone" if args.stream_only else "training on the simulated WSE"
    print(f"input-bound pipeline: batch {BATCH}, {args.cost} matmuls {FEATURES}x{FEATURES} per sample; "
          f"{os.cpu_count()} cores; workers: {kind}; {what}")
    rows = []
    for label, workers in (("chief only", 0), ("1 worker", 1), ("2 workers", 2)):
        if args.stream_only:
            mode = "local" if not workers else ("embedded" if args.embedded else "processes")
            rate, per_worker, wait = run_stream(mode, max(workers, 1), params, args.secs)
            total = max(1, sum(per_worker.values()))
            shares = " / ".join(f"{count / total:.0%}" for count in per_worker.values()) if workers > 1 else "-"
        else:
            if args.embedded and workers == 1:
                rows.append((label, float("nan"), "(same as chief only)", float("nan")))
                continue
            rate, shares, wait = train(workers, args.embedded, params, args.steps, log_every=args.steps // 8)
        rows.append((label, rate, shares, wait))
    print(f"{'configuration':<14} {'samples/s':>10} {'worker shares':>22} {'input wait':>11}")
    for label, rate, shares, wait in rows:
        print(f"{label:<14} {rate:>10.0f} {shares:>22} {wait:>10.0%}")
    one = rows[1][1] if rows[1][1] == rows[1][1] else rows[0][1]
    ratio = rows[2][1] / one
    print(f"2 workers / 1 worker: {ratio:.2f}x (target >= {TARGET_RATIO}x); "
          f"2 workers / chief only: {rows[2][1] / rows[0][1]:.2f}x")
    return 0 if ratio >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
