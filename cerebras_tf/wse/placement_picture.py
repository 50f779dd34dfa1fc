"""Picture of a pipelined placement, like Fig. 14 of the seed docs: one coloured, labelled
rectangle per layer on the wafer grid, and the pipeline's path through them.

Every mark drawn is explained under the wafer: the layers (index, name, size), the
path and its ends, regions too thin to see (drawn wider), unused PEs and the PE grid
when they appear, and the four throughput bounds with the one that limits. That key
sits in a strip below the wafer, as wide as the wafer and as tall as its entries
need, so no part of the image is left blank whatever the number of layers.

Uses matplotlib's Agg canvas directly (no pyplot global state, no display needed).
"""
from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from cerebras_tf.wse.placement import PlacementReport, Region

__all__ = ["legend_labels", "render_placement_png", "write_placement_png"]

_MIN_DRAWN_POINTS = 3.0
_WAFER_INCHES = 7.5
_LEFT, _RIGHT = 0.65, 0.25  # margins (inches) beside the wafer: the y-axis label, and air
_KEY_FONT = 7.0
_LINE_INCHES = _KEY_FONT * 1.55 / 72  # one legend row
_CHAR_INCHES = _KEY_FONT * 0.5 / 72  # one character of the key's font, on average
_HANDLE_INCHES = 0.35  # a legend handle and the gap after it
_SMALL_FABRIC = 64  # fabrics up to this many PEs a side show their PE grid
_BOUND_NAMES = {"compute": "compute", "memory": "memory", "fabric_links": "fabric links", "host_io": "host I/O"}
_PATH_STYLE: dict[str, Any] = dict(color="black", lw=0.7, alpha=0.55)
_ENDS = (("o", "first layer (input)"), ("s", "last layer (output)"))


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


def _layer_label(region: "Region") -> str:
    return f"{region.index} {region.name} ({region.pes:,} PEs)"


def _min_drawn_pes(report: "PlacementReport") -> float:
    """Regions thinner than this many PEs are drawn this thick (else they would vanish)."""
    return _MIN_DRAWN_POINTS / (_WAFER_INCHES * 72 / report.fabric.width)


def _thin(report: "PlacementReport", region: "Region") -> bool:
    return min(region.width, region.height) < _min_drawn_pes(report)


def _shows_path(report: "PlacementReport", show_path: bool) -> bool:
    return show_path and len(report.regions) > 1


def _shows_grid(report: "PlacementReport") -> bool:
    return report.fabric.width <= _SMALL_FABRIC and report.fabric.height <= _SMALL_FABRIC


def _mark_entries(report: "PlacementReport", show_path: bool) -> list[tuple[str, dict[str, Any]]]:
    """(label, how it is drawn) for each kind of mark on the wafer other than the layers themselves."""
    entries: list[tuple[str, dict[str, Any]]] = []
    if _shows_path(report, show_path):
        entries.append(("pipeline path: layer centres, in order", {"line": _PATH_STYLE}))
        entries += [(label, {"marker": marker}) for marker, label in _ENDS]
    if any(_thin(report, region) for region in report.regions):
        entries.append((f"region under {_MIN_DRAWN_POINTS:g} pt thick, drawn thicker",
                        {"patch": dict(facecolor="white", edgecolor="#333333", lw=0.8)}))
    if report.pes_used < report.fabric.num_pes:
        entries.append(("PEs no layer uses", {"patch": dict(facecolor="#eeeeee", edgecolor="#555555", lw=0.5)}))
    if _shows_grid(report):
        entries.append(("white grid: one cell per PE", {"patch": dict(facecolor="#bbbbbb", edgecolor="white",
                                                                      hatch="+")}))
    return entries


def _bound_lines(report: "PlacementReport") -> list[str]:
    """The four bounds on samples/s, the limiting one marked (the estimate meets it)."""
    from cerebras_tf.wse.units import fmt_rate

    return [f"{_BOUND_NAMES.get(name, name)} {fmt_rate(value)}"
            + ("  <- limits the estimate" if name == report.limiting_bound else "")
            for name, value in report.bounds.items()]


def legend_labels(report: "PlacementReport", *, show_path: bool = True) -> list[str]:
    """Every entry of the picture's key, in order: layers, then marks, then bounds."""
    return ([_layer_label(region) for region in report.regions]
            + [label for label, _ in _mark_entries(report, show_path)]
            + _bound_lines(report))


