"""Executor host throughput: the simulated WSE (numpy, half-precision emulation) vs TensorFlow on this CPU.

Two levels, each side in its own subprocess:
  - train: what a user sees. plain Estimator.train on CPU vs
    CerebrasEstimator.train(use_cs=True) on the simulated WSE, same model_fn and input_fn;
    steps/s is the mean of the `global_step/sec` summaries both write every 20 steps
    (the first window, with start-up, left out);
  - step: the bare training step. TF: the captured Estimator graph in a tf.compat.v1.Session
    (the Estimator's inner loop without hooks); ours: cerebras_tf.wse.executor.Executor.step
    on the compiled program; steps/s is 1 / the median step time (robust to the odd step a
    busy host stalls). The sides' subprocesses run at the same time, taking turns: each in turn
    runs two untimed steps (its caches and thread pools back) and a block of --block timed steps
    while the others wait, the order rotated every block, so a
    machine whose speed drifts within a run (seen here: the same step 24 ms, then 37 ms a minute
    later) slows every side alike instead of deciding a ratio.
Ours runs float16 numerics with dynamic loss scaling (and, for reference, float32 numerics:
set_half_dtype("float32")), each on every host-kernel provider (cerebras_tf.run.host_kernels_tf):
numpy/OpenBLAS ("/numpy") and TensorFlow's own CPU kernels ("/tensorflow"); train(use_cs=True)
takes the latter for a model with convolutions, the former otherwise (host_kernels_for): at the
step level handed to the Executor, at the train level through CEREBRAS_TF_HOST_KERNELS.
Models (benchmarks.bench_models): the MLP 784-500-300-10 (batch 256, Adam), the zoo CNN (conv + batch
norm + pooling, Momentum) at 32x32x3, filters 32/64/64, batch 64, and the zoo transformer (BERT-style
encoder, its own Adam with weight decay) at bench_models.TRANSFORMER_PARAMS (no target yet). Each side
runs in its own subprocess so peak RSS is its own; both read the same pre-made batches' worth of work per step.

    ./dev bench executor_bench [--steps 100] [--models mlp,cnn,transformer] [--levels train,step]
                                [--rounds 1] [--block 10] [--openblas-coretype NAME]

"threads": the thread count our executor's first steps measured faster (dataflow.ThreadChoice: 1, one kernel
at a time, or side by side), per round ("1/2" when rounds differed); the train level does not report it.

With --rounds N every side is measured N times (the train level: one side after another, in a rotated
order each round, so none is always first after another; the step level: N sets of subprocesses taking
turns); a row reports the median steps/s over the rounds, its ratio to the median of TF's, and the range
of the per-round ratios (each round's side against that round's TF): this machine's run-to-run noise
(10-20%) otherwise decides a ratio near a target.

Our matmuls and convolutions run on numpy's bundled OpenBLAS, whose kernels an
OPENBLAS_CORETYPE in the environment pins (e.g. "Haswell": AVX2 only, even on an AVX-512
CPU); TensorFlow (oneDNN) does not read it. `./dev bench` removes it (with OPENBLAS_L2_SIZE,
which goes with it) so OpenBLAS picks the kernels for this CPU. Run directly (`python -m
benchmarks.executor_bench`), the environment is left as it is unless `--openblas-coretype auto`
removes them; `--openblas-coretype NAME` sets it, for both sides alike. The header prints the setting.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import bench_models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _openblas_env(choice: str) -> dict[str, str]:
    """The measuring subprocesses' environment: OPENBLAS_CORETYPE left (none), removed (auto) or set."""
    env = dict(os.environ)
    if choice == "auto":
        env.pop("OPENBLAS_CORETYPE", None)
        env.pop("OPENBLAS_L2_SIZE", None)
    elif choice != "none":
        env["OPENBLAS_CORETYPE"] = choice
    return env


LOG_EVERY = 20


