"""The FC digits example, run in-process through its public entry points (and once as a command)."""
from __future__ import annotations

import collections
import os
import re
import shlex
import subprocess
import sys
from typing import Any, Callable

import pytest
import tensorflow as tf

from cerebras_tf import errors
from examples.fc_digits import run as example
from examples.fc_digits.data import eval_input_fn, train_input_fn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CS_IP = "localhost:9000"
STEPS = 300
# Observed after 300 steps (no fixed seed): 0.97-0.98 on CPU, 0.96-0.99 on the simulated WSE; chance is 0.1.
MIN_ACCURACY = 0.9


@pytest.fixture(autouse=True)
def _restore_tf_config():
    """The example sets a default TF_CONFIG with a cs_ip; do not leak it into other tests."""
    saved = os.environ.get("TF_CONFIG")
    yield
    if saved is None:
        os.environ.pop("TF_CONFIG", None)
    else:
        os.environ["TF_CONFIG"] = saved


@pytest.fixture(name="params")
def params_fixture() -> dict[str, Any]:
    params = example.load_params(example.DEFAULT_PARAMS)
    params["runconfig"]["max_steps"] = STEPS
    return params


def test_cpu_train_and_eval_learns_the_digits(params, tmp_path, capsys):
    metrics = example.run("train_and_eval", params=params, model_dir=str(tmp_path))
    assert metrics["global_step"] == STEPS
    assert metrics["accuracy"] > MIN_ACCURACY
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith(f"model.ckpt-{STEPS}")
    printed = capsys.readouterr().out
    assert f"Training on CPU/GPU (plain TensorFlow) up to global step {STEPS}" in printed
    assert "Evaluation: accuracy=" in printed


def test_a_tf_random_seed_makes_cpu_runs_reproducible(params, tmp_path):
    params["runconfig"]["tf_random_seed"] = 7
    first, second = (example.run("train_and_eval", params=params, model_dir=str(tmp_path / name), max_steps=100)
                     for name in ("a", "b"))
    assert first["loss"] == second["loss"] and first["accuracy"] == second["accuracy"]


def test_training_on_the_simulated_wse_then_evaluating_on_cpu(params, tmp_path):
    assert example.run("train", params=params, model_dir=str(tmp_path), cs_ip=CS_IP) is None
    metrics = example.run("eval", params=params, model_dir=str(tmp_path))
    assert metrics["global_step"] == STEPS
    assert metrics["accuracy"] > MIN_ACCURACY


def test_validate_only_on_a_cs_system_passes_and_writes_nothing(params, tmp_path, capsys):
    os.environ.pop("TF_CONFIG", None)
    model_dir = tmp_path / "model"
    assert example.run(params=params, model_dir=str(model_dir), cs_ip=CS_IP, validate_only=True) is None
    assert not model_dir.exists()
    assert "passed every CS-system check" in capsys.readouterr().out
    assert "TF_CONFIG" in os.environ  # the example sets the default, as Cerebras scripts do


def test_compile_only_writes_the_artifact_and_prints_a_summary(params, tmp_path, capsys):
    example.run(params=params, model_dir=str(tmp_path), cs_ip=CS_IP, compile_only=True)
    for name in ("program.json", "report.json", "report.txt", "placement.png"):
        assert (tmp_path / "cs_compile" / "train" / name).exists()
    assert "Pipelined placement on WSE-2" in (tmp_path / "cs_compile" / "train" / "report.txt").read_text()
    printed = capsys.readouterr().out  # the report itself is logged (once), not printed again
    assert re.search(r"Compiled \d+ kernels \(\d+ \+ \d+ precision casts\) to .*cs_compile/train \(built; ", printed)
    assert re.search(r"Estimated [\d,]+ samples/s on WSE-2 \(limited by host_io\)", printed), printed


