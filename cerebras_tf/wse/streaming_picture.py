"""Picture of a weight-streaming step: one row per layer, its compute time beside its weight-streaming time.

Each pass of a layer takes the slower of the two, so a row whose streaming bar is
the longer one waits for its weights. The title gives the estimate and what limits
it; the key names the two bars. Uses matplotlib's Agg canvas directly (no pyplot
global state, no display needed).
"""
from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

from cerebras_tf.wse.units import fmt_rate

if TYPE_CHECKING:  # pragma: no cover
    from cerebras_tf.wse.streaming import StreamingReport

__all__ = ["render_streaming_png", "write_streaming_png"]

_MAX_ROWS = 80  # more layers than this are drawn as the slowest ones, in model order


def render_streaming_png(report: "StreamingReport", *, dpi: int = 110) -> bytes:
    """PNG bytes of the per-layer timing of `report`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    layers = report.layers
    if len(layers) > _MAX_ROWS:
        slowest = sorted(layers, key=lambda layer: -layer.seconds)[:_MAX_ROWS]
        layers = sorted(slowest, key=lambda layer: layer.index)
    rows = len(layers)
    fig = Figure(figsize=(8.0, 1.6 + 0.18 * rows), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.32, 0.9 / (1.6 + 0.18 * rows), 0.64, 1 - 1.5 / (1.6 + 0.18 * rows)))
    ys = list(range(rows))
    compute = [(t.compute_fwd_seconds + t.compute_bwd_seconds) * 1e3 for t in layers]
    stream = [(t.stream_fwd_seconds + t.stream_bwd_seconds) * 1e3 for t in layers]
    ax.barh([y - 0.2 for y in ys], compute, height=0.4, color="#4878d0", label="compute (whole wafer, the batch)")
    ax.barh([y + 0.2 for y in ys], stream, height=0.4, color="#ee854a", label="weights streaming in (+ gradients out)")
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{t.index} {_short(t.name)}" for t in layers], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (each pass takes the slower of its two bars)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    systems = f"{report.num_systems} systems" if report.num_systems > 1 else "1 system"
    details = [f"{report.batch_per_system:,} samples per system"]
    if report.recompute:
        details.append(f"recomputed from {report.checkpoints} checkpoints")
    if report.micro_batches > 1:
        details.append(f"{report.micro_batches} micro-batches")
    if rows != len(report.layers):
        details.append(f"the {rows} slowest of {len(report.layers)} layers")
    ax.set_title(f"Weight streaming on {systems} x {report.fabric.name}: {fmt_rate(report.estimated_samples_per_sec)} "
                 f"samples/s, limited by {report.limiting_bound}\n{', '.join(details)}", fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


_LABEL_CHARS = 44


def _short(name: str) -> str:
    """A layer name that fits the picture's margin: its end, where the scopes differ."""
    return name if len(name) <= _LABEL_CHARS else "..." + name[-(_LABEL_CHARS - 3):]


def write_streaming_png(report: "StreamingReport", path: str | os.PathLike, **kwargs: Any) -> bytes:
    """Write the picture to `path`; returns its bytes."""
    data = render_streaming_png(report, **kwargs)
    with open(path, "wb") as file:
        file.write(data)
    return data