def _measure(model_name: str, side: str, steps: int, level: str) -> dict:
    from cerebras_tf import amp

    bench_models.quiet_tf()
    numerics, _, provider = side.partition("/")
    if numerics == "ours-float32":
        amp.set_half_dtype("float32")
    if provider:
        os.environ["CEREBRAS_TF_HOST_KERNELS"] = provider  # the train level's choice (host_kernels_tf)
    if level == "train":
        model_fn, input_fn, params = bench_models.model(model_name)
        return _measure_train(model_fn, input_fn, params, side, steps)
    return _serve_steps(model_name, side, provider)


WARMUP = 5  # steps before any is timed (ours: and until its thread count is chosen)
REWARM = 2  # untimed steps at the start of each turn: the caches and thread pools the other sides took


def _serve_steps(model_name: str, side: str, provider: str) -> dict:
    """The step level's subprocess: prepares its side, warms it up, prints {"ready": true}; then, for each
    line N on stdin, runs REWARM + N steps and prints the last N's times ({"times": [...]}, seconds), until
    "end"."""
    prepared = bench_models.prepare(model_name)
    batches = prepared.batches
    with contextlib.ExitStack() as stack:
        if side == "tf":
            session, fetches = stack.enter_context(bench_models.tf_session(prepared))
            executor = None

            def step(i: int) -> None:
                session.run(fetches)
        else:
            executor = bench_models.our_executor(prepared, provider)

            def step(i: int) -> None:
                executor.step(*batches[i % 8])
        done = 0
        while done < WARMUP or (executor is not None and executor.threads is None and done < 100):
            step(done)
            done += 1
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            if line.strip() == "end":
                break
            times = []
            for i in range(REWARM + int(line)):
                start = time.perf_counter()
                step(done)
                if i >= REWARM:
                    times.append(time.perf_counter() - start)
                done += 1
            print(json.dumps({"times": times}), flush=True)
    return {"threads": None if executor is None else executor.threads,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


class _Side:
    """One side's step-level subprocess (_serve_steps), driven a block of steps at a time."""

    def __init__(self, model_name: str, side: str, env: dict[str, str]) -> None:
        self.name = side
        self.times: list[float] = []
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.executor_bench", "--model", model_name, "--side", side,
             "--level", "step"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
            cwd=ROOT, env=env)
        self._reply()  # ready

    def _reply(self) -> dict:
        assert self._process.stdin is not None and self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        self._stderr.seek(0)
        raise RuntimeError(f"executor_bench side {self.name} stopped:\n{self._stderr.read()[-4000:]}")

    def run(self, steps: int) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(f"{steps}\n")
        self._process.stdin.flush()
        self.times += self._reply()["times"]

    def finish(self) -> dict:
        assert self._process.stdin is not None
        self._process.stdin.write("end\n")
        self._process.stdin.flush()
        result = self._reply()
        self._process.wait()
        self._stderr.close()
        return {**result, "steps_per_sec": 1 / statistics.median(self.times)}

    def kill(self) -> None:
        """Stop the subprocess if it still runs (a side that failed, or another's failure)."""
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()


