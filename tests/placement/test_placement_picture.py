"""The placement picture is a valid PNG, explains every mark it draws and leaves no part of itself blank."""
from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from benchmarks.reference_models import bert_base
from cerebras_tf.wse.fabric import WSE2, small_fabric
from cerebras_tf.wse.placement import LayerCost, place
from cerebras_tf.wse.placement_picture import legend_labels, render_placement_png

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _size(data: bytes) -> tuple[int, int]:
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_png_bytes_and_file(tmp_path):
    layers = [LayerCost(f"l{i}", flops_fwd=1e6 * (i + 1)) for i in range(5)]
    report = place(layers, small_fabric(20, 12))
    data = render_placement_png(report)
    assert data.startswith(PNG_MAGIC) and len(data) > 1000
    width, height = _size(data)
    assert width > 200 and height > 200
    path = tmp_path / "compile_dir" / "placement.png"
    written = report.to_png(str(path))
    assert path.read_bytes() == written and written.startswith(PNG_MAGIC)


def test_png_of_a_large_model():
    data = place(bert_base(), WSE2).to_png()
    assert data.startswith(PNG_MAGIC)
    assert _size(data)[1] > _size(place([LayerCost("a", flops_fwd=1.0)], WSE2).to_png())[1]  # legend rows


def _fc_digits_like():
    """Three layers filling WSE-2 in full-width bands, limited by host I/O (as the fc_digits example is)."""
    layers = [LayerCost("fc0", flops_fwd=16_640, output_bytes=256),
              LayerCost("fc1", flops_fwd=16_512, output_bytes=256), LayerCost("fc_output", flops_fwd=1_300)]
    return place(layers, WSE2, input_bytes_per_sample=260)


def test_the_key_explains_the_path_its_ends_and_the_bounds():
    report = _fc_digits_like()
    labels = legend_labels(report)
    assert labels[:3] == ["0 fc0 (410,700 PEs)", "1 fc1 (407,925 PEs)", "2 fc_output (32,375 PEs)"]
    assert "pipeline path: layer centres, in order" in labels  # the thin line through the layer centres
    assert {"first layer (input)", "last layer (output)"} <= set(labels)
    limits = [label for label in labels if "limits the estimate" in label]
    assert limits == ["host I/O 576.9M  <- limits the estimate"]
    assert not any("drawn thicker" in label for label in labels)  # no region is that thin here
    assert not any("path" in label for label in legend_labels(report, show_path=False))


def test_the_key_explains_thin_regions_and_the_pe_grid_where_they_appear():
    assert any("drawn thicker" in label for label in legend_labels(place(bert_base(), WSE2)))
    small = legend_labels(place([LayerCost(f"l{i}", flops_fwd=1e6) for i in range(3)], small_fabric(20, 12)))
    assert "white grid: one cell per PE" in small
    assert not any("path" in label for label in legend_labels(place([LayerCost("a", flops_fwd=1.0)], WSE2)))


@pytest.mark.parametrize("report", [_fc_digits_like, lambda: place(bert_base(), WSE2)], ids=["fc_digits", "bert"])
def test_no_fifth_of_the_picture_is_blank(report):
    from matplotlib.image import imread

    ink = (imread(io.BytesIO(report().to_png()), format="png")[..., :3] < 0.97).any(axis=-1)
    height, width = ink.shape
    columns = [ink[:, i * width // 5:(i + 1) * width // 5].mean() for i in range(5)]
    rows = [ink[i * height // 5:(i + 1) * height // 5].mean() for i in range(5)]
    # the old side legend left its column 99% white for a 3-layer model
    assert min(columns + rows) > 0.03, (np.round(columns, 3), np.round(rows, 3))
