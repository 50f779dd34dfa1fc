"""Pipelined execution model: size each layer's region of PEs, place it on the wafer, predict throughput.

In pipelined (layer-pipelined) mode every layer lives on the wafer at once, in its own
rectangle of PEs; activations flow forward and gradients backward between neighbours.
This module works on a small explicit input, a list of `LayerCost` in pipeline order
(an adapter from the compiler's IR builds that list), and never imports TensorFlow.

Model
-----
* Rate of a layer on ``p`` PEs: ``p * sustained_pe_flops_per_sec / flops_per_sample`` samples/s (the
  fabric's sustained share of its peak: wse/fabric.py).
  Pipeline throughput is the slowest region's rate.
* Memory of a layer: weights + optimizer state + per-sample activations times the
  samples in flight at that layer.  In training, a layer holds the activations of
  every sample between its forward and its backward pass.  Samples stream through
  the regions one at a time, and within a sample row by row (a token's vector, an
  image row: ``LayerCost.stream_rows`` per sample): a region passes a row on as soon
  as it has computed it, so a sample crosses layer ``j`` in ``1 / rows_j`` of a
  pipeline step.  Layer ``i`` of ``L`` (0-based) therefore holds
  ``1 + ceil(2 * sum_{j > i} 1 / rows_j)`` samples: its own, and those that come in
  while one travels to the loss and its gradient travels back.  With one row per
  sample (an MLP) that is ``2 * (L - i) - 1``, the fine-grained pipelined
  backpropagation count (Kosson et al., 2020); the last layer holds 1.  In
  inference every layer holds 1.  A region of ``p`` PEs holds
  ``p * sram_bytes_per_pe`` bytes, so a layer needs at least
  ``ceil(bytes / sram_bytes_per_pe)`` PEs.
* Bounds: *compute* = total PE FLOP rate / total FLOPs per sample (every PE busy);
  *memory* = the best rate when each layer also needs its memory minimum of PEs
  (the ``T`` solving ``sum_i max(m_i, F_i T / r) = N``; equals compute when memory does
  not bind); *fabric_links* = ``max(width, height) x link bandwidth / bytes sent`` over
  the heaviest edge (two disjoint rectangles share at most one straight edge, so no
  placement gives a pair of layers more links; a true upper bound for any placement);
  *host_io* = host bandwidth / input bytes per sample.
  ``bound_samples_per_sec`` is their min.  The estimate is the min of the placed
  regions' rate, the fabric links between consecutive regions (contact length x link
  bandwidth / bytes each sample sends) and host I/O; ``limiting_bound`` names it.
  ``placement_efficiency = estimate / bound``.
* Fill latency (Fig. 15 of the seed docs): a new sample enters every step, so every
  layer is busy from step ``L``; a step lasts ``1 / estimate`` seconds.

Placement algorithm (serpentine shelves)
----------------------------------------
Layers, in order, are cut into *bands*: full-width horizontal shelves stacked top to
bottom.  Inside a band each layer is a full-height column block; even bands run left
to right, odd bands right to left (boustrophedon), so consecutive layers always share
an edge, including at band turns (both touch the same side of the wafer).
For a target rate ``T`` each layer needs ``a_i = max(mem_min_i, ceil(F_i T / r))`` PEs
and each edge ``i -> i+1`` a shared border of ``ceil(T * bytes_sent_i / link_bandwidth)``
links.  A dynamic program over band cut points (all candidate bands evaluated at once
with numpy) finds the least total height when each band gets the least height ``h``
with ``sum ceil(a_i / h) <= width``, at least as tall as its inner edges' link needs and
with its first/last layers as wide as the link needs of the turns.  Bisection on ``T``
finds the highest rate whose bands fit the wafer's height; then the spare rows and
columns go, greedily, to the slowest layers.  When the links limit the result on a
non-square wafer, the same algorithm also runs with rows and columns swapped (bands
become full-height strips, whose inner edges are as long as the wafer's other side)
and the faster layout wins.  Every region's PEs >= its memory minimum by
construction, regions never overlap, stay in the grid and tile it completely.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from cerebras_tf.errors import FabricCapacityError
from cerebras_tf.wse.fabric import Fabric
from cerebras_tf.wse.units import fmt_bytes, fmt_rate

__all__ = ["LayerCost", "Region", "PlacementReport", "place", "in_flight_samples"]

# A band holds at most this many layers: bounds the dynamic program's cost at
# O(layers * MAX_BAND_LAYERS^2) per trial rate without hurting realistic models.
MAX_BAND_LAYERS = 48
_REL_TOL = 1e-5  # bisection stops when the rate bracket is this tight (relative)


@dataclass(frozen=True)
class LayerCost:
    """Cost of one layer (a pipeline stage), all per training sample.

    Attributes:
      name: unique layer name.
      flops_fwd, flops_bwd, flops_update: FLOPs per sample of the forward pass, the
        backward pass (activation + weight gradients) and the optimizer update
        (amortised per sample).
      weight_bytes: bytes of the layer's weights.
      optimizer_state_bytes: bytes of optimizer slots and gradient accumulators.
      activation_bytes: bytes per sample the layer keeps for its backward pass while
        the sample is in flight.
      output_bytes: bytes per sample sent to the next layer (and, in training, the
        same again as gradients coming back); defaults to activation_bytes.
      stream_rows: rows (vectors) a sample's output streams as: the tokens of a
        sequence, the rows of an image; 1 for a flat vector.
    """

    name: str
    flops_fwd: float
    flops_bwd: float = 0.0
    flops_update: float = 0.0
    weight_bytes: float = 0.0
    optimizer_state_bytes: float = 0.0
    activation_bytes: float = 0.0
    output_bytes: float | None = None
    stream_rows: int = 1

    def __post_init__(self) -> None:
        for name in ("flops_fwd", "flops_bwd", "flops_update", "weight_bytes",
                     "optimizer_state_bytes", "activation_bytes"):
            value = float(getattr(self, name))
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"LayerCost {self.name!r}: {name} must be finite and >= 0, got {value!r}")
        if self.output_bytes is not None and not float(self.output_bytes) >= 0:
            raise ValueError(f"LayerCost {self.name!r}: output_bytes must be >= 0, got {self.output_bytes!r}")
        if not (isinstance(self.stream_rows, int) and self.stream_rows >= 1):
            raise ValueError(f"LayerCost {self.name!r}: stream_rows must be an integer >= 1, got {self.stream_rows!r}")

    def flops_per_sample(self, training: bool = True) -> float:
        """FLOPs per sample: forward + backward + update in training, forward only otherwise."""
        if training:
            return float(self.flops_fwd) + float(self.flops_bwd) + float(self.flops_update)
        return float(self.flops_fwd)

    def memory_bytes(self, in_flight: int, training: bool = True) -> float:
        """Bytes the region must hold with `in_flight` samples of activations."""
        state = float(self.optimizer_state_bytes) if training else 0.0
        return float(self.weight_bytes) + state + float(self.activation_bytes) * in_flight

    @property
    def sent_bytes(self) -> float:
        """Bytes per sample sent to the next layer."""
        return float(self.activation_bytes if self.output_bytes is None else self.output_bytes)


@dataclass(frozen=True)
class Region:
    """A layer's placed rectangle of PEs (x = column, y = row of the top-left PE)."""

    index: int
    name: str
    x: int
    y: int
    width: int
    height: int
    flops_per_sample: float
    bytes: float
    in_flight_samples: int
    samples_per_sec_alone: float
    sram_bytes: int

    @property
    def pes(self) -> int:
        """PEs in the region."""
        return self.width * self.height

    @property
    def memory_utilisation(self) -> float:
        """Fraction of the region's SRAM the layer uses."""
        return self.bytes / self.sram_bytes if self.sram_bytes else 0.0

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return {
            "name": self.name,
            "x": self.x,
            "y": self.y,
            "width": self.width,
            "height": self.height,
            "pes": self.pes,
            "flops_per_sample": self.flops_per_sample,
            "bytes": self.bytes,
            "sram_bytes": self.sram_bytes,
            "memory_utilisation": self.memory_utilisation,
            "in_flight_samples": self.in_flight_samples,
            "samples_per_sec_alone": _finite_or_none(self.samples_per_sec_alone),
        }


