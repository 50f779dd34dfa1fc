"""Our Estimator runtime (estimator/runtime/) vs tf.estimator: parity of the trained variables and steps/s.

One model_fn, the MLP of executor_bench (784-500-300-10, batch 256, Adam 1e-3), trained --steps (200) steps
from the same initial weights (numpy, seed 0, through constant initializers: no TF random op involved) on the
same generated data (numpy, seed 1, no shuffling), by three sides, each in its own subprocess with its stack's
Python:
  - tf.estimator    Python 3.11, TF 2.15 + tensorflow-estimator (.venv-3.11);
  - runtime/2.21    our runtime, Python 3.12 (.venv-3.12, else .venv-3.13; or --tf221-python), TF 2.21;
  - runtime/2.15    our runtime on the 3.11 stack (CEREBRAS_TF_ESTIMATOR=runtime).
Each side dumps its final checkpoint's variables (tf.train.load_checkpoint) to .npz; this process compares
them with numpy: max abs difference per variable (kernels, biases, Adam slots and powers) and overall vs
tf.estimator, and whether it is within 1e-5 (issue 12's parity bar).

Speed: steps/s is the median of the `global_step/sec` summaries each side writes every 20 steps (their
min-max under "windows"), the first window (start-up, graph building) left out; the ratio is ours /
tf.estimator. The median, not the mean, so that a burst of other load on the machine moves it less. Issue 12's
bar: the runtime's loop must not be more than 5% slower than tf.estimator's. runtime/2.15 vs tf.estimator
is the fair comparison of loop overhead (same TF, same kernels, only the Estimator loop differs);
runtime/2.21 vs tf.estimator also includes TF 2.15 vs 2.21 differences (kernels, oneDNN, graph runtime).

    ./dev bench runtime_bench [--steps 200] [--rounds 1] [--py311-python PATH] [--tf221-python PATH]

On a busy machine the rates move by tens of percent from run to run; --rounds 3 runs the sides in turn three
times and keeps each side's best median (parity compares the last round's checkpoints).

A side whose venv is missing is skipped with a line saying so.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, SIZES, LOG_EVERY, TOLERANCE = 256, (784, 500, 300, 10), 20, 1e-5


def _train(model_dir: str, steps: int) -> dict:
    """One side: train the MLP with whichever Estimator `estimator` resolves to; dump the final variables."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    from estimator import BACKEND, Estimator, EstimatorSpec, RunConfig

    from benchmarks.summaries import read_scalars

    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    rng = np.random.default_rng(0)
    initial = [(rng.uniform(-1, 1, (n, m)) * np.sqrt(6 / (n + m))).astype(np.float32)
               for n, m in zip(SIZES[:-1], SIZES[1:])]

    def input_fn(params):
        data = np.random.default_rng(1)
        x = data.random((BATCH * 8, SIZES[0]), dtype=np.float32)
        y = data.integers(0, SIZES[-1], BATCH * 8).astype(np.int32)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH, drop_remainder=True)

    def model_fn(features, labels, mode, params):
        hidden = features
        for i, kernel in enumerate(initial):
            hidden = tf.compat.v1.layers.dense(
                hidden, kernel.shape[1], activation=tf.nn.relu if i < len(initial) - 1 else None,
                kernel_initializer=tf.compat.v1.constant_initializer(kernel), name=f"dense{i}")
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, hidden)
        train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(
            loss, global_step=tf.compat.v1.train.get_global_step())
        return EstimatorSpec(mode, loss=loss, train_op=train_op)

    config = RunConfig(tf_random_seed=0, log_step_count_steps=LOG_EVERY, save_summary_steps=LOG_EVERY,
                       save_checkpoints_steps=steps, keep_checkpoint_max=1)
    Estimator(model_fn, model_dir=model_dir, config=config).train(input_fn, max_steps=steps)
    reader = tf.train.load_checkpoint(model_dir)
    np.savez(os.path.join(model_dir, "final.npz"),
             **{name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()})
    moved = float(np.max(np.abs(reader.get_tensor("dense0/kernel") - initial[0])))
    rates = [rate for _, rate in sorted(read_scalars(model_dir, "global_step/sec").items())][1:]
    return {"backend": BACKEND, "tf": tf.__version__, "python": "%d.%d" % sys.version_info[:2], "moved": moved,
            "steps_per_sec": float(np.median(rates)) if rates else None,
            "range": f"{min(rates):.0f}-{max(rates):.0f}" if rates else ""}