def test_runconfig_params_reach_the_cs_rules_before_anything_is_written(params, tmp_path):
    params["runconfig"]["save_checkpoints_steps"] = 50  # below the CS system's lower bound
    model_dir = tmp_path / "model"
    with pytest.raises(errors.ConfigError, match="save_checkpoints_steps=50"):
        example.run("train", params=params, model_dir=str(model_dir), cs_ip=CS_IP)
    assert not model_dir.exists()


def test_train_and_eval_on_a_cs_system_is_refused_before_anything_runs(params, tmp_path):
    with pytest.raises(errors.UnsupportedModeError, match="--mode train with --cs_ip, then --mode eval"):
        example.run("train_and_eval", params=params, model_dir=str(tmp_path / "m"), cs_ip=CS_IP)
    assert not (tmp_path / "m").exists()


def _dataset_stages(input_fn: Callable[[dict[str, Any]], tf.data.Dataset], params: dict[str, Any]) -> list[str]:
    """The dataset op types input_fn creates, in pipeline order."""
    graph = tf.Graph()
    with graph.as_default():
        input_fn(params)
    return [op.type for op in graph.get_operations() if op.type.endswith(("Dataset", "DatasetV2", "DatasetV3"))]


@pytest.mark.parametrize(
    ("input_fn", "stages"),
    [
        (train_input_fn, ["TensorSlice", "Shuffle", "Repeat", "Map", "Batch", "Prefetch"]),
        (eval_input_fn, ["TensorSlice", "Map", "Batch", "Prefetch"]),
    ],
)
def test_the_pipelines_are_real_tf_data_pipelines(params, input_fn, stages):
    found = _dataset_stages(input_fn, params)
    assert len(found) == len(stages) and all(stage in op for stage, op in zip(stages, found)), found


def test_the_pipelines_have_a_fixed_batch_and_only_training_repeats(params):
    train, evaluation = train_input_fn(params), eval_input_fn(params)
    batch = params["train_input"]["batch_size"]
    assert train.element_spec == (tf.TensorSpec([batch, 64], tf.float32), tf.TensorSpec([batch], tf.int32))
    assert evaluation.element_spec[1].shape.as_list() == [params["eval_input"]["batch_size"]]
    assert train.cardinality().numpy() == tf.data.INFINITE_CARDINALITY
    assert evaluation.cardinality().numpy() == 360 // params["eval_input"]["batch_size"]  # one pass, remainder dropped
    images, _ = next(iter(evaluation))
    assert 0.0 <= images.numpy().min() and images.numpy().max() <= 1.0


def test_the_training_shuffle_has_no_fixed_seed(params):
    first, second = (next(iter(train_input_fn(params)))[1].numpy() for _ in range(2))
    assert first.tolist() != second.tolist()  # 64 labels in the same order twice: practically impossible