@dataclass
class PlacementReport:
    """Result of `place`: regions, bounds and the throughput estimate."""

    fabric: Fabric
    precision: str
    training: bool
    regions: list[Region]
    bounds: dict[str, float]
    estimated_samples_per_sec: float
    limiting_bound: str
    slowest_layer: str
    fabric_links_samples_per_sec: float
    fill_latency_steps: int
    fill_latency_seconds: float
    placement_seconds: float
    input_bytes_per_sample: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def bound_samples_per_sec(self) -> float:
        """min(compute, memory, fabric_links, host_io) bound."""
        return min(self.bounds.values())

    @property
    def placement_efficiency(self) -> float:
        """Estimated throughput over the optimal bound (<= 1)."""
        bound = self.bound_samples_per_sec
        return self.estimated_samples_per_sec / bound if bound > 0 else 0.0

    @property
    def pes_used(self) -> int:
        """PEs inside some region."""
        return sum(region.pes for region in self.regions)

    @property
    def adjacent_fraction(self) -> float:
        """Fraction of consecutive layer pairs whose regions share an edge."""
        if len(self.regions) < 2:
            return 1.0
        touching = sum(_contact(a, b) > 0 for a, b in zip(self.regions, self.regions[1:]))
        return touching / (len(self.regions) - 1)

    def to_dict(self) -> dict:
        """JSON-ready report (infinite bounds become None)."""
        return {
            "estimated_samples_per_sec": self.estimated_samples_per_sec,
            "bound_samples_per_sec": _finite_or_none(self.bound_samples_per_sec),
            "placement_efficiency": self.placement_efficiency,
            "limiting_bound": self.limiting_bound,
            "slowest_layer": self.slowest_layer,
            "bounds": {name: _finite_or_none(value) for name, value in self.bounds.items()},
            "fabric_links_samples_per_sec": _finite_or_none(self.fabric_links_samples_per_sec),
            "fill_latency_steps": self.fill_latency_steps,
            "fill_latency_seconds": self.fill_latency_seconds,
            "placement_seconds": self.placement_seconds,
            "precision": self.precision,
            "training": self.training,
            "input_bytes_per_sample": self.input_bytes_per_sample,
            "pes_used": self.pes_used,
            "adjacent_fraction": self.adjacent_fraction,
            "fabric": {"name": self.fabric.name, "width": self.fabric.width, "height": self.fabric.height,
                       "num_pes": self.fabric.num_pes, "sram_bytes_per_pe": self.fabric.sram_bytes_per_pe},
            "layers": [region.to_dict() for region in self.regions],
            "notes": list(self.notes),
        }

    def render_table(self) -> str:
        """Readable text report: summary lines and one row per layer."""
        fab = self.fabric
        lines = [
            f"Pipelined placement on {fab.name} ({fab.width} x {fab.height} = {fab.num_pes:,} PEs, "
            f"{fmt_bytes(fab.sram_bytes_per_pe)}/PE, {self.precision} precision, "
            f"{'training' if self.training else 'inference'})",
            f"  estimated      {fmt_rate(self.estimated_samples_per_sec)} samples/s  "
            f"(limited by {self.limiting_bound}; slowest layer {self.slowest_layer!r})",
            f"  bound          {fmt_rate(self.bound_samples_per_sec)} samples/s  ("
            + ", ".join(f"{name} {fmt_rate(value)}" for name, value in self.bounds.items()) + ")",
            f"  efficiency     {self.placement_efficiency:.3f}   PEs used {self.pes_used:,} / {fab.num_pes:,} "
            f"({self.pes_used / fab.num_pes:.1%})   adjacent pairs {self.adjacent_fraction:.0%}",
            f"  fill latency   {self.fill_latency_steps} steps = {self.fill_latency_seconds * 1e6:.3g} us   "
            f"placement took {self.placement_seconds * 1e3:.1f} ms",
        ]
        lines += [f"  note: {note}" for note in self.notes]
        header = ("#", "layer", "x", "y", "w x h", "PEs", "MFLOP/sample", "memory", "SRAM use", "samples/s alone")
        rows = [
            (str(r.index), r.name, str(r.x), str(r.y), f"{r.width} x {r.height}", f"{r.pes:,}",
             f"{r.flops_per_sample / 1e6:,.2f}", fmt_bytes(r.bytes), f"{r.memory_utilisation:.0%}",
             fmt_rate(r.samples_per_sec_alone))
            for r in self.regions
        ]
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
        left = {1}
        fmt = lambda cells: "  ".join(  # noqa: E731
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        lines += ["", fmt(header), fmt(tuple("-" * w for w in widths))]
        lines += [fmt(row) for row in rows]
        return "\n".join(lines)

    def to_png(self, path: str | None = None, **kwargs: Any) -> bytes:
        """Picture of the placement (see `placement_picture.render_placement_png`)."""
        from cerebras_tf.wse import placement_picture

        if path is None:
            return placement_picture.render_placement_png(self, **kwargs)
        return placement_picture.write_placement_png(self, path, **kwargs)


def _limit_notes(limiting: str, layers: list[LayerCost], regions: list[Region], sent: np.ndarray, link_bw: float,
                 fabric: Fabric, bounds: dict[str, float], flops: np.ndarray, mem_min: np.ndarray, pe_rate: float,
                 input_bytes_per_sample: float) -> list[str]:
    """Why the limiting bound limits: at most one note, and only about `limiting` (the report's headline).

    A note about another bound (say fabric links, when host I/O caps the
    estimate far below them) would contradict the headline.
    """
    if limiting == "memory":
        with np.errstate(divide="ignore"):
            memory_rate = np.where(flops > 0, mem_min * pe_rate / np.where(flops > 0, flops, 1), np.inf)
        pinned = [int(i) for i in np.argsort(-mem_min, kind="stable") if memory_rate[i] > bounds["memory"]]
        if not pinned:
            return []
        shown = ", ".join(repr(layers[i].name) for i in pinned[:3]) + (", ..." if len(pinned) > 3 else "")
        return [f"memory limits the pipeline: {len(pinned)} layer(s) ({shown}) need more PEs for their memory "
                "than for their FLOPs; they run faster than the pipeline and leave fewer PEs for the rest"]
    if limiting == "fabric_links":
        rates = [(max(_contact(a, b), 1) * link_bw / size, i) for i, (a, b, size)
                 in enumerate(zip(regions, regions[1:], sent)) if size > 0]
        if not rates:
            return []
        rate, edge = min(rates)
        longest = max(fabric.width, fabric.height)
        return [f"fabric links limit the pipeline: {layers[edge].name!r} sends {fmt_bytes(sent[edge])} per sample "
                f"to {layers[edge + 1].name!r} over the {max(_contact(regions[edge], regions[edge + 1]), 1)} links "
                f"their regions share: {fmt_rate(rate)} samples/s (a shared edge is at most {longest} links "
                f"long: {fmt_rate(bounds['fabric_links'])} samples/s for any placement)"]
    if limiting == "host_io":
        return [f"host I/O limits the pipeline: each sample brings {fmt_bytes(input_bytes_per_sample)} of input "
                f"from the host, and the system's host links carry {fmt_bytes(fabric.host_io_bytes_per_sec)}/s: "
                f"{fmt_rate(bounds['host_io'])} samples/s, whatever the placement"]
    return []


def in_flight_samples(num_layers: int, training: bool = True, stream_rows: Sequence[int] | None = None
                      ) -> np.ndarray:
    """Samples whose activations each layer holds: in training ``1 + ceil(2 * sum_{j > i} 1 / rows_j)``
    (``2 * (L - i) - 1`` when every sample is one row), 1 otherwise."""
    if not training:
        return np.ones(num_layers, dtype=np.int64)
    rows = np.ones(num_layers) if stream_rows is None else np.asarray(stream_rows, dtype=np.float64)
    crossing = 1.0 / rows  # pipeline steps a sample takes to cross each layer
    downstream = np.concatenate([np.cumsum(crossing[::-1])[::-1][1:], [0.0]])
    return 1 + np.ceil(2 * downstream * (1 - 1e-12)).astype(np.int64)


def place(layers: Sequence[LayerCost] | Iterable[LayerCost], fabric: Fabric, *, precision: str = "half",
          training: bool = True, input_bytes_per_sample: float = 0.0) -> PlacementReport:
    """Size and place every layer's region on `fabric`; see the module docstring for the model.

    Raises:
      FabricCapacityError: the layers' memory does not fit on the wafer (or there are
        more layers than can be given a rectangle each).
      ValueError: no layers, duplicate names, or no FLOPs at all.
    """
    start = time.perf_counter()
    layers = list(layers)
    if not layers:
        raise ValueError("place() needs at least one layer")
    names = [layer.name for layer in layers]
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"layer names must be unique; repeated: {dupes}")
    n = len(layers)
    width, height, total_pes = fabric.width, fabric.height, fabric.num_pes
    pe_rate = fabric.sustained_pe_flops_per_sec(precision)
    sram = fabric.sram_bytes_per_pe

    flops = np.array([layer.flops_per_sample(training) for layer in layers], dtype=np.float64)
    if not flops.sum() > 0:
        raise ValueError("the layers have no FLOPs per sample; nothing to pipeline")
    in_flight = in_flight_samples(n, training, [layer.stream_rows for layer in layers])
    mem_bytes = np.array([layer.memory_bytes(int(k), training) for layer, k in zip(layers, in_flight)])
    mem_min = np.maximum(1, np.ceil(mem_bytes / sram)).astype(np.int64)

    if mem_min.sum() > total_pes:
        raise _capacity_error(layers, mem_bytes, mem_min, fabric, training)

    compute_bound = total_pes * pe_rate / flops.sum()
    memory_bound = _memory_bound(flops, mem_min, total_pes, pe_rate, compute_bound)
    host_bound = (fabric.host_io_bytes_per_sec / input_bytes_per_sample
                  if input_bytes_per_sample > 0 else math.inf)
    sent = np.array([layer.sent_bytes for layer in layers[:-1]], dtype=np.float64)
    link_bw = fabric.link_bytes_per_sec
    link_bound = _link_bound(sent, width, height, link_bw)
    bounds = {"compute": compute_bound, "memory": memory_bound, "fabric_links": link_bound, "host_io": host_bound}

    def layout(cols: int, rows: int) -> list[Region] | None:
        packed = _size_and_pack(flops, mem_min, sent, cols, rows, pe_rate, link_bw, min(memory_bound, link_bound))
        if packed is None:
            return None
        bands, target = packed
        return _regions_from_bands(bands, layers, flops, mem_bytes, in_flight, _links(sent, target, link_bw),
                                   cols, rows, pe_rate, sram)

    first = layout(width, height)
    placed = [] if first is None else [first]
    if width != height and (first is None or _link_rate(first, sent, link_bw) < _region_rate(first)):
        # Link-limited (or no fit): bands across the wafer's other side give longer shared edges.
        turned = layout(height, width)
        placed += [] if turned is None else [[_transposed(region) for region in turned]]
    if not placed:
        raise FabricCapacityError(
            f"Cannot give each of the {n} layers its own rectangle on {fabric.name} "
            f"({width} x {height} PEs) in pipelined execution mode.",
            fix="Use a larger fabric or fuse small layers into larger layer groups.")
    regions = max(placed, key=lambda regions: min(_region_rate(regions), _link_rate(regions, sent, link_bw)))

    rates = np.array([r.samples_per_sec_alone for r in regions])
    slowest = int(np.argmin(rates))
    region_rate = float(rates[slowest])
    link_rate = _link_rate(regions, sent, link_bw)
    estimate = min(region_rate, link_rate, host_bound)
    if estimate == host_bound and host_bound <= region_rate:
        limiting = "host_io"
    elif estimate == link_rate and link_rate < region_rate:
        limiting = "fabric_links"
    else:
        limiting = "memory" if memory_bound < compute_bound * (1 - 1e-9) else "compute"
    notes = _limit_notes(limiting, layers, regions, sent, link_bw, fabric, bounds, flops, mem_min, pe_rate,
                         input_bytes_per_sample)
    fill_steps = n
    return PlacementReport(
        fabric=fabric, precision=precision, training=training, regions=regions, bounds=bounds,
        estimated_samples_per_sec=float(estimate), limiting_bound=limiting, slowest_layer=regions[slowest].name,
        fabric_links_samples_per_sec=float(link_rate), fill_latency_steps=fill_steps,
        fill_latency_seconds=fill_steps / float(estimate), placement_seconds=time.perf_counter() - start,
        input_bytes_per_sample=float(input_bytes_per_sample), notes=notes)


