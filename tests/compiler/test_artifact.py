"""The compiled artifact: reused when unchanged, refused for another system, rebuilt when corrupt."""
from __future__ import annotations

import errno
import json
import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig, ir, tf_helper
from cerebras_tf.compiler import artifact
from cerebras_tf.errors import ArtifactSystemMismatchError, ModelDirWriteError
from cerebras_tf.wse.fabric import WSE2
from examples.zoo import mlp


def _snapshot(directory) -> dict[str, tuple[int, int]]:
    return {name: (os.stat(directory / name).st_mtime_ns, os.stat(directory / name).st_size)
            for name in sorted(os.listdir(directory))}


def test_second_compile_reuses_the_artifact_without_rewriting(zoo_estimator, tmp_path):
    compile_dir = tmp_path / "compile"
    first = zoo_estimator("mlp", compile_dir=str(compile_dir)).compile(mlp.input_fn)
    directory = compile_dir / "train"
    before = _snapshot(directory)

    second = zoo_estimator("mlp", compile_dir=str(compile_dir)).compile(mlp.input_fn)
    assert not first.reused and second.reused and second.note == "reused"
    assert second.program == first.program and second.graph_hash == first.graph_hash
    assert second.report == first.report
    assert _snapshot(directory) == before  # nothing rewritten
    assert sorted(os.listdir(compile_dir)) == ["train"]  # no temp dirs left behind

    manifest = json.loads((directory / artifact.MANIFEST_FILE).read_text())
    assert manifest["graph_hash"] == first.graph_hash
    assert manifest["system"] == {"system_name": "localhost:9000", "fabric": WSE2.to_dict()}
    assert set(manifest["files"]) == {"program.json", "constants.npz", "report.txt", "report.json", "placement.png"}


def test_changed_graph_is_recompiled(zoo_estimator, tmp_path):
    compile_dir = str(tmp_path / "compile")
    first = zoo_estimator("mlp", compile_dir=compile_dir).compile(mlp.input_fn)
    changed = zoo_estimator("mlp", compile_dir=compile_dir, params={"hidden_sizes": [16, 24, 16]})
    second = changed.compile(mlp.input_fn)
    assert not second.reused and second.graph_hash != first.graph_hash
    assert "changed since the artifact was compiled" in second.note
    assert ir.Program.load(os.path.join(compile_dir, "train")) == second.program


def test_artifact_for_another_system_is_refused(zoo_estimator, tmp_path):
    compile_dir = str(tmp_path / "compile")
    zoo_estimator("mlp", compile_dir=compile_dir, system_name="cs-system-a").compile(mlp.input_fn)
    other = zoo_estimator("mlp", compile_dir=compile_dir, system_name="cs-system-b")
    with pytest.raises(ArtifactSystemMismatchError) as info:
        other.compile(mlp.input_fn)
    message = str(info.value)
    assert "'cs-system-a'" in message and "'cs-system-b'" in message
    assert "cannot run on another" in message and "compile_dir" in message
    # validate_only needs no artifact, so it still works
    assert other.compile(mlp.input_fn, validate_only=True).validate_only