def _columns(labels: list[str], width: float) -> int:
    """How many legend columns of `labels` fit in `width` inches."""
    column = _HANDLE_INCHES + _CHAR_INCHES * max(len(label) for label in labels) + 0.15
    return max(1, min(len(labels), int(width // column)))


def render_placement_png(report: "PlacementReport", *, dpi: int = 110, show_path: bool = True,
                         title: str | None = None) -> bytes:
    """PNG bytes of the placement in `report`, with its key below the wafer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    fabric = report.fabric
    regions = report.regions
    colours = _palette(len(regions))
    wafer_h = _WAFER_INCHES * fabric.height / fabric.width
    layer_labels = [_layer_label(region) for region in regions]
    columns = _columns(layer_labels, _WAFER_INCHES)
    layer_rows = -(-len(regions) // columns)
    marks = _mark_entries(report, show_path)
    bounds = _bound_lines(report)
    key_rows = max(len(marks), len(bounds)) + 1
    top, below_axes = 0.7, 0.55  # title; tick labels and x-axis label
    layers_h = (layer_rows + 1.3) * _LINE_INCHES
    key_h = key_rows * _LINE_INCHES
    fig_w, fig_h = _LEFT + _WAFER_INCHES + _RIGHT, top + wafer_h + below_axes + layers_h + key_h + 0.1
    fig = Figure(figsize=(fig_w, fig_h), dpi=dpi)
    FigureCanvasAgg(fig)
    bottom = fig_h - top - wafer_h
    ax = fig.add_axes((_LEFT / fig_w, bottom / fig_h, _WAFER_INCHES / fig_w, wafer_h / fig_h))
    ax.add_patch(Rectangle((0, 0), fabric.width, fabric.height, facecolor="#eeeeee", edgecolor="#555555", lw=1.0))
    pts_per_pe = _WAFER_INCHES * 72 / fabric.width
    min_pes = _min_drawn_pes(report)
    for region, colour in zip(regions, colours):
        x, w = _widen(region.x, region.width, min_pes, fabric.width)
        y, h = _widen(region.y, region.height, min_pes, fabric.height)
        thin = _thin(report, region)
        ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, edgecolor="#333333" if thin else "white",
                               lw=0.4 if thin else 0.6, zorder=2.5 if thin else 1.5))

    # labels: index always when the rectangle has room, "index name" when it is wide enough; beside the
    # centre when the region has room, so the path's vertex and end marks there stay visible
    path = _shows_path(report, show_path)
    for region in regions:
        w_pt, h_pt = region.width * pts_per_pe, region.height * pts_per_pe
        size = min(9.0, 0.8 * h_pt, 0.55 * w_pt / max(1, len(str(region.index))))
        if size < 3.5:
            continue
        long_label = f"{region.index} {region.name}"
        text = long_label if len(long_label) * 0.6 * size <= w_pt and h_pt >= 1.5 * size else str(region.index)
        x, y, ha, va = region.x + region.width / 2, region.y + region.height / 2, "center", "center"
        gap = 0.5 * size / pts_per_pe  # PEs
        if path and h_pt >= 3 * size:  # above the centre
            y, va = y - gap, "bottom"
        elif path and w_pt >= 2 * (len(text) * 0.6 + 1) * size:  # right of the centre
            x, ha = x + gap, "left"
        ax.text(x, y, text, ha=ha, va=va,
                fontsize=size, color="black", clip_on=True, zorder=4,
                bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.6))

    if path:
        xs = [r.x + r.width / 2 for r in regions]
        ys = [r.y + r.height / 2 for r in regions]
        ax.plot(xs, ys, zorder=3, **_PATH_STYLE)
        for (marker, _), index in zip(_ENDS, (0, -1)):
            ax.plot(xs[index:][:1], ys[index:][:1], marker=marker, color="black", ms=3.5, alpha=0.8, zorder=5)

    if _shows_grid(report):
        ax.set_xticks(range(fabric.width + 1), minor=True)
        ax.set_yticks(range(fabric.height + 1), minor=True)
        ax.grid(which="minor", color="white", lw=0.3, alpha=0.5)
        ax.tick_params(which="minor", length=0)
    ax.set_xlim(0, fabric.width)
    ax.set_ylim(fabric.height, 0)  # row 0 at the top, like the wafer pictures
    ax.set_xlabel(f"PE column (of {fabric.width})", fontsize=8, labelpad=2)
    ax.set_ylabel(f"PE row (of {fabric.height})", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.set_aspect("equal")
    mode = "training" if report.training else "inference"
    ax.set_title(title or (
        f"{fabric.name}: {len(regions)} layers pipelined ({mode}), est. "
        f"{report.estimated_samples_per_sec:,.0f} samples/s\n"
        f"limited by {_BOUND_NAMES.get(report.limiting_bound, report.limiting_bound)}, placement efficiency "
        f"{report.placement_efficiency:.3f}, fill {report.fill_latency_steps} steps"), fontsize=9)

    legend: dict[str, Any] = dict(fontsize=_KEY_FONT, frameon=False, loc="upper left", handlelength=1.6,
                                  handletextpad=0.5, borderaxespad=0.0, borderpad=0.0,
                                  title_fontsize=_KEY_FONT + 0.5, alignment="left")
    layers_top = bottom - below_axes
    handles = [Patch(facecolor=c, edgecolor="none", label=label) for label, c in zip(layer_labels, colours)]
    fig.legend(handles=handles, ncol=columns, columnspacing=1.2, bbox_to_anchor=(_LEFT / fig_w, layers_top / fig_h),
               title="layers (pipeline order): index name (PEs)", **legend)
    key_top = layers_top - layers_h
    if marks:
        mark_handles = [Line2D([], [], label=label, **style["line"]) if "line" in style else
                        Line2D([], [], ls="none", marker=style["marker"], color="black", ms=4, label=label)
                        if "marker" in style else Patch(label=label, **style["patch"]) for label, style in marks]
        fig.legend(handles=mark_handles, bbox_to_anchor=(_LEFT / fig_w, key_top / fig_h), title="marks", **legend)
    fig.text((_LEFT + _WAFER_INCHES / 2) / fig_w, key_top / fig_h,
             "samples/s bounds for any placement\n" + "\n".join(bounds), fontsize=_KEY_FONT, va="top",
             ha="left", linespacing=1.45)
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
