"""The Model Zoo's constructs, all in one zoo-style model, through the public API (issue 11).

zoo_bert_like.py feeds a features dict with masked-LM positions from `input_fn(params,
input_context=None)`, schedules the learning rate with a tf.case over global_step, wraps Adam in TF's
loss-scale optimizer with the model's own dynamic scale, writes summaries in model_fn and evaluates
through a nested host_call with None. Each variant must validate, compile, train on the simulated
WSE, write its summaries, and leave a checkpoint that plain TensorFlow evaluates on CPU; in float32
numerics the system must match tf.estimator step for step.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import glob
import shutil

import numpy as np
import pytest
import tensorflow as tf

from estimator import Estimator
import cerebras_tf
from cerebras_tf import CerebrasEstimator, CSRunConfig, set_default_tf_config

import zoo_bert_like as zoo

CS_IP = "localhost:9000"
STEPS = 24
SUMMARY_STEPS = 6
VARIANTS = [
    pytest.param({"loss_scaling": "tf_dynamic"}, id="tf-loss-scale"),
    pytest.param({"loss_scaling": "cs_dynamic", "disable_nsp": True}, id="counting-loss-scale-no-nsp"),
]


@pytest.fixture(autouse=True)
def _tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    set_default_tf_config()


def _estimator(model_dir, params: dict, cs_ip: str | None = CS_IP) -> CerebrasEstimator:
    config = CSRunConfig(cs_ip=cs_ip, tf_random_seed=1, save_summary_steps=SUMMARY_STEPS,
                         save_checkpoints_steps=1000, log_step_count_steps=SUMMARY_STEPS)
    return CerebrasEstimator(zoo.model_fn, model_dir=str(model_dir), config=config,
                             params={**zoo.DEFAULT_PARAMS, **params})


def _summaries(model_dir) -> dict[str, dict[int, float]]:
    """tag -> {step: value} of the scalar summaries written directly in model_dir."""
    found: dict[str, dict[int, float]] = {}
    for path in glob.glob(os.path.join(str(model_dir), "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    found.setdefault(value.tag, {})[event.step] = value.simple_value
    return found


@pytest.mark.parametrize("params", VARIANTS)
def test_the_zoo_constructs_validate_and_compile(tmp_path, params):
    estimator = _estimator(tmp_path, params)
    validated = estimator.compile(zoo.train_input_fn, validate_only=True)
    assert validated.program is None or validated.program.inputs
    compiled = estimator.compile(zoo.train_input_fn)
    inputs = set(compiled.program.inputs)
    assert {"features/input_ids", "features/masked_lm_positions", "features/masked_lm_weights"} <= inputs
    assert ("labels" in inputs) is (not params.get("disable_nsp", False))
    assert any(key.startswith("summary/") for key in compiled.program.outputs)


@pytest.mark.parametrize("params", VARIANTS)
def test_training_on_the_system_matches_tf_estimator_and_cpu_evaluates_its_checkpoint(
        tmp_path, params, float32_numerics):
    system = _estimator(tmp_path / "system", params)
    system.train(zoo.train_input_fn, max_steps=STEPS)
    cpu = _estimator(tmp_path / "cpu", params, cs_ip=None)
    cpu.train(zoo.train_input_fn, max_steps=STEPS)

    names = set(cpu.get_variable_names())
    assert names == set(system.get_variable_names())
    assert {"current_loss_scale", "global_step", "bert/embeddings/word_embeddings/Adam"} <= names
    for name in sorted(names):
        np.testing.assert_allclose(system.get_variable_value(name), cpu.get_variable_value(name),
                                   rtol=2e-5, atol=2e-6, err_msg=name)
    assert system.get_variable_value("global_step") == STEPS

    # The model's summaries reach TensorBoard from the system as from the Estimator: same tags, same steps.
    on_system, on_cpu = _summaries(tmp_path / "system"), _summaries(tmp_path / "cpu")
    model_tags = {tag for tag in on_cpu if tag.startswith("train/")}
    assert {"train/cost", "train/cost_masked_lm", "train/lr", "train/loss_scale",
            "train/unclipped_grad_norm"} <= model_tags
    for tag in sorted(model_tags):
        assert sorted(on_system.get(tag, {})) == sorted(on_cpu[tag]), tag
        np.testing.assert_allclose([on_system[tag][s] for s in sorted(on_cpu[tag])],
                                   [on_cpu[tag][s] for s in sorted(on_cpu[tag])], rtol=1e-4, err_msg=tag)

    # Evaluation: on the system through the nested host_call, and plain TF on CPU over the same checkpoint.
    cerebras_tf.release_system()
    steps = zoo.DEFAULT_PARAMS["num_examples"] // zoo.DEFAULT_PARAMS["batch_size"]
    on_wafer = system.evaluate(zoo.eval_input_fn, steps=steps, use_cs=True)
    plain = Estimator(zoo.model_fn, model_dir=str(tmp_path / "system"),
                      params={**zoo.DEFAULT_PARAMS, **params}).evaluate(zoo.eval_input_fn)
    on_cpu_metrics = system.evaluate(zoo.eval_input_fn, use_cs=False)  # host_call metrics as eval_metric_ops
    np.testing.assert_allclose(plain["loss"], on_cpu_metrics["loss"], rtol=1e-6)
    assert on_wafer["global_step"] == on_cpu_metrics["global_step"] == STEPS
    assert set(on_wafer) == set(on_cpu_metrics)
    for key in on_cpu_metrics:
        np.testing.assert_allclose(on_wafer[key], on_cpu_metrics[key], rtol=1e-5, err_msg=key)

    # Plain TF training resumes from the system's checkpoint (it holds every global variable).
    shutil.copytree(tmp_path / "system", tmp_path / "resumed", ignore=shutil.ignore_patterns("events.*"))
    resumed = _estimator(tmp_path / "resumed", params, cs_ip=None)
    resumed.train(zoo.train_input_fn, steps=2)
    assert resumed.get_variable_value("global_step") == STEPS + 2


def test_training_in_half_precision_keeps_the_models_own_loss_scale(tmp_path):
    """float16 numerics with the model's own dynamic scale: the scale variable is the model's, and it moved."""
    params = {"loss_scaling": "tf_dynamic", "initial_loss_scale": 2.0 ** 15}
    system = _estimator(tmp_path, params)
    system.train(zoo.train_input_fn, max_steps=STEPS)
    scale = float(system.get_variable_value("current_loss_scale"))
    assert scale != 2.0 ** 15 and scale > 0
    assert not any(name.startswith("amp/") for name in system.get_variable_names())
    metrics = system.evaluate(zoo.eval_input_fn, use_cs=False)
    assert np.isfinite(metrics["loss"])
