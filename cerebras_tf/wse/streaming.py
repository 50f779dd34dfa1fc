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
* Wafer memory: the batch's stashed activations of every layer (``B *
  sum(activation_bytes)``) plus two layers' worth of streamed weights (the one
  computing and the next arriving) must fit in the wafer's SRAM. When they do
  not, the compiler recomputes: the wafer keeps only each layer's input for
  the batch (what the layer before sends it) and, during one layer's backward
  pass, that layer's own stash, and every backward pass first runs its layer
  forward again (its compute time grows by the forward's). A batch that does
  not fit even so is refused, naming the most samples per system that fit.
* MemoryX memory: weights plus optimizer state must fit in its capacity.
"""
from __future__ import annotations

import math
import time
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
    max_batch_per_system: int
    recompute: bool
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
            f"(at most {self.max_batch_per_system:,} samples per system fit"
            + (", recomputing each layer's activations in its backward pass)" if self.recompute else ")"),
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
      FabricCapacityError: the batch's activations do not fit on the wafer, or
        the weights and optimizer state do not fit in MemoryX.
      ValueError: no layers, a batch that does not split evenly over the systems.
    """
    start = time.perf_counter()
    layers = list(layers)
    if not layers:
        raise ValueError("stream() needs at least one layer")
    if num_systems < 1 or batch_size < 1 or batch_size % num_systems:
        raise ValueError(f"the batch of {batch_size} samples must split evenly over {num_systems} systems")
    per_system = batch_size // num_systems
    rate = fabric.peak_flops_per_sec(precision)
    bandwidth = float(memoryx.stream_bytes_per_sec)
    weight_in_scale = 0.5 if precision == "half" else 1.0  # float32 weights stream in the half dtype

    weights_on_wafer = 2 * max(float(layer.weight_bytes) * weight_in_scale for layer in layers)
    room = fabric.total_sram_bytes - weights_on_wafer
    full, least = _stash_per_sample(layers, training)
    recompute = per_system * full > room and per_system * least <= room
    per_sample = least if recompute else full
    max_batch = int(room // least) if least > 0 and room > 0 else (0 if room <= 0 else 1 << 62)
    wafer_bytes = per_system * per_sample + weights_on_wafer
    if per_system * least + weights_on_wafer > fabric.total_sram_bytes:
        needed = math.ceil(batch_size / max(max_batch, 1))
        raise FabricCapacityError(
            f"Weight streaming: {per_system:,} samples per system stash {fmt_bytes(per_system * least)} "
            f"of activations on the wafer (plus {fmt_bytes(weights_on_wafer)} of streamed weights), even "
            f"recomputing each layer's activations in its backward pass, but {fabric.name} has "
            f"{fmt_bytes(fabric.total_sram_bytes)} of SRAM: at most {max_batch:,} samples per system fit.",
            fix=(f"Lower the batch size to {max_batch * num_systems:,} or less, or spread it over more systems "
                 f"(num_csx >= {needed})." if max_batch > 0 else
                 "A single layer's streamed weights do not fit on the wafer: split the layer."),
            bytes_needed=per_system * least + weights_on_wafer, bytes_available=fabric.total_sram_bytes,
            largest_layers=sorted(((layer.name, per_system * float(layer.activation_bytes)) for layer in layers),
                                  key=lambda x: -x[1])[:5])

    timings = []
    for index, layer in enumerate(layers):
        weights_in = float(layer.weight_bytes) * weight_in_scale
        gradients_out = float(layer.weight_bytes) if training else 0.0
        backward_flops = float(layer.flops_bwd) + (float(layer.flops_fwd) if recompute else 0.0)
        timings.append(LayerTiming(
            index=index, name=layer.name, parameters=int(float(layer.weight_bytes) // _FLOAT32_BYTES),
            compute_fwd_seconds=per_system * float(layer.flops_fwd) / rate,
            compute_bwd_seconds=per_system * backward_flops / rate if training else 0.0,
            stream_fwd_seconds=weights_in / bandwidth,
            stream_bwd_seconds=(weights_in + gradients_out) / bandwidth if training else 0.0,
            activation_bytes=per_system * float(layer.activation_bytes) if training else 0.0))

    memoryx_bytes = sum(float(layer.weight_bytes) + float(layer.optimizer_state_bytes) for layer in layers)
    if memoryx_bytes > memoryx.capacity_bytes:
        raise FabricCapacityError(
            f"Weight streaming: the weights and optimizer state take {fmt_bytes(memoryx_bytes)}, but MemoryX "
            f"holds {fmt_bytes(memoryx.capacity_bytes)}.",
            fix="Shrink the model: the simulated cluster's MemoryX has the capacity of the smallest published "
                "MemoryX configuration (wse.streaming.MemoryX; a larger one can be passed to stream()).",
            bytes_needed=memoryx_bytes, bytes_available=memoryx.capacity_bytes,
            largest_layers=sorted(((layer.name, float(layer.weight_bytes) + float(layer.optimizer_state_bytes))
                                   for layer in layers), key=lambda x: -x[1])[:5])

    step = sum(timing.seconds for timing in timings)
    compute = sum(t.compute_fwd_seconds + t.compute_bwd_seconds for t in timings)
    streaming_time = sum(t.stream_fwd_seconds + t.stream_bwd_seconds for t in timings)
    limiting = "weight_streaming" if streaming_time > compute else "compute"
    notes = []
    stream_bound = [t.name for t in timings if t.bound == "weight_streaming"]
    if stream_bound:
        shown = ", ".join(repr(name) for name in stream_bound[:3]) + (", ..." if len(stream_bound) > 3 else "")
        notes.append(f"{len(stream_bound)} of {len(timings)} layers ({shown}) wait for their weights: with "
                     f"{per_system:,} samples per system they compute for less time than their weights take to "
                     "stream; a larger batch per system hides it")
    if recompute:
        notes.append(f"the stash of {per_system:,} samples per system does not fit on the wafer: each layer's "
                     "activations are recomputed in its backward pass from its input, which the wafer keeps")
    estimate = batch_size / step if step > 0 else math.inf
    return StreamingReport(
        fabric=fabric, memoryx=memoryx, precision=precision, training=training, batch_size=batch_size,
        num_systems=num_systems, layers=timings, step_seconds=step, estimated_samples_per_sec=estimate,
        limiting_bound=limiting, wafer_bytes=wafer_bytes, memoryx_bytes=memoryx_bytes,
        max_batch_per_system=max_batch, recompute=recompute, placement_seconds=time.perf_counter() - start, notes=notes)


def _stash_per_sample(layers: list[LayerCost], training: bool) -> tuple[float, float]:
    """Bytes per sample the wafer keeps: (everything each layer stashes for its backward pass, the least
    with recomputation: every layer's input, plus the largest single stash while that layer recomputes).
    Inference keeps only the running layer's input and output: both are that."""
    if not training:
        kept = max(float(layer.activation_bytes) + layer.sent_bytes for layer in layers)
        return kept, kept
    full = sum(float(layer.activation_bytes) for layer in layers)
    inputs = float(layers[0].activation_bytes) + sum(layer.sent_bytes for layer in layers[:-1])
    return full, min(full, inputs + max(float(layer.activation_bytes) for layer in layers))