def _command(*flags: str, cpp_log_level: str = "3") -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": cpp_log_level}
    return subprocess.run([sys.executable, "-m", "examples.fc_digits.run", *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_command_line_validate_only_exits_zero(tmp_path):
    done = _command("--validate_only", "--cs_ip", CS_IP, "--model_dir", str(tmp_path / "m"))
    assert done.returncode == 0, done.stderr
    assert "passed every CS-system check" in done.stdout
    assert not (tmp_path / "m").exists()


def test_command_line_reports_cerebras_errors_without_a_traceback(tmp_path):
    done = _command("--mode", "train_and_eval", "--cs_ip", CS_IP, "--model_dir", str(tmp_path / "m"))
    assert done.returncode == 1
    assert "train_and_eval does not run on the CS system" in done.stderr
    assert "Traceback" not in done.stderr


def _readme_example_lines() -> dict[str, list[str]]:
    """The README's example command lines: their comment -> their flags."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        lines = [line for line in handle if line.startswith(".venv/bin/python -m examples.fc_digits.run")]
    assert lines, "README lists no example command lines"
    return {line.partition("#")[2].strip(): shlex.split(line, comments=True)[3:] for line in lines}


def test_the_readme_example_lines_run_where_their_comments_say():
    lines = _readme_example_lines()
    for comment, flags in lines.items():
        on_the_system = any(word in comment for word in ("WSE", "CS-system"))
        assert ("--cs_ip" in flags) == on_the_system, (comment, flags)
        if "--mode" in flags and flags[flags.index("--mode") + 1] == "train":
            assert "--steps" in flags, f"{comment!r} must train after ./dev example has reached its max_steps"
    assert {flag for flags in lines.values() for flag in flags if flag.startswith("--")} <= {
        "--" + name for name in example.FLAGS} | {"--help"}


def test_max_steps_already_reached_says_why_nothing_ran(params, tmp_path, capsys):
    example.run("train", params=params, model_dir=str(tmp_path), max_steps=100)
    capsys.readouterr()
    example.run("train", params=params, model_dir=str(tmp_path), max_steps=50)
    printed = capsys.readouterr().out
    assert f"Nothing to train: {tmp_path} already holds a checkpoint at global step 100, at or past " \
           "--max_steps 50. Pass --steps N" in printed
    assert "Training on" not in printed and "Trained to" not in printed
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-100")


# TensorFlow's C++ start-up lines (cuDNN/cuFFT/cuBLAS registration) are not ours to silence.
# TF 2.15 writes them as "2026-11-23 14:50:03.108907: I ...", TF 2.21 through absl's C++ log before it is
# initialised: "I0000 00:00:1795454925.932721    4869 port.cc:153] ..." after a "WARNING: All log messages
# before absl::InitializeLog() ..." line.
_CPP_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] |[IWEF]0000 00:00:\d+\.\d+ "
                       r"|WARNING: All log messages before absl::InitializeLog\(\) is called)")
_LOG_RECORD = re.compile(r"^(INFO|WARNING|ERROR):tensorflow:")
_ABSL_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]")
# What the three runs print beyond TF's C++ lines (~45 when this was written; ~490 before the log was
# de-duplicated, the Estimator's config dump put on one line and the compile report summarised): a budget,
# so a new flood fails here. One screen.
_LINE_BUDGET = 60


def test_dev_example_prints_each_message_once_and_the_report_once(tmp_path):
    """The three runs of `./dev example`, with the README's training line (200 steps) and a short evaluation."""
    model_dir = str(tmp_path / "model")
    train_flags = _readme_example_lines()["200 more steps on the simulated WSE"]
    runs = [_command(*flags, "--model_dir", model_dir, cpp_log_level="2") for flags in (
        ["--cs_ip", CS_IP, "--compile_only"], train_flags, ["--mode", "eval", "--eval_steps", "2"])]
    for done in runs:
        assert done.returncode == 0, done.stderr
    lines = [[line for line in (done.stdout + done.stderr).splitlines() if not _CPP_LINE.match(line)]
             for done in runs]
    everything = "\n".join(line for run in lines for line in run)
    assert "Training on the simulated CS system" in runs[1].stdout  # the README line does what it says

    assert not [line for line in everything.splitlines() if _ABSL_LINE.match(line)]  # no second (absl) copy
    for run in lines:
        records = collections.Counter(line for line in run if _LOG_RECORD.match(line))
        assert max(records.values()) == 1, [line for line, count in records.items() if count > 1]
    # the log has the report's summary once, the full report is in report.txt
    assert everything.count("INFO:tensorflow:Compiled 84 kernels (75 + 9 precision casts) to ") == 1
    assert everything.count("Full report (kernels by kind, inputs, layers, placement): ") == 1
    assert "cerebras-tf compile report" not in everything and "Pipelined placement on WSE-2" not in everything
    assert len(re.findall(r"^INFO:tensorflow:loss = [\d.e-]+, step = \d+ ", everything, re.M)) == 2  # every 100

    assert not [line for line in everything.splitlines() if "deprecat" in line.lower()]
    assert len(re.findall(r"^INFO:tensorflow:Using config: ", everything, re.M)) == 3  # one line per run
    assert "Instructions for updating" not in everything and "DeprecationWarning" not in everything
    assert sum(len(run) for run in lines) <= _LINE_BUDGET, everything
