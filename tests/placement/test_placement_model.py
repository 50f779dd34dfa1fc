"""Region sizing, bounds, fill latency, the too-big-model error and the report."""
from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.reference_models import REFERENCE_MODELS, bert_base, mlp
from cerebras_tf.errors import CerebrasError, FabricCapacityError
from cerebras_tf.wse.fabric import WSE1, WSE2, small_fabric
from cerebras_tf.wse.placement import LayerCost, in_flight_samples, place


def _layer(name: str, gflops: float, weight_bytes: float = 0.0, activation_bytes: float = 0.0) -> LayerCost:
    return LayerCost(name, flops_fwd=gflops * 1e9 / 3, flops_bwd=gflops * 1e9 * 2 / 3,
                     weight_bytes=weight_bytes, activation_bytes=activation_bytes)


def test_twice_the_flops_gets_twice_the_pes():
    report = place([_layer("a", 1.0), _layer("b", 2.0), _layer("c", 1.0), _layer("d", 4.0)], small_fabric(200, 150))
    pes = {r.name: r.pes for r in report.regions}
    assert pes["b"] / pes["a"] == pytest.approx(2.0, rel=0.05)
    assert pes["d"] / pes["c"] == pytest.approx(4.0, rel=0.05)
    assert pes["a"] == pytest.approx(pes["c"], rel=0.05)


def test_throughput_is_the_slowest_region():
    report = place([_layer(f"l{i}", 1.0 + i) for i in range(6)], small_fabric(120, 80))
    alone = [r.samples_per_sec_alone for r in report.regions]
    assert report.estimated_samples_per_sec == pytest.approx(min(alone))
    assert report.slowest_layer == report.regions[int(np.argmin(alone))].name
    assert report.limiting_bound == "compute"
    for region in report.regions:
        assert region.samples_per_sec_alone == pytest.approx(
            region.pes * report.fabric.sustained_pe_flops_per_sec("half") / region.flops_per_sample)


def test_compute_bound_and_efficiency():
    fabric = small_fabric(100, 100)
    layers = [_layer(f"l{i}", g) for i, g in enumerate((0.5, 2.0, 1.0, 3.0))]
    report = place(layers, fabric)
    total = sum(layer.flops_per_sample() for layer in layers)
    assert report.bounds["compute"] == pytest.approx(fabric.num_pes * fabric.sustained_pe_flops_per_sec("half") / total)
    assert report.bound_samples_per_sec == report.bounds["compute"]
    assert report.placement_efficiency == pytest.approx(report.estimated_samples_per_sec / report.bounds["compute"])
    assert 0.9 <= report.placement_efficiency <= 1.0


def test_single_precision_is_a_quarter_of_half():
    layers = [_layer("a", 1.0), _layer("b", 1.0)]
    half = place(layers, small_fabric(40, 40)).bounds["compute"]
    single = place(layers, small_fabric(40, 40), precision="single").bounds["compute"]
    assert single == pytest.approx(half / 4)


def test_memory_sizes_a_heavy_layer_and_binds():
    fabric = small_fabric(40, 40, sram_bytes_per_pe=1000)
    # layer "big" needs 600 PEs for memory although it has the least compute
    layers = [_layer("x", 1.0), _layer("big", 0.1, weight_bytes=600_000), _layer("y", 1.0)]
    report = place(layers, fabric)
    big = report.regions[1]
    assert big.pes >= 600 and big.bytes <= big.sram_bytes
    assert report.bounds["memory"] < report.bounds["compute"]
    assert report.limiting_bound == "memory"
    assert _bounds_named(report.notes) == ["memory"] and "'big'" in report.notes[0]
    # the rest shares the other ~1000 PEs
    assert report.estimated_samples_per_sec <= report.bounds["memory"] * (1 + 1e-9)
    assert report.placement_efficiency >= 0.9


def test_in_flight_activations_follow_pipeline_depth():
    assert list(in_flight_samples(4)) == [7, 5, 3, 1]
    assert list(in_flight_samples(3, training=False)) == [1, 1, 1]
    fabric = small_fabric(64, 64, sram_bytes_per_pe=1000)
    layers = [_layer(f"l{i}", 1.0, activation_bytes=10_000) for i in range(4)]
    report = place(layers, fabric)
    assert [r.bytes for r in report.regions] == [70_000, 50_000, 30_000, 10_000]
    assert [r.in_flight_samples for r in report.regions] == [7, 5, 3, 1]


