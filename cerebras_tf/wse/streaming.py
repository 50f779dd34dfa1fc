"""Weight streaming execution model: one layer at a time on the whole wafer, weights streamed from MemoryX.

In weight streaming mode (the Wafer-Scale Cluster, for models above the wafer)
weights and optimizer state live off the wafer, in MemoryX. For each step
every layer in turn gets the whole wafer: its weights stream in, it runs over
the system's whole batch, and the activations its backward pass needs stay on
the wafer; the backward pass streams the weights in again, in reverse order,
and streams the weight gradients out; MemoryX applies the optimizer update
while the next layers compute. With ``num_systems`` CS systems (SwarmX) the
global batch is split between them (data parallel): SwarmX broadcasts the
same weights to each and sums their gradients on the way back.
This module works on the same `LayerCost` list as the pipelined placement and
never imports TensorFlow.

Model
-----
* The wafer's rate is its peak FLOP/s in the run's precision; a layer's forward
  pass takes ``max(B * flops_fwd / rate, streamed-in weight bytes / bandwidth)``
  and its backward pass ``max(B * flops_bwd / rate, (weights in + gradients out)
  / bandwidth)``, with ``B`` the batch per system: streaming overlaps compute,
  and the slower of the two sets the time. Weights stream in the half dtype
  (2 bytes per float32 weight) in half precision, gradients out in float32.
* ``bandwidth`` is one system's link to MemoryX/SwarmX (by default the CS-2's
  12 x 100 GbE, 150 GB/s); SwarmX's broadcast and reduction run at that line
  rate whatever the number of systems, so more systems shorten the compute
  and not the streaming.
* A step is the sum of its layers' times; the update on MemoryX overlaps them.
  The estimate is ``global batch / step time`` samples/s.
* Wafer memory: the activations the backward pass needs stay on the wafer
  (``activation_bytes`` per sample of each layer), plus two layers' worth of
  streamed weights (the one computing and the next arriving). The compiler
  picks, for the system's batch, the fastest of:
  - keeping every layer's stash for the whole batch;
  - recomputation: the wafer keeps the inputs of a few checkpoint layers (the
    model input included) and, during the backward pass of the segment of
    layers between two checkpoints, that segment's whole stash; every segment
    runs its forward pass again first (its backward compute grows by its
    forward's). The checkpoints are the set that needs the least memory (an
    exact dynamic programme over the layer chain, for each of a fine grid
    of bounds on a segment's stash); in a transformer they fall on the narrow hidden-size
    tensors between blocks, never on attention scores;
  - either of the two over micro-batches (gradient accumulation, which R1.8
    drives with ``ws_opt_force_max_grad_accum_batch``): the batch runs as
    ``k`` equal micro-batches that fit, each streaming every layer's weights in
    and its gradients out again, and MemoryX adds the gradients up (a float32
    accumulator per weight) before the one update. The compute is the same;
    the weight traffic is ``k`` times.
  Only a model where one sample does not fit even so is refused.
* MemoryX memory: weights plus optimizer state must fit in its capacity.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from cerebras_tf.errors import FabricCapacityError
from cerebras_tf.wse.fabric import Fabric
from cerebras_tf.wse.placement import LayerCost
from cerebras_tf.wse.units import fmt_bytes, fmt_rate

__all__ = ["MemoryX", "MEMORYX", "LayerTiming", "StreamingReport", "stream"]

_FLOAT32_BYTES = 4


@dataclass(frozen=True)
class MemoryX:
    """The off-wafer store of weights and optimizer state, and the link that streams them.

    Attributes:
      capacity_bytes: weights + optimizer state it holds (the smallest published
        MemoryX configuration holds 4 TB; the largest 2.4 PB).
      stream_bytes_per_sec: one CS system's bandwidth to MemoryX/SwarmX, each way.
    """

    capacity_bytes: float = 4e12
    stream_bytes_per_sec: float = 12 * 100e9 / 8

    def __post_init__(self) -> None:
        for name in ("capacity_bytes", "stream_bytes_per_sec"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"MemoryX.{name} must be > 0, got {getattr(self, name)!r}")


MEMORYX = MemoryX()


@dataclass(frozen=True)
class LayerTiming:
    """One layer's part of a weight-streaming step (seconds per step, per system)."""

    index: int
    name: str
    parameters: int
    compute_fwd_seconds: float
    compute_bwd_seconds: float
    stream_fwd_seconds: float
    stream_bwd_seconds: float
    activation_bytes: float  # stashed on the wafer for the system's whole batch

    @property
    def seconds(self) -> float:
        """The layer's time: each pass takes the slower of its compute and its streaming."""
        return (max(self.compute_fwd_seconds, self.stream_fwd_seconds)
                + max(self.compute_bwd_seconds, self.stream_bwd_seconds))

    @property
    def bound(self) -> str:
        """"compute" or "weight_streaming": which of the two sets most of the layer's time."""
        compute = self.compute_fwd_seconds + self.compute_bwd_seconds
        streaming = self.stream_fwd_seconds + self.stream_bwd_seconds
        return "weight_streaming" if streaming > compute else "compute"

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return {"name": self.name, "parameters": self.parameters, "seconds": self.seconds, "bound": self.bound,
                "compute_fwd_seconds": self.compute_fwd_seconds, "compute_bwd_seconds": self.compute_bwd_seconds,
                "stream_fwd_seconds": self.stream_fwd_seconds, "stream_bwd_seconds": self.stream_bwd_seconds,
                "activation_bytes": self.activation_bytes}


