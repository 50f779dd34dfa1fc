"""Picture of a pipelined placement, like Fig. 14 of the seed docs: one coloured, labelled
rectangle per layer on the wafer grid, with a legend and the pipeline's path.

Uses matplotlib's Agg canvas directly (no pyplot global state, no display needed).
"""
from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from cerebras_tf.wse.placement import PlacementReport

__all__ = ["render_placement_png", "write_placement_png"]

_MAX_LEGEND_ROWS = 32
_MIN_DRAWN_POINTS = 3.0


def _widen(start: float, size: float, minimum: float, limit: float) -> tuple[float, float]:
    """(start, size) grown about its centre to at least `minimum`, kept inside [0, limit]."""
    if size >= minimum:
        return start, size
    begin = min(max(start + size / 2 - minimum / 2, 0.0), limit - minimum)
    return begin, minimum


def _palette(count: int) -> list:
    """Distinct colours, cycling tab20, tab20b and tab20c (neighbours in the pipeline differ)."""
    from matplotlib import colormaps

    colours = []
    for name in ("tab20", "tab20b", "tab20c"):
        cmap = colormaps[name]
        # even entries first, then odd ones: consecutive layers get clearly different hues
        order = list(range(0, 20, 2)) + list(range(1, 20, 2))
        colours += [cmap(i / 19.999) for i in order]
    return [colours[i % len(colours)] for i in range(count)]


def render_placement_png(report: "PlacementReport", *, dpi: int = 110, show_path: bool = True,
                         title: str | None = None) -> bytes:
    """PNG bytes of the placement in `report`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    fabric = report.fabric
    regions = report.regions
    colours = _palette(len(regions))
    legend_cols = max(1, -(-len(regions) // _MAX_LEGEND_ROWS))
    aspect = fabric.height / fabric.width
    wafer_w = 7.5
    fig = Figure(figsize=(wafer_w + 2.4 * legend_cols + 0.6, max(4.5, wafer_w * aspect + 1.25)), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.6 / fig.get_figwidth(), 0.5 / fig.get_figheight(),
                       wafer_w / fig.get_figwidth(), wafer_w * aspect / fig.get_figheight()))
    ax.add_patch(Rectangle((0, 0), fabric.width, fabric.height, facecolor="#eeeeee", edgecolor="#555555", lw=1.0))
    pts_per_pe = wafer_w * 72 / fabric.width
    min_pes = _MIN_DRAWN_POINTS / pts_per_pe  # thin regions are drawn at least this thick to stay visible
    for region, colour in zip(regions, colours):
        x, w = _widen(region.x, region.width, min_pes, fabric.width)
        y, h = _widen(region.y, region.height, min_pes, fabric.height)
        thin = (w, h) != (region.width, region.height)
        ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, edgecolor="#333333" if thin else "white",
                               lw=0.4 if thin else 0.6, zorder=2.5 if thin else 1.5))

    # labels: index always when the rectangle has room, "index name" when it is wide enough
    for region in regions:
        w_pt, h_pt = region.width * pts_per_pe, region.height * pts_per_pe
        size = min(9.0, 0.8 * h_pt, 0.55 * w_pt / max(1, len(str(region.index))))
        if size < 3.5:
            continue
        long_label = f"{region.index} {region.name}"
        text = long_label if len(long_label) * 0.6 * size <= w_pt and h_pt >= 1.5 * size else str(region.index)
        ax.text(region.x + region.width / 2, region.y + region.height / 2, text, ha="center", va="center",
                fontsize=size, color="black", clip_on=True, zorder=4,
                bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.6))

    if show_path and len(regions) > 1:
        xs = [r.x + r.width / 2 for r in regions]
        ys = [r.y + r.height / 2 for r in regions]
        ax.plot(xs, ys, color="black", lw=0.7, alpha=0.55)
        ax.plot(xs[:1], ys[:1], marker="o", color="black", ms=3.5, alpha=0.7)
        ax.plot(xs[-1:], ys[-1:], marker="s", color="black", ms=3.5, alpha=0.7)

    if fabric.width <= 64 and fabric.height <= 64:  # small fabrics: show the PE grid
        ax.set_xticks(range(fabric.width + 1), minor=True)
        ax.set_yticks(range(fabric.height + 1), minor=True)
        ax.grid(which="minor", color="white", lw=0.3, alpha=0.5)
        ax.tick_params(which="minor", length=0)
    ax.set_xlim(0, fabric.width)
    ax.set_ylim(fabric.height, 0)  # row 0 at the top, like the wafer pictures
    ax.set_xlabel(f"PE column (of {fabric.width})", fontsize=8)
    ax.set_ylabel(f"PE row (of {fabric.height})", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.set_aspect("equal")
    mode = "training" if report.training else "inference"
    ax.set_title(title or (
        f"{fabric.name}: {len(regions)} layers pipelined ({mode}), est. "
        f"{report.estimated_samples_per_sec:,.0f} samples/s\n"
        f"limited by {report.limiting_bound}, placement efficiency {report.placement_efficiency:.3f}, "
        f"fill {report.fill_latency_steps} steps"), fontsize=9)

    handles = [Patch(facecolor=c, edgecolor="none", label=f"{r.index} {r.name} ({r.pes:,} PEs)")
               for r, c in zip(regions, colours)]
    fig.legend(handles=handles, loc="upper left", ncol=legend_cols, fontsize=6.5, frameon=False,
               bbox_to_anchor=((wafer_w + 0.8) / fig.get_figwidth(), 0.97), handlelength=1.2,
               columnspacing=0.8, borderaxespad=0.0, title="layers (pipeline order)", title_fontsize=7.5)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def write_placement_png(report: "PlacementReport", path: str | os.PathLike, **kwargs: Any) -> bytes:
    """Render the placement and write it to `path` (parent directories are created); returns the bytes."""
    data = render_placement_png(report, **kwargs)
    parent = os.path.dirname(os.fspath(path))
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)
    return data