def test_samples_streamed_as_rows_hold_fewer_in_flight():
    """A sample crosses a layer in 1/rows of a step, so fewer samples come in while one travels to the loss
    and back: 1 + ceil(2 * sum of the downstream crossings)."""
    assert list(in_flight_samples(4, stream_rows=[2, 2, 2, 2])) == [4, 3, 2, 1]
    assert list(in_flight_samples(3, stream_rows=[1, 4, 1])) == [4, 3, 1]  # 1 + ceil(2 * (1/4 + 1)), 1 + 2, 1
    assert list(in_flight_samples(200, stream_rows=[128] * 200))[:2] == [5, 5]
    assert list(in_flight_samples(3, training=False, stream_rows=[1, 4, 1])) == [1, 1, 1]
    fabric = small_fabric(64, 64, sram_bytes_per_pe=1000)
    layers = [LayerCost(f"l{i}", flops_fwd=1.0, activation_bytes=10_000, stream_rows=2) for i in range(4)]
    report = place(layers, fabric)
    assert [r.bytes for r in report.regions] == [40_000, 30_000, 20_000, 10_000]
    with pytest.raises(ValueError, match="stream_rows must be an integer >= 1"):
        LayerCost("bad", flops_fwd=1.0, stream_rows=0)


def test_inference_counts_forward_only():
    layers = [_layer("a", 3.0), _layer("b", 3.0)]
    train = place(layers, small_fabric(50, 50))
    infer = place(layers, small_fabric(50, 50), training=False)
    assert infer.regions[0].flops_per_sample == pytest.approx(1e9)
    assert infer.bounds["compute"] == pytest.approx(3 * train.bounds["compute"])


def test_host_io_bound_limits():
    fabric = small_fabric(30, 30, host_io_bytes_per_sec=1e6)
    report = place([_layer("a", 1e-6), _layer("b", 1e-6)], fabric, input_bytes_per_sample=1000)
    assert report.bounds["host_io"] == pytest.approx(1000.0)
    assert report.estimated_samples_per_sec == pytest.approx(1000.0)
    assert report.limiting_bound == "host_io"
    assert report.placement_efficiency == pytest.approx(1.0)


def test_fabric_links_are_respected_or_named():
    # huge activations between tiny-compute layers: link bandwidth, not compute, limits
    fabric = small_fabric(20, 20, link_bytes_per_sec=1e3)
    layers = [LayerCost(f"l{i}", flops_fwd=1e3, output_bytes=1e6) for i in range(3)]
    report = place(layers, fabric, training=False)
    assert report.limiting_bound == "fabric_links"
    assert report.estimated_samples_per_sec == pytest.approx(report.fabric_links_samples_per_sec)
    assert report.estimated_samples_per_sec < min(r.samples_per_sec_alone for r in report.regions)
    # no two rectangles on a 20 x 20 grid share more than 20 links: the bound says so, and the placement reaches it
    assert report.bounds["fabric_links"] == pytest.approx(20 * 1e3 / 1e6)
    assert report.placement_efficiency == pytest.approx(1.0)
    assert _bounds_named(report.notes) == ["fabric links"]
    assert "'l0' sends 1 MB per sample to 'l1' over the 20 links their regions share" in report.notes[0]


# How the placement notes name each bound.
_BOUND_WORDS = {"compute": "compute", "memory": "memory", "fabric_links": "fabric links", "host_io": "host I/O"}


def _bounds_named(notes: list[str]) -> list[str]:
    """The bounds the notes talk about, by the words they use, one entry per note."""
    return [word for note in notes for word in _BOUND_WORDS.values() if word in note]


def test_a_host_io_limited_placement_notes_only_host_io():
    # fc_digits on WSE-2 in miniature: the fabric-link bound is below compute, but host I/O is lower still
    fabric = small_fabric(20, 20, link_bytes_per_sec=1e3, host_io_bytes_per_sec=1.0)
    layers = [LayerCost(f"l{i}", flops_fwd=1e3, output_bytes=1e6) for i in range(3)]
    report = place(layers, fabric, training=False, input_bytes_per_sample=1000)
    assert report.bounds["fabric_links"] < report.bounds["compute"]
    assert report.limiting_bound == "host_io"
    assert _bounds_named(report.notes) == ["host I/O"]
    assert report.notes[0].startswith("host I/O limits the pipeline: each sample brings 1 KB of input")
    assert report.to_dict()["notes"] == report.notes
    assert "fabric links" not in report.render_table()  # the bounds line names it as fabric_links, no note


def test_a_compute_limited_placement_has_no_note():
    report = place([_layer(f"l{i}", 1.0 + i) for i in range(4)], small_fabric(60, 60))
    assert report.limiting_bound == "compute" and report.notes == []


