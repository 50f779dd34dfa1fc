"""compile() places the program on the fabric: report object, report.json, placement.png."""
from __future__ import annotations

import json

import numpy as np
import pytest

from cerebras_tf import CSRunConfig
from cerebras_tf.compiler import driver
from cerebras_tf.errors import FabricCapacityError
from cerebras_tf.wse.fabric import small_fabric
from examples.zoo import benchmark_models, cnn, mlp, transformer

REPORT_KEYS = {"estimated_samples_per_sec", "bound_samples_per_sec", "placement_efficiency", "limiting_bound",
               "fill_latency_steps", "fabric", "layers"}
LAYER_KEYS = {"name", "x", "y", "width", "height", "pes", "flops_per_sample", "bytes", "samples_per_sec_alone"}


@pytest.mark.parametrize("model", [mlp, cnn], ids=["mlp", "cnn"])
def test_full_compile_places_every_layer_and_writes_report_and_picture(zoo_estimator, tmp_path, model):
    name = "mlp" if model is mlp else "cnn"
    result = zoo_estimator(name, compile_dir=str(tmp_path / "compile")).compile(model.input_fn)
    placement = result.placement
    assert placement is not None
    assert [r.name for r in placement.regions] == [layer.name for layer in result.program.layers]
    assert placement.fabric.name == "WSE-2"
    assert 0 < placement.placement_efficiency <= 1.0 + 1e-9
    assert placement.estimated_samples_per_sec == pytest.approx(
        placement.placement_efficiency * placement.bound_samples_per_sec)
    assert "Pipelined placement on WSE-2" in result.report

    directory = tmp_path / "compile" / "train"
    report = json.loads((directory / driver.PLACEMENT_REPORT_FILE).read_text())
    assert REPORT_KEYS <= set(report)
    assert report["fabric"]["name"] == "WSE-2" and report["fabric"]["width"] * report["fabric"]["height"] > 800_000
    assert all(LAYER_KEYS <= set(layer) for layer in report["layers"])
    assert (directory / driver.PLACEMENT_PICTURE_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_reused_artifact_still_returns_the_same_placement(zoo_estimator, tmp_path):
    compile_dir = str(tmp_path / "compile")
    first = zoo_estimator("mlp", compile_dir=compile_dir).compile(mlp.input_fn)
    second = zoo_estimator("mlp", compile_dir=compile_dir).compile(mlp.input_fn)
    assert second.reused
    assert second.placement.to_dict()["layers"] == first.placement.to_dict()["layers"]


def test_validate_only_does_not_place(zoo_estimator):
    assert zoo_estimator("mlp").compile(mlp.input_fn, validate_only=True).placement is None


def test_a_model_too_big_for_the_fabric_fails_at_compile_with_sizes(zoo_estimator, tmp_path):
    tiny = small_fabric(2, 2, sram_bytes_per_pe=256)
    compile_dir = tmp_path / "compile"
    estimator = zoo_estimator("mlp", compile_dir=str(compile_dir), cs_config={"fabric": tiny})
    with pytest.raises(FabricCapacityError) as info:
        estimator.compile(mlp.input_fn)
    message = str(info.value)
    assert "Weight streaming" in message and "small-2x2" in message and "27.6 KB" in message
    assert not (compile_dir / "train").exists()  # nothing half-written


def test_unknown_fabric_name_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"cs_config=\{'fabric': 'WSE-9'\}.*'WSE-2'"):
        CSRunConfig(cs_config={"fabric": "WSE-9"})


def test_full_compile_writes_the_placement_picture_as_a_tensorboard_image(zoo_estimator, tmp_path):
    import glob

    import tensorflow as tf

    estimator = zoo_estimator("mlp", compile_dir=str(tmp_path / "compile"))
    result = estimator.compile(mlp.input_fn)
    files = glob.glob(str(tmp_path / "model" / "cs_placement" / "events.out.tfevents.*"))
    assert len(files) == 1
    images = [value for event in tf.compat.v1.train.summary_iterator(files[0])
              for value in event.summary.value if value.HasField("image")]
    assert [value.tag for value in images] == ["placement/train"]
    assert images[0].image.encoded_image_string == result.placement.to_png()


@pytest.mark.parametrize("name", sorted(benchmark_models()))
def test_real_ir_zoo_models_place_efficiently_on_wse2(zoo_estimator, name):
    module, params = benchmark_models()[name]
    model = "transformer" if module is transformer else name
    placement = zoo_estimator(model, params=params).compile(module.input_fn).placement
    fabric = placement.fabric
    assert fabric.name == "WSE-2"
    assert placement.placement_efficiency >= 0.95, placement.render_table()
    assert placement.adjacent_fraction == 1.0
    grid = np.zeros((fabric.height, fabric.width), dtype=np.int64)
    for region in placement.regions:
        assert 0 <= region.x and region.x + region.width <= fabric.width
        assert 0 <= region.y and region.y + region.height <= fabric.height
        grid[region.y:region.y + region.height, region.x:region.x + region.width] += 1
        assert region.bytes <= region.sram_bytes == region.pes * fabric.sram_bytes_per_pe
    assert grid.max() == 1, "regions overlap"


def test_weight_streaming_compiles_to_a_per_layer_timing_on_one_or_several_systems(zoo_estimator, tmp_path):
    """cs_config's execution_strategy chooses the layout: weight streaming times each layer over the batch of
    every system (the program's batch is one system's); the report, report.json and picture say so."""
    from cerebras_tf.wse.streaming import StreamingReport

    result = zoo_estimator("mlp", compile_dir=str(tmp_path / "compile"),
                           cs_config={"execution_strategy": "weight_streaming", "num_csx": 2}).compile(mlp.input_fn)
    streaming = result.placement
    assert isinstance(streaming, StreamingReport)
    assert [layer.name for layer in streaming.layers] == [layer.name for layer in result.program.layers]
    features = result.program.tensors[result.program.inputs["features"]]
    assert streaming.num_systems == 2 and streaming.batch_size == 2 * features.shape[0]
    assert "Weight streaming on 2 systems x WSE-2" in result.report
    assert "(weight streaming, 2 systems; limited by" in result.summary()
    why = "Execution mode: weight streaming: cs_config's execution_strategy asks for it."
    assert why in result.summary() and why in result.report
    directory = tmp_path / "compile" / "train"
    report = json.loads((directory / driver.PLACEMENT_REPORT_FILE).read_text())
    assert report["execution_strategy"] == "weight_streaming" and report["num_systems"] == 2
    assert (directory / driver.PLACEMENT_PICTURE_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    pipelined = zoo_estimator("mlp", compile_dir=str(tmp_path / "compile")).compile(mlp.input_fn)
    assert not pipelined.reused and "changed" in pipelined.note  # another layout: recompiled, not reused
    assert pipelined.graph_hash != result.graph_hash and pipelined.program.kernels == result.program.kernels
    assert "Execution mode: pipelined execution: the default (cs_config sets no execution_strategy" in \
        pipelined.summary()


def test_several_systems_in_pipelined_execution_are_refused(zoo_estimator):
    with pytest.raises(Exception, match="num_csx=2 asks for 2 CS systems in pipelined execution"):
        zoo_estimator("mlp", cs_config={"num_csx": 2}).compile(mlp.input_fn)