def _stacks(py311: str | None, tf221_python: str | None) -> dict[str, tuple[str | None, dict[str, str]]]:
    """side -> (its Python or None when missing, extra environment)."""
    def venv(*names: str) -> str | None:
        found = [p for p in (os.path.join(ROOT, n, "bin", "python") for n in names) if os.path.exists(p)]
        return found[0] if found else None

    py311 = py311 or venv(".venv-3.11")
    return {"tf.estimator": (py311, {}),
            "runtime/2.21": (tf221_python or venv(".venv-3.12", ".venv-3.13"), {}),
            "runtime/2.15": (py311, {"CEREBRAS_TF_ESTIMATOR": "runtime"})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200,
                        help="training steps per side (60 or more for a rate: the first 20-step window is left out)")
    parser.add_argument("--py311-python", help="the TF 2.15 stack's python (default: .venv-3.11)")
    parser.add_argument("--tf221-python", help="the TF 2.21 stack's python (default: .venv-3.12, else .venv-3.13)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every side this many times, in turn, and keep each side's fastest run")
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model_dir:
        print(json.dumps(_train(args.model_dir, args.steps)))
        return
    print(f"MLP {'-'.join(map(str, SIZES))} batch {BATCH} Adam, {args.steps} steps, same initial weights and "
          f"data; steps/s: median global_step/sec of the windows of {LOG_EVERY} steps, first window left out; "
          f"{os.cpu_count()}-core CPU; best of {args.rounds} round(s)")
    results: dict[str, dict] = {}
    variables: dict[str, dict[str, np.ndarray]] = {}
    sides = _stacks(args.py311_python, args.tf221_python)
    for side, (python, _) in sides.items():
        if python is None:
            print(f"{side}: skipped, its venv is missing (./dev setup with PYTHON="
                  f"{'3.11' if side != 'runtime/2.21' else '3.12'}, or --{'tf221' if '2.21' in side else 'py311'}"
                  "-python PATH)")
    with tempfile.TemporaryDirectory(prefix="runtime_bench_") as scratch:
        for round_ in range(args.rounds):  # sides taken in turn, so that load elsewhere hits each alike
            for side, (python, extra) in sides.items():
                if python is None or side in results and results[side].get("failed"):
                    continue
                model_dir = os.path.join(scratch, f"{side.replace('/', '_')}_{round_}")
                env = {**{k: v for k, v in os.environ.items() if k != "CEREBRAS_TF_ESTIMATOR"}, **extra,
                       "PYTHONPATH": ROOT}
                out = subprocess.run([python, "-m", "benchmarks.runtime_bench", "--model-dir", model_dir,
                                      "--steps", str(args.steps)], capture_output=True, text=True, cwd=ROOT, env=env)
                if out.returncode:
                    print(f"{side}: failed ({python}):\n{out.stderr[-2000:]}")
                    results[side] = {"failed": True}
                    continue
                row = json.loads(out.stdout.strip().splitlines()[-1])
                if side not in results or (row["steps_per_sec"] or 0) > (results[side]["steps_per_sec"] or 0):
                    results[side] = row
                with np.load(os.path.join(model_dir, "final.npz")) as npz:
                    variables[side] = {name: npz[name] for name in npz.files}
    results = {side: row for side, row in results.items() if not row.get("failed")}

    print(f"\n{'side':<14} {'Estimator':<14} {'Python/TF':<14} {'steps/s':>9} {'windows':>9} {'ours/tf.est':>12}")
    base = results.get("tf.estimator", {}).get("steps_per_sec")
    for side, row in results.items():
        rate = row["steps_per_sec"]
        ratio = f"{rate / base:.3f}x" if rate and base and side != "tf.estimator" else ""
        rate_text = f"{rate:.1f}" if rate else "n/a"
        stack = row["python"] + "/" + row["tf"]
        print(f"{side:<14} {row['backend']:<14} {stack:<14} {rate_text:>9} {row['range']:>9} {ratio:>12}")
    if "tf.estimator" not in variables:
        print("\nparity: no tf.estimator checkpoint to compare with")
        return
    reference, others = variables["tf.estimator"], [s for s in variables if s != "tf.estimator"]
    print(f"\nparity after {args.steps} steps: max abs difference vs tf.estimator's final checkpoint")
    print(f"{'variable':<24} {'shape':<12}" + "".join(f" {side:>14}" for side in others))
    worst = dict.fromkeys(others, 0.0)
    for name in sorted(reference):
        cells = ""
        for side in others:
            if name not in variables[side]:
                worst[side], cells = float("inf"), cells + f" {'missing':>14}"
                continue
            diff = float(np.max(np.abs(reference[name].astype(np.float64) - variables[side][name]), initial=0.0))
            worst[side], cells = max(worst[side], diff), cells + f" {diff:>14.3e}"
        print(f"{name:<24} {str(list(reference[name].shape)):<12}{cells}")
    for side in others:
        extra = sorted(set(variables[side]) - set(reference))
        verdict = "within" if worst[side] <= TOLERANCE and not extra else "NOT within"
        print(f"{side} overall: {worst[side]:.3e}, {verdict} {TOLERANCE:g}"
              + (f"; extra variables {extra}" if extra else ""))
    print(f"(training moved the weights: max |dense0/kernel - initial| = {results['tf.estimator']['moved']:.3e}, "
          f"global_step {int(reference['global_step'])})")

if __name__ == "__main__":
    main()
