"""Pipelined placement benchmark: reference models on the WSE-2-like fabric.

Usage: python benchmarks/placement_bench.py [--fabric WSE-2] [--png-dir DIR] [--tables]

Prints model, layers, PEs used, estimated samples/s, bound, efficiency, limiting bound
and placement time for hand-costed MLP, CNN (ResNet-50-like), transformer
(GPT-2-small-like) and BERT-base layer lists (cerebras_tf/wse/reference_models.py).
Exits non-zero if any efficiency is below 0.95.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cerebras_tf.wse.fabric import fabric_by_name  # noqa: E402
from cerebras_tf.wse.placement import place  # noqa: E402
from cerebras_tf.wse.reference_models import REFERENCE_MODELS  # noqa: E402

TARGET_EFFICIENCY = 0.95


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fabric", default="WSE-2")
    parser.add_argument("--png-dir", default=None, help="also write one placement PNG per model here")
    parser.add_argument("--tables", action="store_true", help="also print each model's per-layer table")
    args = parser.parse_args(argv)
    fabric = fabric_by_name(args.fabric)

    header = ("model", "layers", "PEs used", "est. samples/s", "bound samples/s", "efficiency", "limiting bound",
              "placement time")
    rows, reports, ok = [], [], True
    for name, (build, input_bytes) in REFERENCE_MODELS.items():
        layers = build()
        start = time.perf_counter()
        report = place(layers, fabric, input_bytes_per_sample=input_bytes)
        elapsed = time.perf_counter() - start
        ok &= report.placement_efficiency >= TARGET_EFFICIENCY
        reports.append((name, report))
        rows.append((name, str(len(layers)), f"{report.pes_used:,} / {fabric.num_pes:,}",
                     f"{report.estimated_samples_per_sec:,.0f}", f"{report.bound_samples_per_sec:,.0f}",
                     f"{report.placement_efficiency:.4f}", report.limiting_bound, f"{elapsed * 1e3:.0f} ms"))
        if args.png_dir:
            slug = "".join(c if c.isalnum() else "_" for c in name.split(" ")[0].lower())
            report.to_png(os.path.join(args.png_dir, f"placement_{slug}.png"))

    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: " | ".join(  # noqa: E731
        c.ljust(w) if i in (0, 6) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    print(f"Pipelined placement on {fabric.name} ({fabric.width} x {fabric.height} PEs, "
          f"{fabric.total_sram_bytes / 1e9:.1f} GB SRAM, half precision, training)")
    print(line(header))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    if args.tables:
        for name, report in reports:
            print(f"\n== {name}\n{report.render_table()}")
    if not ok:
        print(f"FAIL: an efficiency is below {TARGET_EFFICIENCY}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