# ----------------------------------------------------------------------------------------------
# sizing


def _memory_bound(flops: np.ndarray, mem_min: np.ndarray, total_pes: int, pe_rate: float,
                  compute_bound: float) -> float:
    """Largest T with sum_i max(mem_min_i, F_i T / r) <= N (continuous relaxation)."""
    def used(rate: float) -> float:
        return float(np.maximum(mem_min, flops * rate / pe_rate).sum())

    if used(compute_bound) <= total_pes * (1 + 1e-12):
        return compute_bound
    lo, hi = 0.0, compute_bound
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if used(mid) <= total_pes:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return lo


def _areas(flops: np.ndarray, mem_min: np.ndarray, rate: float, pe_rate: float) -> np.ndarray:
    """PEs each layer needs to run at `rate` and hold its memory."""
    need = np.ceil(flops * rate / pe_rate * (1 - 1e-12))
    return np.maximum(mem_min, need).astype(np.int64)


def _links(sent: np.ndarray, rate: float, link_rate: float) -> np.ndarray:
    """Shared-edge length (links) edge i -> i+1 needs to carry `rate` samples/s."""
    return np.ceil(sent * rate / link_rate * (1 - 1e-12)).astype(np.int64)


def _link_bound(sent: np.ndarray, width: int, height: int, link_rate: float) -> float:
    """Upper bound of the fabric-link rate for ANY placement of rectangles on a width x height grid.

    Two disjoint rectangles share at most one straight edge, along a column (<= height links)
    or a row (<= width links), so edge i -> i+1 never carries more than
    max(width, height) * link_rate / sent_i samples/s, however the regions are placed.
    """
    with np.errstate(divide="ignore"):
        rates = np.where(sent > 0, max(width, height) * link_rate / np.where(sent > 0, sent, 1), np.inf)
    return float(rates.min()) if rates.size else math.inf


