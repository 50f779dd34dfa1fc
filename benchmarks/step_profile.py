"""Where a training step's time goes: ours kernel by kernel, against TensorFlow's own per-op profile.

For each model (benchmarks.bench_models: the MLP, the zoo CNN, the zoo transformer) the same training
step, on the same batches, is timed on both sides, in this one process:
  - ours: cerebras_tf.wse.executor.Executor.step on the compiled program (dynamic loss scaling),
    host kernels as train(use_cs=True) picks them (`--provider auto`, the default: TF's for a model with
    convolutions, numpy/OpenBLAS's otherwise; or `numpy`, `tensorflow`), per numerics in
    --numerics (float16: half-precision
    emulation; float32: set_half_dtype("float32")). Each planned kernel's function is wrapped
    with a timer; its time is summed per kernel kind;
  - TF: the captured Estimator graph in a tf.compat.v1.Session (the Estimator's inner loop
    without hooks), run with RunOptions(trace_level=FULL_TRACE); each node's all_end_rel_micros
    from RunMetadata.step_stats is summed per op type.
Both wall-clock step times are measured on separate, unprofiled steps (after 3 warm-up steps; ours also
after the steps that choose its thread count):
the timers and the tracing cost time of their own.

One row per kernel kind (ours) or op type (TF's), sorted by our time. A TF op type is put on the row
of the kernel kind that does the same work where that is plain: Grappler/oneDNN prefixes and
versions dropped (_MklNativeConv2DBackpropFilter and Conv2DBackpropFilter -> conv2d_backprop_filter,
FusedBatchNormV3 -> fused_batch_norm, ResourceApplyAdam -> apply_adam, MatMul / _MklMatMul -> matmul,
...); the "TF ops" column names what was summed. TF's fused ops count on the row of their first
part: _MklNativeFusedConv2D (conv + bias + relu) on conv2d, _MklNativeFusedMatMul / _FusedMatMul
(matmul + bias [+ relu]) on matmul, _MklNativeFusedBatchNormEx (batch norm + relu) on
fused_batch_norm. Ours likewise: a relu the executor fuses into its bias_add or fused_batch_norm
(cerebras_tf/wse/fusion.py) counts on the producer's row. "—" where a side has no such kernel or op
(ours: to_half, the half-precision rounding; TF's: Identity, NoOp, _Retval, ...).
"n" is the number of kernels / nodes run per step.

Both sides run independent kernels / ops at once (ours: cerebras_tf/wse/dataflow.py, on the host's
cores; TF's inter-op parallelism, with intra-op threads too), so a per-kernel sum exceeds the wall
time. The table shows how far: "any kernel running" is the part of a step some kernel (op) runs in,
"2+ at once" the part two or more run in (both from the kernels' start and end times, per step;
ours runs side by side or one at a time, whichever its first steps measured faster: the "threads" row);
"outside kernels" (our profiled wall time minus the time any kernel runs) is the executor's own work
between kernels.

--nodes N adds, per numerics, our N slowest units (a unit: a kernel, or what the executor runs as one: a
chain, a fused pair, a dense group) beside TF's nodes of the same names (our kernels keep the TF node names
they were lowered from), then TF's N slowest nodes no unit named: where the same convolution or matmul
costs more in our step than in TF's.

    ./dev bench step_profile [--models mlp,cnn,transformer] [--steps 10] [--numerics float16,float32]
                             [--provider auto|tensorflow|numpy] [--nodes N]

`./dev bench` runs it with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (see executor_bench).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import time
from typing import Any

from benchmarks import bench_models

WARMUP = 3
# TF op types (prefixes and V2/V3 suffixes already dropped) whose kernel kind is not their snake_case name.
_TF_ALIASES = {
    "MatMul": "matmul", "BatchMatMul": "batch_matmul", "RealDiv": "div", "DivNoNan": "div_no_nan",
    "ReadVariable": "read_variable", "ResourceGather": "gather_variable", "Gather": "gather",
    "Pack": "stack", "Unpack": "unstack", "Concat": "concat", "Select": "select",
    "SparseSoftmaxCrossEntropyWithLogits": "sparse_softmax_cross_entropy",
    "SoftmaxCrossEntropyWithLogits": "softmax_cross_entropy", "FusedBatchNormEx": "fused_batch_norm",
    "Conv2D": "conv2d", "Conv2DBackpropFilter": "conv2d_backprop_filter",
    "Conv2DBackpropInput": "conv2d_backprop_input",
    "DepthwiseConv2dNative": "depthwise_conv2d",
    "DepthwiseConv2dNativeBackpropFilter": "depthwise_conv2d_backprop_filter",
    "DepthwiseConv2dNativeBackpropInput": "depthwise_conv2d_backprop_input",
    "RandomUniform": "random_uniform", "RandomStandardNormal": "random_normal",
    "MatrixBandPart": "band_part", "L2Loss": "l2_loss",
    "BatchNorm": "fused_batch_norm", "BatchNormEx": "fused_batch_norm", "BatchNormGrad": "fused_batch_norm_grad",
}
_PREFIXES = ("_MklNativeFused", "_MklNative", "_MklFused", "_Mkl", "_Fused", "Resource")


def tf_kind(op_type: str, kinds: set[str]) -> str | None:
    """Our kernel kind for the TF op type, or None (a TF-only row)."""
    name = op_type
    for prefix in _PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            name = name[len(prefix):]
            if prefix != "Resource" and name.startswith("Resource"):
                name = name[len("Resource"):]
            break
    name = re.sub(r"V[0-9]$", "", name)
    name = re.sub(r"(Variable)Op$", r"\1", name)
    kind = _TF_ALIASES.get(name) or re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
    return kind if kind in kinds else None


def _our_profile(prepared: bench_models.Prepared, provider: str, steps: int) -> dict[str, Any]:
    """Wall ms per step, and per kernel kind: ms and kernels run per step."""
    executor = bench_models.our_executor(prepared, provider)
    batches = prepared.batches
    i = 0
    while i < WARMUP or executor.threads is None:  # and until the thread count is chosen (its trials are slower)
        executor.step(*batches[i % len(batches)])
        i += 1
    start = time.perf_counter()
    for i in range(steps):
        executor.step(*batches[i % len(batches)])
    wall = (time.perf_counter() - start) / steps * 1e3
    seconds: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    by_unit: dict[tuple[str, ...], list[float]] = collections.defaultdict(list)  # by the TF names a unit computes
    intervals: list[tuple[float, float]] = []
    for plan in executor._step_layout.plans:  # as step() runs them
        for planned in plan:
            kind = "+".join(k.kind for k in (planned.kernel, planned.beside) if k is not None)  # a dense group
            names = _node_names(planned)

            def timed(inputs, attrs, ctx, fn=planned.fn, kind=kind, unit=names):
                t0 = time.perf_counter()
                try:
                    return fn(inputs, attrs, ctx)
                finally:
                    t1 = time.perf_counter()
                    seconds[kind] += t1 - t0
                    calls[kind] += 1
                    by_unit[unit].append(t1 - t0)
                    intervals.append((t0, t1))
            planned.fn = timed
    start = time.perf_counter()
    for i in range(steps):
        executor.step(*batches[i % len(batches)])
    profiled = (time.perf_counter() - start) / steps * 1e3
    running, together = _overlap(intervals)
    return {"wall": wall, "profiled_wall": profiled, "running": running / steps * 1e3, "threads": executor.threads,
            "together": together / steps * 1e3,
            "ms": {k: v / steps * 1e3 for k, v in seconds.items()}, "n": {k: v / steps for k, v in calls.items()},
            "units": {k: _typical(v, steps) * 1e3 for k, v in by_unit.items()}}


def _typical(times: list[float], steps: int) -> float:
    """Per step: the median time times the runs per step (the odd step a busy host stalls left out)."""
    return statistics.median(times) * len(times) / steps


def _node_names(planned: Any) -> tuple[str, ...]:
    """The TF node names of the kernels one planned unit runs (a chain's, a fused pair's, a dense group's)."""
    return tuple(dict.fromkeys(k.tf_name or k.kind for k in planned.members))


def _overlap(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """(time at least one interval is open, time two or more are), in the intervals' unit."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = together = 0.0
    open_now, last = 0, events[0][0] if events else 0.0
    for moment, change in events:
        if open_now >= 1:
            running += moment - last
        if open_now >= 2:
            together += moment - last
        open_now += change
        last = moment
    return running, together


def _op_type(node_stats: Any) -> str:
    """The op type of a traced node: its timeline label reads "name = OpType(inputs)"."""
    label = node_stats.timeline_label
    if " = " in label:
        return label.split(" = ", 1)[1].split("(", 1)[0].strip()
    return node_stats.node_name.split(":")[0]


def _tf_profile(prepared: bench_models.Prepared, steps: int) -> dict[str, Any]:
    """Wall ms per step, and per op type: summed node time (ms) and nodes run per step."""
    import tensorflow as tf

    with bench_models.tf_session(prepared) as (session, fetches):
        for _ in range(WARMUP):
            session.run(fetches)
        start = time.perf_counter()
        for _ in range(steps):
            session.run(fetches)
        wall = (time.perf_counter() - start) / steps * 1e3
        micros: collections.Counter[str] = collections.Counter()
        nodes: collections.Counter[str] = collections.Counter()
        spans: list[dict[str, list[tuple[float, float]]]] = []  # per step: node name -> its runs' start, end (ms)
        op_of: dict[str, str] = {}  # node name -> op type
        intervals: list[tuple[float, float]] = []
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        start = time.perf_counter()
        for _ in range(steps):
            metadata = tf.compat.v1.RunMetadata()
            session.run(fetches, options=options, run_metadata=metadata)
            spans.append(collections.defaultdict(list))
            for device in metadata.step_stats.dev_stats:
                for node in device.node_stats:
                    op = _op_type(node)
                    micros[op] += node.all_end_rel_micros
                    nodes[op] += 1
                    name = node.node_name.split(":")[0]
                    op_of[name] = op
                    begin, end = node.all_start_micros, node.all_start_micros + node.all_end_rel_micros
                    spans[-1][name].append((begin / 1e3, end / 1e3))
                    intervals.append((begin, end))
        profiled = (time.perf_counter() - start) / steps * 1e3
    running, together = _overlap(intervals)
    return {"wall": wall, "profiled_wall": profiled, "running": running / steps / 1e3,
            "together": together / steps / 1e3,
            "ms": {k: v / steps / 1e3 for k, v in micros.items()}, "n": {k: v / steps for k, v in nodes.items()},
            "spans": spans, "ops": op_of}


def _node_table(ours: dict[str, Any], theirs: dict[str, Any], count: int) -> list[str]:
    """Our `count` slowest units, each beside the TF nodes of the same names (the median per step of the time
    any of them runs: a dense group's two convolution gradients run at once in TF's graph too), then TF's
    slowest nodes that no unit named (a fusion of TF's own, named after its last op: conv + bias + relu as
    .../Relu). Both per step from median times (`_typical`)."""
    runs: dict[str, list[float]] = collections.defaultdict(list)
    for step in theirs["spans"]:
        for name, intervals in step.items():
            runs[name] += [end - start for start, end in intervals]
    tf_ms = {name: _typical(times, len(theirs["spans"])) for name, times in runs.items()}
    lines = [f"{'our unit (its kernels as TF names them)':<72} {'ours ms':>8} {'TF ms':>8}"]
    named: set[str] = set()
    for unit, ms in sorted(ours["units"].items(), key=lambda item: -item[1])[:count]:
        matched = [n for n in unit if n in tf_ms]
        named.update(matched)
        label = _clipped(" + ".join(unit))
        spans = [_overlap([i for n in matched for i in step.get(n, ())])[0] for step in theirs["spans"]]
        theirs_cell = f"{statistics.median(spans):>8.2f}" if matched else f"{'—':>8}"
        lines.append(f"{label:<72} {ms:>8.2f} {theirs_cell}")
    others = sorted((n for n in tf_ms if n not in named), key=lambda n: -tf_ms[n])[:count]
    lines.append(f"{'TF nodes no unit above names (op type)':<72} {'':>8} {'TF ms':>8}")
    for name in others:
        label = _clipped(f"{name} ({theirs['ops'][name]})")
        lines.append(f"{label:<72} {'':>8} {tf_ms[name]:>8.2f}")
    return lines


def _clipped(label: str, width: int = 72) -> str:
    return label if len(label) <= width else label[:width - 3] + "..."


def _table(ours: dict[str, dict[str, Any]], theirs: dict[str, Any]) -> list[str]:
    """The rows: one per kind (ours, with the TF ops mapped to it) or unmapped TF op type."""
    from cerebras_tf.wse.kernels import KERNELS

    numerics = list(ours)
    kinds = set(KERNELS) | {"to_half", "gradient_seed"} | {k for o in ours.values() for k in o["ms"]}
    rows: dict[str, dict[str, Any]] = {}
    for numeric, profile in ours.items():
        for kind, ms in profile["ms"].items():
            row = rows.setdefault(kind, {"tf_ms": None, "tf_n": 0.0, "tf_ops": []})
            row[numeric] = (ms, profile["n"][kind])
    for op, ms in theirs["ms"].items():
        key = tf_kind(op, kinds) or op
        row = rows.setdefault(key, {"tf_ms": None, "tf_n": 0.0, "tf_ops": []})
        row["tf_ms"] = (row["tf_ms"] or 0.0) + ms
        row["tf_n"] += theirs["n"][op]
        row["tf_ops"].append(op)

    def cell(value: float | None, n: float, width: int = 9) -> str:
        return f"{'—':>{width}} {'':>5}" if value is None else f"{value:>{width}.2f} {n:>5.0f}"

    first = numerics[0]
    w = max(30, *(len(key) + 1 for key in rows))  # a dense group's kinds are joined by '+'
    order = sorted(rows, key=lambda k: (-(rows[k][first][0] if first in rows[k] else -1.0),
                                        -(rows[k]["tf_ms"] or 0.0), k))
    lines = [f"{'kind / TF op':<{w}}" + "".join(f" {'ours ' + x + ' ms':>17} {'n':>5}" for x in numerics)
             + f" {'TF ms':>9} {'n':>5}  TF ops"]
    for key in order:
        row = rows[key]
        ours_cells = "".join(" " + cell(row[x][0] if x in row else None, row[x][1] if x in row else 0, 17)
                             for x in numerics)
        tf_ops = ", ".join(op for op in sorted(row["tf_ops"]) if op != key)
        lines.append(f"{key:<{w}}{ours_cells} {cell(row['tf_ms'], row['tf_n'])}  {tf_ops}")
    lines.append(f"{'sum of kernels / ops':<{w}}"
                 + "".join(f" {sum(ours[x]['ms'].values()):>17.2f} {sum(ours[x]['n'].values()):>5.0f}"
                           for x in numerics)
                 + f" {sum(theirs['ms'].values()):>9.2f} {sum(theirs['n'].values()):>5.0f}")
    for label, key in (("any kernel running", "running"), ("2+ at once", "together")):
        lines.append(f"{label:<{w}}" + "".join(f" {ours[x][key]:>17.2f} {'':>5}" for x in numerics)
                     + f" {theirs[key]:>9.2f}")
    lines.append(f"{'outside kernels (profiled)':<{w}}"
                 + "".join(f" {ours[x]['profiled_wall'] - ours[x]['running']:>17.2f} {'':>5}"
                           for x in numerics) + f" {'—':>9}")
    lines.append(f"{'threads (measured choice)':<{w}}" + "".join(f" {str(ours[x]['threads']):>17} {'':>5}"
                                                                for x in numerics) + f" {'—':>9}")
    lines.append(f"{'wall, profiled':<{w}}" + "".join(f" {ours[x]['profiled_wall']:>17.2f} {'':>5}" for x in numerics)
                 + f" {theirs['profiled_wall']:>9.2f}")
    lines.append(f"{'wall, unprofiled':<{w}}" + "".join(f" {ours[x]['wall']:>17.2f} {'':>5}" for x in numerics)
                 + f" {theirs['wall']:>9.2f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(bench_models.MODELS))
    parser.add_argument("--steps", type=int, default=10, help="steps timed per measurement (after 3 warm-up steps)")
    parser.add_argument("--numerics", default="float16", help="ours: comma-separated half dtypes (float16, "
                                                             "bfloat16, float32 for float32 numerics)")
    parser.add_argument("--provider", default="auto", choices=("auto", "tensorflow", "numpy"),
                        help="our host kernels (cerebras_tf.run.host_kernels_tf.host_kernels_for)")
    parser.add_argument("--nodes", type=int, default=0, help="also list this many of our slowest units beside "
                                                             "TF's nodes of the same names (per numerics)")
    args = parser.parse_args()
    bench_models.quiet_tf()
    from cerebras_tf import amp

    print(f"ms per step: {args.steps} steps after {WARMUP} warm-up steps, {os.cpu_count()}-core CPU; ours: host "
          f"kernels {args.provider}; OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', '(unset: chosen by OpenBLAS)')}")
    selected = amp.get_half_dtype()
    for name in args.models.split(","):
        prepared = bench_models.prepare(name)
        theirs = _tf_profile(prepared, args.steps)
        ours = {}
        try:
            for numerics in args.numerics.split(","):
                amp.set_half_dtype(numerics)
                ours[numerics] = _our_profile(prepared, args.provider, args.steps)
        finally:
            amp.set_half_dtype(selected)
        print(f"\n{name}: {bench_models.DESCRIPTIONS[name]}")
        for line in _table(ours, theirs):
            print(line)
        for numerics, profile in ours.items() if args.nodes else ():
            print(f"\n{name}, ours {numerics}: the slowest units and TF's nodes of the same names (ms per step)")
            for line in _node_table(profile, theirs, args.nodes):
                print(line)


if __name__ == "__main__":
    main()