@pytest.mark.parametrize("damage", ["truncate_program", "flip_constants", "delete_report", "garble_manifest"])
def test_corrupt_artifact_is_detected_logged_and_rebuilt(zoo_estimator, tmp_path, caplog, damage):
    compile_dir = tmp_path / "compile"
    first = zoo_estimator("mlp", compile_dir=str(compile_dir)).compile(mlp.input_fn)
    directory = compile_dir / "train"
    if damage == "truncate_program":
        text = (directory / "program.json").read_text()
        (directory / "program.json").write_text(text[: len(text) // 2])
    elif damage == "flip_constants":
        data = bytearray((directory / "constants.npz").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (directory / "constants.npz").write_bytes(bytes(data))
    elif damage == "delete_report":
        os.remove(directory / "report.txt")
    else:
        (directory / artifact.MANIFEST_FILE).write_text("{not json")

    with caplog.at_level(logging.WARNING):
        rebuilt = zoo_estimator("mlp", compile_dir=str(compile_dir)).compile(mlp.input_fn)
    assert not rebuilt.reused and "corrupt" in rebuilt.note
    assert any("corrupt" in record.getMessage() for record in caplog.records)
    assert rebuilt.program == first.program
    again = zoo_estimator("mlp", compile_dir=str(compile_dir)).compile(mlp.input_fn)
    assert again.reused  # the rebuilt artifact is intact


def test_an_intact_artifact_holding_a_malformed_program_is_rebuilt(zoo_estimator, tmp_path, caplog):
    compile_dir = tmp_path / "compile"
    first = zoo_estimator("mlp", compile_dir=str(compile_dir)).compile(mlp.input_fn)
    directory = str(compile_dir / "train")
    manifest = json.loads((compile_dir / "train" / artifact.MANIFEST_FILE).read_text())
    broken = ir.Program.load(directory)
    broken.kernels[0], broken.kernels[1] = broken.kernels[1], broken.kernels[0]  # checksums will match
    artifact.write_artifact(directory, broken, first.report, first.graph_hash, manifest["system"])

    with caplog.at_level(logging.WARNING):
        rebuilt = zoo_estimator("mlp", compile_dir=str(compile_dir)).compile(mlp.input_fn)
    assert not rebuilt.reused and "malformed program" in rebuilt.note and "kernel at index 0" in rebuilt.note
    assert rebuilt.program == first.program


@pytest.mark.parametrize("failure", ["moving it into place", "another error"])
def test_a_failed_write_leaves_the_artifact_already_there_as_it_was(failure, zoo_estimator, tmp_path, monkeypatch):
    compile_dir = tmp_path / "compile"
    first = zoo_estimator("mlp", compile_dir=str(compile_dir)).compile(mlp.input_fn)
    directory = compile_dir / "train"
    before = {name: (directory / name).read_bytes() for name in os.listdir(directory)}
    system = json.loads(before[artifact.MANIFEST_FILE])["system"]
    if failure == "moving it into place":  # the old artifact is moved aside, then the new one cannot take its place
        rename = os.rename

        def refuse_the_new_one(source, target):
            if os.path.basename(source).startswith(".train.tmp-"):
                raise PermissionError(errno.EACCES, "Permission denied", target)
            rename(source, target)

        monkeypatch.setattr(os, "rename", refuse_the_new_one)
        expected: type[Exception] = ModelDirWriteError
    else:  # not a full disk or an unwritable compile_dir: raised as it is, and cleaned up all the same
        save = first.program.save

        def save_then_fail(staging):
            save(staging)
            raise ValueError("not a write failure")

        monkeypatch.setattr(first.program, "save", save_then_fail)
        expected = ValueError
    with pytest.raises(expected) as caught:
        artifact.write_artifact(str(directory), first.program, "another report", "another hash", system)
    monkeypatch.undo()
    if expected is ModelDirWriteError:
        assert caught.value.message.startswith(f"compile_dir {compile_dir} is not writable: writing the compile "
                                               "artifact of mode train failed (Permission denied); ")
        assert caught.value.fix.endswith(f"the model is compiled again into {directory} (the artifact already there "
                                         "is untouched).")
    assert os.listdir(compile_dir) == ["train"]  # no temporary or retired directory
    assert {name: (directory / name).read_bytes() for name in os.listdir(directory)} == before


def test_loading_never_unpickles(tmp_path):
    program = ir.Program(mode="train", tensors=[], kernels=[], variables=[], inputs={}, outputs={})
    program.save(str(tmp_path))
    np.savez(tmp_path / ir.CONSTANTS_FILE, t0=np.array([object()], dtype=object))
    with pytest.raises(ValueError):
        ir.Program.load(str(tmp_path))


def test_another_fabric_on_the_same_system_name_is_refused(zoo_estimator, tmp_path):
    compile_dir = str(tmp_path / "compile")
    zoo_estimator("mlp", compile_dir=compile_dir, cs_config={"fabric": "WSE-2"}).compile(mlp.input_fn)
    with pytest.raises(ArtifactSystemMismatchError) as info:
        zoo_estimator("mlp", compile_dir=compile_dir, cs_config={"fabric": "WSE-1"}).compile(mlp.input_fn)
    assert "fabric 'WSE-2'" in str(info.value) and "fabric 'WSE-1'" in str(info.value)


def _custom_gradient_model_fn(features, labels, mode, params):
    """tf_helper's summary_layer and boundary_cast are tf.custom_gradient ops: TF names each one's gradient
    function by a process-wide counter, anew each time model_fn runs."""
    hidden = tf_helper.summary_layer(tf.compat.v1.layers.dense(features, 8, name="hidden"))
    logits = tf.compat.v1.layers.dense(tf_helper.boundary_cast(hidden), 5, name="logits")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    step = tf.compat.v1.train.get_global_step()
    return CSEstimatorSpec(mode, loss=loss,
                           train_op=tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step))


def test_a_model_with_custom_gradients_reuses_its_artifact(tmp_path):
    def compiled():
        est = CerebrasEstimator(_custom_gradient_model_fn, model_dir=str(tmp_path / "model"),
                                compile_dir=str(tmp_path / "compile"), config=CSRunConfig(cs_ip="localhost:9000"),
                                params={})
        return est.compile(mlp.input_fn)

    first, second = compiled(), compiled()
    assert second.reused and second.graph_hash == first.graph_hash