def _link_rate(regions: list[Region], sent: np.ndarray, link_rate: float) -> float:
    """Samples/s the placed regions' shared edges carry (the slowest edge i -> i+1)."""
    rate = math.inf
    for a, b, size in zip(regions, regions[1:], sent):
        if size > 0:
            rate = min(rate, max(_contact(a, b), 1) * link_rate / size)
    return rate


def _region_rate(regions: list[Region]) -> float:
    """Samples/s of the slowest region."""
    return min(region.samples_per_sec_alone for region in regions)


def _ceil_div(num: np.ndarray, den: np.ndarray | int) -> np.ndarray:
    return -(-num // den)


def _band_heights(areas: np.ndarray, links: np.ndarray, width: int, height: int) -> np.ndarray:
    """heights[j, k]: least height of a band holding layers j..j+k; inf where impossible.

    The least h with sum_i ceil(a_i / h) <= width lies in [ceil(A / width), hi], where
    hi = min(ceil(A / (width - count)), max a_i) is always feasible; all (j, k) pairs are
    bisected at once.  Then the band must be as tall as every inner edge's link need, and
    its first and last layers (which meet the previous / next band at a turn) as wide as theirs.
    """
    n = areas.size
    span = min(MAX_BAND_LAYERS, width, n)
    offsets = np.arange(span)
    index = np.arange(n)[:, None] + offsets[None, :]
    valid = index < n
    index = np.minimum(index, n - 1)
    sub = np.where(valid, areas[index], 0)
    count = offsets[None, :] + 1
    total = np.cumsum(sub, axis=1)
    lo = np.maximum(1, _ceil_div(total, width))
    slack = width - count
    hi = np.maximum.accumulate(sub, axis=1)
    hi = np.where(slack > 0, np.minimum(hi, _ceil_div(total, np.maximum(slack, 1))), hi)
    hi = np.maximum(hi, lo)
    mask = np.tril(np.ones((span, span), dtype=np.int64))  # mask[k, i]: layer i is in band (j, k)
    while True:
        rows, ks = np.nonzero((lo < hi) & valid)
        if rows.size == 0:
            break
        mid = (lo[rows, ks] + hi[rows, ks]) // 2
        cols = (_ceil_div(sub[rows], mid[:, None]) * mask[ks]).sum(axis=1)
        fits = cols <= width
        hi[rows[fits], ks[fits]] = mid[fits]
        lo[rows[~fits], ks[~fits]] = mid[~fits] + 1
    edge = np.concatenate([links, [0]])[index] * valid  # edge[j, i]: link need of edge j+i -> j+i+1
    inner = np.maximum.accumulate(np.concatenate([np.zeros((n, 1), np.int64), edge[:, :-1]], axis=1), axis=1)
    h = np.maximum(hi, inner)
    previous = np.concatenate([[0], links])[:n, None]  # need of the edge into layer j (a turn)
    bad = ~valid | (h > height) | (count > width)
    bad |= _ceil_div(sub[:, :1], h) < previous
    bad |= _ceil_div(sub, h) < edge
    result = h.astype(np.float64)
    result[bad] = np.inf
    return result


def _pack(areas: np.ndarray, links: np.ndarray, width: int, height: int) -> list[tuple[int, int, int]] | None:
    """Cut layers into bands of least total height; [(first, last + 1, band height)] or None if too tall."""
    n = areas.size
    heights = _band_heights(areas, links, width, height)
    span = heights.shape[1]
    best = np.full(n + span + 1, np.inf)
    best[n] = 0.0
    choice = np.zeros(n, dtype=np.int64)
    for start in range(n - 1, -1, -1):
        total = heights[start] + best[start + 1:start + 1 + span]
        k = int(np.argmin(total))
        best[start] = total[k]
        choice[start] = k
    if not best[0] <= height:
        return None
    bands, start = [], 0
    while start < n:
        k = int(choice[start])
        bands.append((start, start + k + 1, int(heights[start, k])))
        start += k + 1
    return bands


def _size_and_pack(flops: np.ndarray, mem_min: np.ndarray, sent: np.ndarray, width: int, height: int,
                   pe_rate: float, link_rate: float, upper: float
                   ) -> tuple[list[tuple[int, int, int]], float] | None:
    """Bisect the target rate: (bands, rate) of the highest rate that packs, or None if nothing packs."""
    def attempt(rate: float) -> list[tuple[int, int, int]] | None:
        return _pack(_areas(flops, mem_min, rate, pe_rate), _links(sent, rate, link_rate), width, height)

    best = attempt(0.0)
    if best is None:
        return None
    top = attempt(upper)
    if top is not None:
        return top, upper
    lo, hi = 0.0, upper
    while hi - lo > _REL_TOL * hi:
        mid = 0.5 * (lo + hi)
        bands = attempt(mid)
        if bands is None:
            hi = mid
        else:
            lo, best = mid, bands
    return best, lo


# ----------------------------------------------------------------------------------------------
# geometry


def _columns(flops: np.ndarray, mem_min: np.ndarray, min_width: np.ndarray, band_height: int, width: int,
             pe_rate: float) -> np.ndarray:
    """Column widths (sum == width) maximising the band's slowest rate; each >= its memory and link minimum."""
    floor = np.maximum(np.maximum(1, -(-mem_min // band_height)), min_width)
    spare = width - int(floor.sum())
    assert spare >= 0, "band cannot hold its layers' memory"
    # time per sample with w columns: F / (w * h * r); water-fill then hand out the rest one by one.
    cols_per_rate = flops / (band_height * pe_rate)
    lo, hi = 0.0, (width * band_height * pe_rate / flops.max()) if flops.max() > 0 else 0.0
    widths = floor
    if hi > 0:
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            trial = np.maximum(floor, np.ceil(cols_per_rate * mid * (1 - 1e-12)).astype(np.int64))
            if trial.sum() <= width:
                lo, widths = mid, trial
            else:
                hi = mid
            if hi - lo <= 1e-9 * hi:
                break
    widths = widths.copy()
    left = width - int(widths.sum())
    if left:
        rate = np.where(flops > 0, widths / np.where(flops > 0, flops, 1), np.inf)
        heap = [(float(rate[i]), i) for i in range(flops.size)]
        heapq.heapify(heap)
        for _ in range(left):
            _, i = heapq.heappop(heap)
            widths[i] += 1
            heapq.heappush(heap, (widths[i] / flops[i] if flops[i] > 0 else math.inf, i))
    return widths


def _regions_from_bands(bands: list[tuple[int, int, int]], layers: list[LayerCost], flops: np.ndarray,
                        mem_bytes: np.ndarray, in_flight: np.ndarray, links: np.ndarray, width: int, height: int,
                        pe_rate: float, sram: int) -> list[Region]:
    """Give spare rows to the slowest bands, split each band into columns, lay out the serpentine."""
    mem_min = np.maximum(1, np.ceil(mem_bytes / sram)).astype(np.int64)
    min_width = np.zeros(len(layers), dtype=np.int64)
    for a, b, _ in bands:  # layers meeting the neighbouring band at a turn must be wide enough
        if a > 0:
            min_width[a] = max(min_width[a], links[a - 1])
        if b < len(layers):
            min_width[b - 1] = max(min_width[b - 1], links[b - 1])
    band_h = [h for _, _, h in bands]

    def columns(i: int) -> np.ndarray:
        a, b, _ = bands[i]
        return _columns(flops[a:b], mem_min[a:b], min_width[a:b], band_h[i], width, pe_rate)

    band_cols = [columns(i) for i in range(len(bands))]

    def band_rate(i: int) -> float:
        a, b, _ = bands[i]
        f = flops[a:b]
        with np.errstate(divide="ignore"):
            return float(np.min(np.where(f > 0, band_cols[i] * band_h[i] * pe_rate / np.where(f > 0, f, 1), np.inf)))

    spare_rows = height - sum(band_h)
    if spare_rows:
        heap = [(band_rate(i), i) for i in range(len(bands))]
        heapq.heapify(heap)
        for _ in range(spare_rows):
            _, i = heapq.heappop(heap)
            band_h[i] += 1
            band_cols[i] = columns(i)
            heapq.heappush(heap, (band_rate(i), i))

    regions: list[Region] = []
    y = 0
    for band_index, ((a, b, _), h, cols) in enumerate(zip(bands, band_h, band_cols)):
        x_edges = np.concatenate([[0], np.cumsum(cols)])
        for offset, i in enumerate(range(a, b)):
            w = int(cols[offset])
            x = int(x_edges[offset]) if band_index % 2 == 0 else width - int(x_edges[offset + 1])
            pes = w * h
            rate = pes * pe_rate / flops[i] if flops[i] > 0 else math.inf
            regions.append(Region(index=i, name=layers[i].name, x=x, y=y, width=w, height=h,
                                  flops_per_sample=float(flops[i]), bytes=float(mem_bytes[i]),
                                  in_flight_samples=int(in_flight[i]), samples_per_sec_alone=float(rate),
                                  sram_bytes=pes * sram))
        y += h
    return regions


def _transposed(region: Region) -> Region:
    """The region mirrored across the grid's diagonal (columns <-> rows)."""
    return dataclasses.replace(region, x=region.y, y=region.x, width=region.height, height=region.width)


def _contact(a: Region, b: Region) -> int:
    """Length of the shared edge of two rectangles (0 if they do not touch)."""
    y_overlap = min(a.y + a.height, b.y + b.height) - max(a.y, b.y)
    x_overlap = min(a.x + a.width, b.x + b.width) - max(a.x, b.x)
    if (a.x + a.width == b.x or b.x + b.width == a.x) and y_overlap > 0:
        return y_overlap
    if (a.y + a.height == b.y or b.y + b.height == a.y) and x_overlap > 0:
        return x_overlap
    return 0


# ----------------------------------------------------------------------------------------------
# errors and formatting


def _capacity_error(layers: list[LayerCost], mem_bytes: np.ndarray, mem_min: np.ndarray, fabric: Fabric,
                    training: bool) -> FabricCapacityError:
    """The too-big-model error: bytes needed vs available, the largest layers, the way out."""
    needed = float(mem_bytes.sum())
    weights = sum(float(layer.weight_bytes) for layer in layers)
    state = sum(float(layer.optimizer_state_bytes) for layer in layers) if training else 0.0
    activations = needed - weights - state
    order = np.argsort(-mem_bytes)[:5]
    largest = ", ".join(f"{layers[i].name} {fmt_bytes(mem_bytes[i])}" for i in order)
    return FabricCapacityError(
        f"The model needs {fmt_bytes(needed)} of on-chip memory ({int(mem_min.sum()):,} PEs: weights "
        f"{fmt_bytes(weights)}, optimizer state {fmt_bytes(state)}, in-flight activations "
        f"{fmt_bytes(activations)}) but {fabric.name} has {fmt_bytes(fabric.total_sram_bytes)} of SRAM "
        f"({fabric.num_pes:,} PEs x {fmt_bytes(fabric.sram_bytes_per_pe)}). Largest layers: {largest}.",
        fix="Pipelined execution keeps every layer on the wafer at once and is for models under about "
            "1 billion parameters: shrink the model, the sequence length or image size (in-flight "
            "activations), or choose a larger fabric. Weight streaming execution is the mode for larger "
            "models: cs_config={'execution_strategy': 'weight_streaming'} (R1.8: run.py CSX weight_streaming).",
        bytes_needed=needed,
        bytes_available=fabric.total_sram_bytes,
        largest_layers=[(layers[i].name, float(mem_bytes[i])) for i in order])


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None