@dataclass
class StreamingReport:
    """Result of `stream`: per-layer timing, memory use on the wafer and in MemoryX, the estimate."""

    fabric: Fabric
    memoryx: MemoryX
    precision: str
    training: bool
    batch_size: int
    num_systems: int
    layers: list[LayerTiming]
    step_seconds: float
    estimated_samples_per_sec: float
    limiting_bound: str
    wafer_bytes: float
    memoryx_bytes: float
    max_batch_per_system: int  # the most samples per system one pass (micro-batch) fits
    recompute: bool
    micro_batches: int
    checkpoints: int  # layers whose input the wafer keeps (recompute)
    placement_seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def batch_per_system(self) -> int:
        """Samples each system runs per step."""
        return self.batch_size // self.num_systems

    @property
    def slowest_layer(self) -> str:
        """The layer that takes the most time per step."""
        return max(self.layers, key=lambda layer: layer.seconds).name

    def to_dict(self) -> dict:
        """JSON-ready report."""
        return {
            "execution_strategy": "weight_streaming",
            "estimated_samples_per_sec": self.estimated_samples_per_sec,
            "limiting_bound": self.limiting_bound,
            "slowest_layer": self.slowest_layer,
            "step_seconds": self.step_seconds,
            "batch_size": self.batch_size,
            "num_systems": self.num_systems,
            "batch_per_system": self.batch_per_system,
            "max_batch_per_system": self.max_batch_per_system,
            "recompute": self.recompute,
            "checkpoints": self.checkpoints,
            "micro_batches": self.micro_batches,
            "wafer_bytes": self.wafer_bytes,
            "memoryx_bytes": self.memoryx_bytes,
            "precision": self.precision,
            "training": self.training,
            "placement_seconds": self.placement_seconds,
            "fabric": {"name": self.fabric.name, "num_pes": self.fabric.num_pes,
                       "total_sram_bytes": self.fabric.total_sram_bytes},
            "memoryx": {"capacity_bytes": self.memoryx.capacity_bytes,
                        "stream_bytes_per_sec": self.memoryx.stream_bytes_per_sec},
            "layers": [layer.to_dict() for layer in self.layers],
            "notes": list(self.notes),
        }

    def to_png(self, path: str | None = None, **kwargs: Any) -> bytes:
        """Picture of the per-layer timing (see `streaming_picture.render_streaming_png`)."""
        from cerebras_tf.wse import streaming_picture

        if path is None:
            return streaming_picture.render_streaming_png(self, **kwargs)
        return streaming_picture.write_streaming_png(self, path, **kwargs)

    def render_table(self) -> str:
        """Readable text report: summary lines and one row per layer."""
        fab, mx = self.fabric, self.memoryx
        systems = f"{self.num_systems} systems" if self.num_systems > 1 else "1 system"
        lines = [
            f"Weight streaming on {systems} x {fab.name} ({fmt_bytes(fab.total_sram_bytes)} SRAM each), "
            f"MemoryX {fmt_bytes(mx.capacity_bytes)}, {fmt_bytes(mx.stream_bytes_per_sec)}/s per system, "
            f"{self.precision} precision, {'training' if self.training else 'inference'}",
            f"  estimated      {fmt_rate(self.estimated_samples_per_sec)} samples/s  (limited by "
            f"{self.limiting_bound}; slowest layer {self.slowest_layer!r}; step {self.step_seconds * 1e3:.4g} ms "
            f"for {self.batch_size} samples, {self.batch_per_system} per system)",
            f"  wafer memory   {fmt_bytes(self.wafer_bytes)} of {fmt_bytes(fab.total_sram_bytes)} "
            f"(at most {self.max_batch_per_system:,} samples per system fit in one pass"
            + (f", recomputing from {self.checkpoints} checkpoint layers" if self.recompute else "")
            + (f"; {self.micro_batches} micro-batches" if self.micro_batches > 1 else "") + ")",
            f"  MemoryX        {fmt_bytes(self.memoryx_bytes)} of {fmt_bytes(mx.capacity_bytes)} "
            f"(weights and optimizer state)",
        ]
        lines += [f"  note: {note}" for note in self.notes]
        header = ("#", "layer", "params", "fwd ms", "bwd ms", "compute ms", "stream ms", "bound")
        rows = [(str(t.index), t.name, f"{t.parameters:,}",
                 f"{max(t.compute_fwd_seconds, t.stream_fwd_seconds) * 1e3:.4g}",
                 f"{max(t.compute_bwd_seconds, t.stream_bwd_seconds) * 1e3:.4g}",
                 f"{(t.compute_fwd_seconds + t.compute_bwd_seconds) * 1e3:.4g}",
                 f"{(t.stream_fwd_seconds + t.stream_bwd_seconds) * 1e3:.4g}", t.bound) for t in self.layers]
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
        fmt = lambda cells: "  ".join(  # noqa: E731
            c.ljust(w) if i in (1, 7) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        lines += ["", fmt(header), fmt(tuple("-" * w for w in widths))]
        lines += [fmt(row) for row in rows]
        return "\n".join(lines)


def stream(layers: Sequence[LayerCost] | Iterable[LayerCost], fabric: Fabric, *, batch_size: int,
           num_systems: int = 1, precision: str = "half", training: bool = True,
           memoryx: MemoryX = MEMORYX) -> StreamingReport:
    """Time one weight-streaming step of `layers` over `batch_size` samples; see the module docstring.

    Raises:
      FabricCapacityError: one sample's activations do not fit on the wafer even
        with recomputation, or the weights and optimizer state do not fit in MemoryX.
      ValueError: no layers, a batch that does not split evenly over the systems.
    """
    start = time.perf_counter()
    layers = list(layers)
    if not layers:
        raise ValueError("stream() needs at least one layer")
    if num_systems < 1 or batch_size < 1 or batch_size % num_systems:
        raise ValueError(f"the batch of {batch_size} samples must split evenly over {num_systems} systems")
    per_system = batch_size // num_systems
    rate = fabric.sustained_flops_per_sec(precision)
    bandwidth = float(memoryx.stream_bytes_per_sec)
    weight_in_scale = 0.5 if precision == "half" else 1.0  # float32 weights stream in the half dtype

    weights_on_wafer = 2 * max(float(layer.weight_bytes) * weight_in_scale for layer in layers)
    room = fabric.total_sram_bytes - weights_on_wafer
    plans = _stash_plans(layers, training)
    if room <= 0 or plans[-1].per_sample_bytes > room:
        least = plans[-1]
        raise FabricCapacityError(
            f"Weight streaming: one sample stashes {fmt_bytes(least.per_sample_bytes)} of activations on the "
            f"wafer even recomputing its layers' activations from {least.checkpoints} checkpoints (plus "
            f"{fmt_bytes(weights_on_wafer)} of streamed weights), but {fabric.name} has "
            f"{fmt_bytes(fabric.total_sram_bytes)} of SRAM.",
            fix=("A single layer's streamed weights do not fit on the wafer: split the layer." if room <= 0 else
                 "Shrink what one sample carries through the model: a shorter sequence (max_sequence_length), a "
                 "smaller hidden size or fewer attention heads."),
            bytes_needed=least.per_sample_bytes + weights_on_wafer, bytes_available=fabric.total_sram_bytes,
            largest_layers=sorted(((layer.name, float(layer.activation_bytes)) for layer in layers),
                                  key=lambda x: -x[1])[:5])

    best: tuple[float, _StashPlan, int, list[LayerTiming]] | None = None
    for plan in plans:
        if plan.per_sample_bytes > room:
            continue
        largest = int(room // plan.per_sample_bytes) if plan.per_sample_bytes > 0 else per_system
        micro_batches = math.ceil(per_system / max(1, min(largest, per_system)))
        timings = _timings(layers, per_system, micro_batches, plan.recompute, training, rate, bandwidth,
                           weight_in_scale)
        step = sum(timing.seconds for timing in timings)
        if best is None or step < best[0] * (1 - 1e-9):
            best = (step, plan, micro_batches, timings)
    assert best is not None  # the least plan fits (checked above)
    step, plan, micro_batches, timings = best
    micro_batch = math.ceil(per_system / micro_batches)
    max_batch = int(room // plan.per_sample_bytes) if plan.per_sample_bytes > 0 else 1 << 62
    wafer_bytes = micro_batch * plan.per_sample_bytes + weights_on_wafer

    accumulators = micro_batches > 1 and training  # MemoryX sums the micro-batches' gradients
    memoryx_bytes = sum(float(layer.weight_bytes) * (2 if accumulators else 1) + float(layer.optimizer_state_bytes)
                        for layer in layers)
    if memoryx_bytes > memoryx.capacity_bytes:
        raise FabricCapacityError(
            f"Weight streaming: the weights and optimizer state take {fmt_bytes(memoryx_bytes)}, but MemoryX "
            f"holds {fmt_bytes(memoryx.capacity_bytes)}.",
            fix="Shrink the model: the simulated cluster's MemoryX has the capacity of the smallest published "
                "MemoryX configuration (wse.streaming.MemoryX; a larger one can be passed to stream()).",
            bytes_needed=memoryx_bytes, bytes_available=memoryx.capacity_bytes,
            largest_layers=sorted(((layer.name, float(layer.weight_bytes) + float(layer.optimizer_state_bytes))
                                   for layer in layers), key=lambda x: -x[1])[:5])

    compute = sum(t.compute_fwd_seconds + t.compute_bwd_seconds for t in timings)
    streaming_time = sum(t.stream_fwd_seconds + t.stream_bwd_seconds for t in timings)
    limiting = "weight_streaming" if streaming_time > compute else "compute"
    notes = []
    stream_bound = [t.name for t in timings if t.bound == "weight_streaming"]
    if stream_bound:
        shown = ", ".join(repr(name) for name in stream_bound[:3]) + (", ..." if len(stream_bound) > 3 else "")
        per_pass = f"{micro_batch:,} samples per pass" if micro_batches > 1 else f"{per_system:,} samples per system"
        notes.append(f"{len(stream_bound)} of {len(timings)} layers ({shown}) wait for their weights: with "
                     f"{per_pass} they compute for less time than their weights take to stream; a larger batch "
                     "per " + ("pass (more systems, or a smaller stash per sample)" if micro_batches > 1
                               else "system") + " hides it")
    if plan.recompute:
        notes.append(f"the stash of {micro_batch:,} samples does not fit on the wafer: the wafer keeps the inputs "
                     f"of {plan.checkpoints} checkpoint layers and recomputes each segment's activations in its "
                     "backward pass")
    if micro_batches > 1:
        notes.append(f"the {per_system:,} samples per system run as {micro_batches} micro-batches of at most "
                     f"{micro_batch:,} (gradient accumulation in MemoryX): every micro-batch streams the weights "
                     "again")
    estimate = batch_size / step if step > 0 else math.inf
    return StreamingReport(
        fabric=fabric, memoryx=memoryx, precision=precision, training=training, batch_size=batch_size,
        num_systems=num_systems, layers=timings, step_seconds=step, estimated_samples_per_sec=estimate,
        limiting_bound=limiting, wafer_bytes=wafer_bytes, memoryx_bytes=memoryx_bytes,
        max_batch_per_system=max_batch, recompute=plan.recompute, micro_batches=micro_batches,
        checkpoints=plan.checkpoints, placement_seconds=time.perf_counter() - start, notes=notes)


def _timings(layers: list[LayerCost], per_system: int, micro_batches: int, recompute: bool, training: bool,
             rate: float, bandwidth: float, weight_in_scale: float) -> list[LayerTiming]:
    """Each layer's compute and streaming time per step (the whole system batch; weights stream once per
    micro-batch)."""
    timings = []
    for index, layer in enumerate(layers):
        weights_in = micro_batches * float(layer.weight_bytes) * weight_in_scale
        gradients_out = micro_batches * float(layer.weight_bytes) if training else 0.0
        backward_flops = float(layer.flops_bwd) + (float(layer.flops_fwd) if recompute else 0.0)
        timings.append(LayerTiming(
            index=index, name=layer.name, parameters=int(float(layer.weight_bytes) // _FLOAT32_BYTES),
            compute_fwd_seconds=per_system * float(layer.flops_fwd) / rate,
            compute_bwd_seconds=per_system * backward_flops / rate if training else 0.0,
            stream_fwd_seconds=weights_in / bandwidth,
            stream_bwd_seconds=(weights_in + gradients_out) / bandwidth if training else 0.0,
            activation_bytes=per_system * float(layer.activation_bytes) if training else 0.0))
    return timings


@dataclass(frozen=True)
class _StashPlan:
    """What the wafer keeps per sample for the backward pass."""

    per_sample_bytes: float
    recompute: bool
    checkpoints: int = 0  # layers whose input is kept (with recompute)


def _stash_plans(layers: list[LayerCost], training: bool) -> list[_StashPlan]:
    """The stash plans to choose from, the one with the least memory last: every layer's stash, and (when
    it needs less) recomputation from the checkpoints that need the least memory. Inference keeps only the
    running layer's input and output."""
    if not training:
        return [_StashPlan(max(float(layer.activation_bytes) + layer.sent_bytes for layer in layers), False)]
    full = _StashPlan(sum(float(layer.activation_bytes) for layer in layers), False)
    checkpointed = _least_checkpointed(layers)
    return [full, checkpointed] if checkpointed.per_sample_bytes < full.per_sample_bytes else [full]


_SEGMENT_BOUNDS = 64  # bounds on a segment's stash tried, geometric from the largest layer's to the whole model's


def _least_checkpointed(layers: list[LayerCost]) -> _StashPlan:
    """Recomputation with the least memory per sample: checkpoint layers whose inputs the wafer keeps (the
    first layer's always: the model input, taken as its stash), plus the stash of the largest segment
    between two checkpoints, which its backward pass recomputes. For each bound M on a segment's stash an
    exact dynamic programme over the chain picks the checkpoints whose inputs add up least (a sliding-window
    minimum, linear in the layers); the best M over a geometric grid wins."""
    stash = [float(layer.activation_bytes) for layer in layers]
    kept = [stash[0]] + [layer.sent_bytes for layer in layers[:-1]]  # kept[i]: layer i's input
    prefix = [0.0]
    for value in stash:
        prefix.append(prefix[-1] + value)
    n, low, high = len(layers), max(stash), prefix[-1]
    if high <= 0:
        return _StashPlan(kept[0], True, 1)
    low = max(low, high * 1e-9)
    bounds = sorted({low * (high / low) ** (i / (_SEGMENT_BOUNDS - 1)) for i in range(_SEGMENT_BOUNDS)} | {high})
    best = _StashPlan(math.inf, True)
    for bound in bounds:
        cost, count = _checkpoint_cost(prefix, kept, bound * (1 + 1e-12), n)
        if cost + bound < best.per_sample_bytes:
            best = _StashPlan(cost + bound, True, count)
    return best


def _checkpoint_cost(prefix: list[float], kept: list[float], bound: float, n: int) -> tuple[float, int]:
    """Least sum of kept inputs over checkpoints 0 = c0 < c1 < ... (< n) such that no segment's stash exceeds
    `bound` (every single layer's must not), and the number of checkpoints."""
    cost = [0.0] * n
    count = [0] * n
    cost[0], count[0] = kept[0], 1
    window: deque[int] = deque()
    for j in range(1, n + 1):
        i = j - 1
        while window and cost[window[-1]] >= cost[i]:
            window.pop()
        window.append(i)
        while prefix[j] - prefix[window[0]] > bound:
            window.popleft()
        first = window[0]
        if j == n:
            return cost[first], count[first]
        cost[j], count[j] = kept[j] + cost[first], count[first] + 1
    raise AssertionError("unreachable")