def test_link_limited_layers_get_the_longer_side_of_the_wafer():
    fabric = small_fabric(30, 10, link_bytes_per_sec=1e3)  # bands of columns share at most 10 links, rows 30
    layers = [LayerCost(f"l{i}", flops_fwd=1e3, output_bytes=1e6) for i in range(4)]
    report = place(layers, fabric, training=False)
    assert report.bounds["fabric_links"] == pytest.approx(30 * 1e3 / 1e6)
    assert report.limiting_bound == "fabric_links"
    assert all(region.width == 30 for region in report.regions)
    assert report.placement_efficiency == pytest.approx(1.0)


def test_fill_latency():
    report = place([_layer(f"l{i}", 1.0) for i in range(5)], small_fabric(60, 60))
    assert report.fill_latency_steps == 5
    assert report.fill_latency_seconds == pytest.approx(5 / report.estimated_samples_per_sec)


@pytest.mark.parametrize("model", sorted(REFERENCE_MODELS))
def test_reference_models_on_wse2_are_efficient(model):
    build, input_bytes = REFERENCE_MODELS[model]
    report = place(build(), WSE2, input_bytes_per_sample=input_bytes)
    assert report.placement_efficiency >= 0.95, report.render_table()
    assert report.adjacent_fraction == 1.0
    assert report.limiting_bound in ("compute", "memory")  # fabric links and host I/O keep up
    assert report.placement_seconds < 5.0
    for region in report.regions:
        assert region.bytes <= region.pes * WSE2.sram_bytes_per_pe


def test_bert_base_hand_costs():
    layers = bert_base()
    params = sum(layer.weight_bytes for layer in layers) / 4
    assert params == pytest.approx(110e6, rel=0.05)  # BERT-base has ~110M parameters
    qkv = next(layer for layer in layers if layer.name == "encoder0_qkv")
    assert qkv.flops_fwd == 2 * 128 * 768 * 2304 + 128 * 2304


def test_too_big_model_error():
    # 40 layers of ~100M float32 parameters with Adam: 16.4 GB weights + 48 GB state + 1.6 GB activations
    layers = [LayerCost(f"huge_{i}", flops_fwd=1e9, weight_bytes=4e8 * (1 + (i == 7)),
                        optimizer_state_bytes=1.2e9, activation_bytes=1e6) for i in range(40)]
    with pytest.raises(FabricCapacityError) as info:
        place(layers, WSE2)
    error = info.value
    assert isinstance(error, CerebrasError)
    text = str(error)
    assert "needs 66 GB" in text and "has 41.8 GB" in text  # needed vs available
    assert "huge_7" in text.split("Largest layers:")[1]  # the largest layer is named first
    assert "Weight streaming execution is the mode for larger models" in text and "weight_streaming" in text
    assert "1 billion parameters" in text
    assert error.bytes_needed > error.bytes_available == WSE2.total_sram_bytes
    assert error.largest_layers[0][0] == "huge_7"


def test_more_layers_than_the_grid_can_hold():
    with pytest.raises(FabricCapacityError):
        place([_layer(f"l{i}", 1.0) for i in range(20)], small_fabric(4, 4))


def test_bad_inputs():
    with pytest.raises(ValueError, match="at least one layer"):
        place([], WSE1)
    with pytest.raises(ValueError, match="unique"):
        place([_layer("a", 1.0), _layer("a", 1.0)], WSE1)
    with pytest.raises(ValueError, match=">= 0"):
        LayerCost("neg", flops_fwd=-1.0)


def test_report_keys_json_and_table():
    report = place(mlp(), WSE2, input_bytes_per_sample=3140)
    data = report.to_dict()
    for key in ("estimated_samples_per_sec", "bound_samples_per_sec", "placement_efficiency", "limiting_bound",
                "fill_latency_steps", "fill_latency_seconds", "fabric", "layers", "bounds"):
        assert key in data, key
    assert data["fabric"]["name"] == "WSE-2" and data["fabric"]["width"] == 925 and data["fabric"]["height"] == 920
    assert len(data["layers"]) == 4
    for layer in data["layers"]:
        for key in ("name", "x", "y", "width", "height", "pes", "flops_per_sample", "bytes",
                    "samples_per_sec_alone"):
            assert key in layer, key
        assert layer["pes"] == layer["width"] * layer["height"]
    json.loads(json.dumps(data, allow_nan=False))
    table = report.render_table()
    assert "dense_0" in table and "samples/s" in table and "limited by" in table
    assert len(table.splitlines()) >= 4 + 4