def _measure_steps_taking_turns(model_name: str, sides: tuple[str, ...], steps: int, block: int,
                                env: dict[str, str]) -> dict[str, dict]:
    """Every side's step-level measurement, their subprocesses taking turns a block of steps at a time."""
    running = [_Side(model_name, side, env) for side in sides]
    try:
        for b in range(-(-steps // block)):
            for side in running[b % len(running):] + running[:b % len(running)]:
                side.run(min(block, steps - b * block))
        return {side.name: side.finish() for side in running}
    finally:
        for side in running:
            side.kill()


def _measure_train(model_fn, input_fn, params: dict, side: str, steps: int) -> dict:
    """Estimator.train / CerebrasEstimator.train(use_cs=True) steps/s from their global_step/sec summaries."""
    import numpy as np
    from estimator import Estimator, RunConfig

    from cerebras_tf import CerebrasEstimator, CSRunConfig, set_default_tf_config
    from benchmarks.summaries import read_scalars

    model_dir = tempfile.mkdtemp()
    total = LOG_EVERY * (max(steps // LOG_EVERY, 2) + 1)
    if side == "tf":
        config = RunConfig(log_step_count_steps=LOG_EVERY, save_summary_steps=LOG_EVERY,
                           save_checkpoints_steps=total)
        Estimator(model_fn, model_dir=model_dir, config=config, params=params).train(
            input_fn, max_steps=total)
    else:
        set_default_tf_config()
        config = CSRunConfig(cs_ip="bench:1", log_step_count_steps=LOG_EVERY, save_checkpoints_steps=None)
        CerebrasEstimator(model_fn, model_dir=model_dir, config=config, params=params).train(
            input_fn, max_steps=total)
    rates = read_scalars(model_dir, "global_step/sec")
    return {"steps_per_sec": float(np.mean([rates[step] for step in sorted(rates)[1:]])),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--models", default=",".join(bench_models.MODELS))
    parser.add_argument("--openblas-coretype", default="none",
                        help="none (default: leave the environment), auto (unset: OpenBLAS picks kernels for "
                             "this CPU), or an OpenBLAS core name such as Haswell or SkylakeX")
    parser.add_argument("--levels", default="train,step")
    parser.add_argument("--rounds", type=int, default=1, help="measure every side this many times (median)")
    parser.add_argument("--block", type=int, default=10, help="steps a side runs in its turn (the step level)")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--level", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(_measure(args.model, args.side, args.steps, args.level)))
        return
    env = _openblas_env(args.openblas_coretype)
    print(f"{args.steps} steps after {WARMUP} warm-up steps each (ours: and its thread choice); the step level's "
          f"sides take turns, {args.block} timed steps at a time after {REWARM} untimed; {os.cpu_count()}-core CPU; "
          + "; ".join(bench_models.DESCRIPTIONS[name] for name in args.models.split(",")) + "; "
          f"OPENBLAS_CORETYPE={env.get('OPENBLAS_CORETYPE', '(unset: chosen by OpenBLAS)')}")
    width = max(len("model"), *(len(name) for name in args.models.split(",")))
    ranged = args.rounds > 1
    print(f"{'model':<{width}} {'level':<6} {'side':<24} {'steps/s':>9} {'vs TF':>7}"
          + (f" {'per round':>13}" if ranged else "") + f" {'peak RSS MB':>12} {'threads':>8}")
    sides = ("tf", *(f"ours-{numerics}/{provider}" for numerics in ("float16", "float32")
                     for provider in ("numpy", "tensorflow")))
    for model_name in args.models.split(","):
        for level in args.levels.split(","):
            rows: dict[str, list[dict]] = {side: [] for side in sides}
            for r in range(args.rounds):
                if level == "step":
                    measured = _measure_steps_taking_turns(model_name, sides, args.steps, args.block, env)
                    for side in sides:
                        rows[side].append(measured[side])
                    continue
                for side in sides[r % len(sides):] + sides[:r % len(sides)]:
                    out = subprocess.run([sys.executable, "-m", "benchmarks.executor_bench", "--model", model_name,
                                          "--side", side, "--level", level, "--steps", str(args.steps)],
                                         capture_output=True, text=True, check=True, cwd=ROOT, env=env)
                    rows[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
            tf_rates = [row["steps_per_sec"] for row in rows["tf"]]
            for side, measured in rows.items():
                rates = [row["steps_per_sec"] for row in measured]
                rate = statistics.median(rates)
                ratio = rate / statistics.median(tf_rates)
                line = f"{model_name:<{width}} {level:<6} {side:<24} {rate:>9.1f} {ratio:>6.2f}x"
                if ranged:
                    ratios = [ours / tf for ours, tf in zip(rates, tf_rates)]
                    line += f" {min(ratios):>5.2f}-{max(ratios):.2f}x"
                chosen = "/".join(sorted({str(row["threads"]) for row in measured if row.get("threads") is not None}))
                print(line + f" {max(row['peak_rss_mb'] for row in measured):>12.0f} {chosen or '—':>8}")


if __name__ == "__main__":
    main()
