"""Compile-time benchmark: cerebras-tf's WSE compiler against XLA on the same training steps.

For the zoo's MLP, CNN and transformer (small sizes) and a BERT-base-sized
encoder (12 layers, hidden 768, seq 128), measures in one run:
  - ours: CerebrasEstimator.compile(validate_only=True), a full compile into
    a fresh compile_dir, and a second compile that reuses the artifact
    (compile_model time, i.e. after the graph is captured, and the whole call);
  - XLA: the same model_fn's training step (forward, backward, optimizer
    update) as tf.function(jit_compile=True) over tf.compat.v1.wrap_function;
    compile time = first call - a steady-state step (tracing timed apart).

    ./dev bench compile_bench [--models mlp,cnn,transformer,bert_base] [--skip_xla]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from estimator import ModeKeys
from cerebras_tf import CerebrasEstimator, CSRunConfig  # noqa: E402
from examples.zoo import benchmark_models  # noqa: E402


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def measure_ours(module: Any, params: dict[str, Any], workdir: str) -> dict[str, Any]:
    def estimator() -> CerebrasEstimator:
        return CerebrasEstimator(module.model_fn, model_dir=os.path.join(workdir, "model"),
                                 compile_dir=os.path.join(workdir, "compile"),
                                 config=CSRunConfig(cs_ip="localhost:9000", tf_random_seed=1), params=params)

    checked, validate_total = _timed(lambda: estimator().compile(module.input_fn, validate_only=True))
    full, full_total = _timed(lambda: estimator().compile(module.input_fn))
    reused, reuse_total = _timed(lambda: estimator().compile(module.input_fn))
    assert reused.reused and not full.reused
    program = full.program
    return {
        "kernels": len(program.kernels),
        "params": sum(v.size for v in program.variables if v.role == "trainable"),
        "validate": checked.seconds, "validate_total": validate_total,
        "full": full.seconds, "full_total": full_total,
        "reuse_total": reuse_total,
    }


def measure_xla(module: Any, params: dict[str, Any]) -> dict[str, float]:
    """XLA compile time of the same training step, in eager TF2 with tf.function(jit_compile=True)."""
    params = {**module.DEFAULT_PARAMS, **params}
    dataset = module.input_fn(params)
    features, labels = next(iter(dataset))

    def step(f: tf.Tensor, l: tf.Tensor) -> tf.Tensor:
        tf.compat.v1.set_random_seed(1)
        tf.compat.v1.train.get_or_create_global_step()
        spec = module.model_fn(f, l, ModeKeys.TRAIN, params)
        with tf.control_dependencies([spec.train_op]):
            return tf.identity(spec.loss)

    wrapped, build = _timed(lambda: tf.compat.v1.wrap_function(step, list(dataset.element_spec)))
    jit = tf.function(lambda f, l: wrapped(f, l), jit_compile=True)
    _, trace = _timed(lambda: jit.get_concrete_function(features, labels))
    _, first = _timed(lambda: jit(features, labels).numpy())
    steady = min(_timed(lambda: jit(features, labels).numpy())[1] for _ in range(3))
    return {"build": build, "trace": trace, "compile": max(first - steady, 0.0), "step": steady}


def warm_up(skip_xla: bool) -> None:
    """Run both sides once on the MLP before timing, so one-time start-up (TF sessions, matplotlib fonts for
    the placement picture, XLA initialisation) is not charged to the first model in the table."""
    module, params = benchmark_models()["mlp"]
    with tempfile.TemporaryDirectory() as workdir:
        measure_ours(module, params, workdir)
    if not skip_xla:
        measure_xla(module, params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,cnn,transformer,bert_base")
    parser.add_argument("--skip_xla", action="store_true")
    args = parser.parse_args()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    warm_up(args.skip_xla)
    rows = []
    for name in args.models.split(","):
        module, params = benchmark_models()[name]
        with tempfile.TemporaryDirectory() as workdir:
            ours = measure_ours(module, params, workdir)
        xla = None if args.skip_xla else measure_xla(module, params)
        rows.append((name, ours, xla))
        print(f"done: {name}", flush=True)

    header = (f"{'model':<12} {'params':>12} {'kernels':>8} {'validate s':>11} {'full s':>8} {'full+capture s':>15} "
              f"{'reuse+capture s':>16} {'XLA compile s':>14} {'full/XLA':>9}")
    print()
    print(header)
    print("-" * len(header))
    for name, ours, xla in rows:
        xla_compile = f"{xla['compile']:.2f}" if xla else "-"
        ratio = f"{ours['full'] / xla['compile']:.2f}x" if xla and xla["compile"] > 0 else "-"
        print(f"{name:<12} {ours['params']:>12,} {ours['kernels']:>8} {ours['validate']:>11.2f} {ours['full']:>8.2f} "
              f"{ours['full_total']:>15.2f} {ours['reuse_total']:>16.2f} {xla_compile:>14} {ratio:>9}")
    print("\nvalidate/full: compile_model time after capture; +capture: the whole CerebrasEstimator.compile call "
          "(capture, CS rules, dataset checks, placement and its picture). XLA compile: first jit call minus a steady "
          "step, tracing excluded. Both sides ran the MLP once before timing (start-up excluded).")


if __name__ == "__main__":
    main()
