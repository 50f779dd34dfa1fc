"""The FC digits example, run in-process through its public entry points."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import tensorflow as tf

from cerebras_tf import errors
from examples.fc_digits import run as example
from examples.fc_digits.data import eval_input_fn, train_input_fn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(name="params")
def params_fixture():
    params = example.load_params(example.DEFAULT_PARAMS)
    params["runconfig"]["max_steps"] = 300
    return params


def test_cpu_train_and_eval_learns_the_digits(params, tmp_path):
    metrics = example.run("train_and_eval", params=params, model_dir=str(tmp_path))
    assert metrics["global_step"] == 300
    assert metrics["accuracy"] > 0.85  # chance is 0.1; ~0.95 is typical after 300 steps
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-300")


def test_training_on_the_simulated_wse_then_evaluating_on_cpu(params, tmp_path):
    example.run("train", params=params, model_dir=str(tmp_path), cs_ip="localhost:9000")
    metrics = example.run("eval", params=params, model_dir=str(tmp_path))
    assert metrics["global_step"] == 300
    assert metrics["accuracy"] > 0.85


def test_validate_only_on_a_cs_system_passes_and_writes_nothing(params, tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    model_dir = tmp_path / "model"
    assert example.run(params=params, model_dir=str(model_dir), cs_ip="localhost:9000", validate_only=True) is None
    assert not model_dir.exists()
    assert "TF_CONFIG" in os.environ  # the example sets the default, as Cerebras scripts do


def test_compile_only_writes_the_artifact_and_prints_the_placement(params, tmp_path, capsys):
    example.run(params=params, model_dir=str(tmp_path), cs_ip="localhost:9000", compile_only=True)
    assert (tmp_path / "cs_compile" / "train" / "program.json").exists()
    assert (tmp_path / "cs_compile" / "train" / "report.json").exists()
    printed = capsys.readouterr().out
    assert "Pipelined placement on WSE-2" in printed and "fc_output" in printed


def test_train_and_eval_on_a_cs_system_is_refused_before_anything_runs(params, tmp_path):
    with pytest.raises(errors.CerebrasError, match="--mode train, then --mode eval|--mode train with --cs_ip"):
        example.run("train_and_eval", params=params, model_dir=str(tmp_path / "m"), cs_ip="localhost:9000")
    assert not (tmp_path / "m").exists()


def test_the_pipelines_have_a_fixed_batch_and_the_training_one_repeats(params):
    with tf.Graph().as_default():
        train = train_input_fn(params)
        evaluation = eval_input_fn(params)
        batch = params["train_input"]["batch_size"]
        assert train.element_spec[0].shape.as_list() == [batch, 64]
        assert evaluation.element_spec[1].shape.as_list() == [params["eval_input"]["batch_size"]]
        cardinality = tf.data.experimental.cardinality(train)
        with tf.compat.v1.Session() as session:
            assert session.run(cardinality) == tf.data.INFINITE_CARDINALITY


def test_command_line_validate_only_exits_zero_and_reports_cerebras_errors_without_traceback(tmp_path):
    command = [sys.executable, "-m", "examples.fc_digits.run", "--cs_ip", "localhost:9000",
               "--model_dir", str(tmp_path / "m")]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    ok = subprocess.run(command + ["--validate_only"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "passed every CS-system check" in ok.stdout
    refused = subprocess.run(command + ["--mode", "train_and_eval"], cwd=ROOT, env=env, capture_output=True,
                             text=True)
    assert refused.returncode == 1
    assert "train_and_eval does not run on the CS system" in refused.stderr
    assert "Traceback" not in refused.stderr
