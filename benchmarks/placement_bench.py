"""Pipelined placement benchmark: reference models and the compiled zoo models on the WSE-2-like fabric.

Usage: ./dev bench placement_bench [--fabric WSE-2] [--png-dir DIR] [--tables] [--skip-zoo]

Table 1: hand-costed MLP, CNN (ResNet-50-like), transformer (GPT-2-small-like) and
BERT-base layer lists (benchmarks/reference_models.py).
Table 2: the zoo's MLP, CNN, transformer and BERT-base-sized encoder compiled to the
WSE IR by CerebrasEstimator.compile (examples/zoo), placed from the IR's layer costs;
with the placement time beside the compile time (lowering, casts, placement, artifact).
Each row: model, layers, PEs used, estimated samples/s, bound, efficiency, limiting
bound, placement time. Exits non-zero if any efficiency is below 0.95.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.reference_models import REFERENCE_MODELS  # noqa: E402
from cerebras_tf.wse.fabric import Fabric, fabric_by_name  # noqa: E402
from cerebras_tf.wse.placement import PlacementReport, place  # noqa: E402

TARGET_EFFICIENCY = 0.95
HEADER = ("model", "layers", "PEs used", "est. samples/s", "bound samples/s", "efficiency", "limiting bound",
          "placement time")
LEFT = {0, 6}  # left-aligned columns


def _row(name: str, report: PlacementReport, placement_seconds: float) -> tuple[str, ...]:
    fabric = report.fabric
    return (name, str(len(report.regions)), f"{report.pes_used:,} / {fabric.num_pes:,}",
            f"{report.estimated_samples_per_sec:,.0f}", f"{report.bound_samples_per_sec:,.0f}",
            f"{report.placement_efficiency:.4f}", report.limiting_bound, f"{placement_seconds * 1e3:.0f} ms")


def _print_table(header: Sequence[str], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) if i in LEFT else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    print(line(header))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(line(row))


def reference_reports(fabric: Fabric) -> list[tuple[str, PlacementReport, float]]:
    """(name, report, placement seconds) of each hand-costed reference model."""
    out = []
    for name, (build, input_bytes) in REFERENCE_MODELS.items():
        layers = build()
        start = time.perf_counter()
        report = place(layers, fabric, input_bytes_per_sample=input_bytes)
        out.append((name, report, time.perf_counter() - start))
    return out


def zoo_reports(fabric: Fabric) -> list[tuple[str, PlacementReport, float]]:
    """(name, report, compile seconds) of each zoo model compiled for `fabric` by CerebrasEstimator.compile."""
    import tensorflow as tf

    from cerebras_tf import CerebrasEstimator, CSRunConfig
    from examples.zoo import benchmark_models

    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)

    def compile_(module, params):
        with tempfile.TemporaryDirectory() as workdir:
            estimator = CerebrasEstimator(
                module.model_fn, model_dir=os.path.join(workdir, "model"), compile_dir=os.path.join(workdir, "c"),
                config=CSRunConfig(cs_ip="localhost:9000", tf_random_seed=1, cs_config={"fabric": fabric}),
                params=params)
            return estimator.compile(module.input_fn)

    models = benchmark_models()
    compile_(*models["mlp"])  # warm-up: one-time TF / matplotlib start-up is not charged to the first model
    out = []
    for name, (module, params) in models.items():
        result = compile_(module, params)
        out.append((name, result.placement, result.seconds))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fabric", default="WSE-2")
    parser.add_argument("--png-dir", default=None, help="also write one placement PNG per model here")
    parser.add_argument("--tables", action="store_true", help="also print each model's per-layer table")
    parser.add_argument("--skip-zoo", action="store_true", help="only the hand-costed reference models")
    args = parser.parse_args(argv)
    fabric = fabric_by_name(args.fabric)

    print(f"Pipelined placement on {fabric.name} ({fabric.width} x {fabric.height} PEs, "
          f"{fabric.total_sram_bytes / 1e9:.1f} GB SRAM, training)")
    print("\nHand-costed reference models (half precision):")
    reference = reference_reports(fabric)
    _print_table(HEADER, [_row(name, report, seconds) for name, report, seconds in reference])
    reports = [(name, report) for name, report, _ in reference]
    if not args.skip_zoo:
        print("\nZoo models compiled to the WSE IR (CerebrasEstimator.compile; precision from the program):")
        zoo = zoo_reports(fabric)
        _print_table(HEADER + ("compile time",),
                     [_row(name, report, report.placement_seconds) + (f"{seconds * 1e3:,.0f} ms",)
                      for name, report, seconds in zoo])
        print("compile time: compile_model after graph capture (lowering, casts, placement, artifact and picture).")
        reports += [(f"zoo {name}", report) for name, report, _ in zoo]

    if args.png_dir:
        for name, report in reports:
            slug = "".join(c if c.isalnum() else "_" for c in name.split(" (")[0].lower())
            report.to_png(os.path.join(args.png_dir, f"placement_{slug}.png"))
    if args.tables:
        for name, report in reports:
            print(f"\n== {name}\n{report.render_table()}")
    low = [name for name, report in reports if report.placement_efficiency < TARGET_EFFICIENCY]
    if low:
        print(f"FAIL: efficiency below {TARGET_EFFICIENCY}: {', '.join(low)}", file=sys.stderr)
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
