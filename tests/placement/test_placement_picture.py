"""The placement picture is a valid PNG."""
from __future__ import annotations

import struct

from benchmarks.reference_models import bert_base
from cerebras_tf.wse.fabric import WSE2, small_fabric
from cerebras_tf.wse.placement import LayerCost, place
from cerebras_tf.wse.placement_picture import render_placement_png

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
    assert _size(data)[0] > _size(place([LayerCost("a", flops_fwd=1.0)], WSE2).to_png())[0]  # legend columns
