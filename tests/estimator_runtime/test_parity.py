"""estimator.runtime against tf.estimator in one process (TF <= 2.15): same model, same seeds, same results.

Skipped where tf.estimator is absent (TF >= 2.16).
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
from typing import Any, Callable

import numpy as np
import pytest
import tensorflow as tf

pytest.importorskip("tensorflow_estimator",
                    reason="parity with tf.estimator needs tensorflow-estimator (the Python 3.11 / TF 2.15 stack)")
from tensorflow_estimator import estimator as tfe  # noqa: E402

from estimator import runtime  # noqa: E402
import runtime_models as models  # noqa: E402

SEED = 42


@dataclasses.dataclass
class Run:
    """Everything one Estimator produced for a model: what the parity tests compare."""

    model_dir: str
    variables: dict[str, np.ndarray]
    files: list[str]
    metrics: dict[str, Any]
    predictions: list[dict[str, np.ndarray]]
    batches: list[dict[str, np.ndarray]]
    log: list[str]
    graph: Any


def _run(api: Any, model_dir: str, model_fn_factory: Callable[..., Any], train_input: Callable[..., Any],
         eval_input: Callable[..., Any], predict_input: Callable[..., Any], **config: Any) -> Run:
    settings = dict(tf_random_seed=SEED, save_summary_steps=3, log_step_count_steps=4, save_checkpoints_steps=5,
                    keep_checkpoint_max=3)
    settings.update(config)
    estimator = api.Estimator(model_fn_factory(api), model_dir=model_dir, config=api.RunConfig(**settings),
                              params={"lr": 0.05})
    with models.tf_log_lines() as log:
        estimator.train(train_input, max_steps=12)
        estimator.train(train_input, steps=2)
        metrics = estimator.evaluate(eval_input, steps=3)
        predictions = list(estimator.predict(predict_input))
        batches = list(estimator.predict(predict_input, predict_keys=["y"], yield_single_examples=False))
    graph = tf.compat.v1.GraphDef()
    with open(os.path.join(model_dir, "graph.pbtxt")) as f:
        from google.protobuf import text_format
        text_format.Merge(f.read(), graph)
    return Run(
        model_dir=model_dir,
        variables={name: estimator.get_variable_value(name) for name in estimator.get_variable_names()},
        files=sorted(name for name in os.listdir(model_dir) if not name.startswith("events.out.tfevents")),
        metrics=metrics,
        predictions=predictions,
        batches=batches,
        log=list(log),
        graph=graph,
    )


def _both(tmp_path: Any, model_fn_factory: Callable[..., Any], train_input: Callable[..., Any],
          eval_input: Callable[..., Any], predict_input: Callable[..., Any] = models.predict_input_fn,
          **config: Any) -> tuple[Run, Run]:
    theirs = _run(tfe, str(tmp_path / "tf_estimator"), model_fn_factory, train_input, eval_input, predict_input,
                  **config)
    ours = _run(runtime, str(tmp_path / "runtime"), model_fn_factory, train_input, eval_input, predict_input,
                **config)
    return theirs, ours


def _assert_same(theirs: Run, ours: Run) -> None:
    assert ours.files == theirs.files
    assert sorted(ours.variables) == sorted(theirs.variables)
    for name, value in theirs.variables.items():
        np.testing.assert_array_equal(ours.variables[name], value, err_msg=name)
    assert ours.metrics.keys() == theirs.metrics.keys()
    for key, value in theirs.metrics.items():
        assert ours.metrics[key] == value, key
        assert type(ours.metrics[key]) is type(value), key
    assert len(ours.predictions) == len(theirs.predictions) == len(models.X)
    for mine, reference in zip(ours.predictions, theirs.predictions):
        assert mine.keys() == reference.keys()
        for key in reference:
            np.testing.assert_array_equal(mine[key], reference[key])
    assert len(ours.batches) == len(theirs.batches) == 4
    for mine, reference in zip(ours.batches, theirs.batches):
        assert list(mine) == list(reference) == ["y"]
        np.testing.assert_array_equal(mine["y"], reference["y"])
    assert [loss for loss, _ in models.loss_lines(ours.log)] == [loss for loss, _ in models.loss_lines(theirs.log)]
    ours_steps, theirs_steps = ([step for _, step in models.loss_lines(run.log)] for run in (ours, theirs))
    assert len(ours_steps) == len(theirs_steps)
    assert all(abs(a - b) <= 1 for a, b in zip(ours_steps, theirs_steps))  # see models.assert_logged_steps
    assert [(n.name, n.op) for n in ours.graph.node] == [(n.name, n.op) for n in theirs.graph.node]


def _assert_summaries(run: Run, metric_names: set[str]) -> None:
    train_tags = models.event_tags(run.model_dir)
    assert {"loss", "global_step/sec"} <= set(train_tags)
    eval_tags = models.event_tags(os.path.join(run.model_dir, "eval"))
    assert metric_names | {"loss"} <= set(eval_tags)
    assert "checkpoint_path" in eval_tags


def test_dense_layers_model_matches_tf_estimator(tmp_path):
    theirs, ours = _both(tmp_path, models.dense_model_fn, models.input_fn(), models.input_fn(repeat=False))
    _assert_same(theirs, ours)
    assert theirs.files == ["checkpoint", "eval", "graph.pbtxt"] + [
        f"model.ckpt-{step}.{ext}" for step in (10, 12, 14) for ext in ("data-00000-of-00001", "index", "meta")]
    assert sorted(theirs.variables) == ["global_step", "hidden/bias", "hidden/kernel", "output/bias",
                                        "output/kernel"]
    assert theirs.metrics["global_step"] == 14
    for run in (ours, theirs):
        models.assert_logged_steps(run.log, [0, 4, 8, 12])  # the second train() logs its first step
    assert any(line.startswith("Saving dict for global step 14: global_step = 14, loss = ") for line in ours.log)
    assert ours.log.count("Skipping training since max_steps has already saved.") == 0
    _assert_summaries(ours, set())
    _assert_summaries(theirs, set())
    # Summaries every 3 steps from the first. Not compared step by step: TF's SummarySaverHook reads the global
    # step in the same session.run as the train_op increments it (unordered), so under load both Estimators
    # may shift a summary by a step.
    ours_steps, theirs_steps = ([step for step, _ in models.event_tags(run.model_dir)["loss"]]
                                for run in (ours, theirs))
    assert ours_steps[0] == theirs_steps[0] == 1
    assert abs(len(ours_steps) - len(theirs_steps)) <= 1


def test_dict_features_with_dropout_and_adam_match_tf_estimator(tmp_path):
    def factory(api):
        return models.dense_model_fn(api, dropout=0.3, optimizer="adam")

    theirs, ours = _both(tmp_path, factory, models.dict_input_fn(), models.dict_input_fn(repeat=False),
                         predict_input=lambda: tf.data.Dataset.from_tensor_slices(
                             {"a": models.X[:, :2], "b": models.X[:, 2:]}).batch(models.BATCH))
    _assert_same(theirs, ours)
    assert any(name.endswith("/Adam") for name in ours.variables)  # optimizer slots are checkpointed too


def test_eval_metric_ops_match_tf_estimator(tmp_path):
    def factory(api):
        return models.dense_model_fn(api, metrics=True, layers=False)

    theirs, ours = _both(tmp_path, factory, models.input_fn(shuffle=True), models.input_fn(repeat=False),
                         save_checkpoints_steps=None, save_checkpoints_secs=3600)
    _assert_same(theirs, ours)
    assert set(ours.metrics) == {"loss", "global_step", "mae", "rmse", "prediction/mean"}
    assert ours.files[-3:] == ["model.ckpt-14.data-00000-of-00001", "model.ckpt-14.index", "model.ckpt-14.meta"]
    _assert_summaries(ours, {"mae", "rmse", "prediction/mean"})
    eval_ours = models.event_tags(os.path.join(ours.model_dir, "eval"))
    eval_theirs = models.event_tags(os.path.join(theirs.model_dir, "eval"))
    assert eval_ours == eval_theirs


def test_runtime_resumes_a_tf_estimator_model_dir(tmp_path):
    """A model_dir tf.estimator wrote trains on under the runtime exactly as under tf.estimator."""
    config = dict(tf_random_seed=SEED, save_checkpoints_steps=5)
    factory = models.dense_model_fn
    for api, name in ((tfe, "a"), (tfe, "b")):
        api.Estimator(factory(api), model_dir=str(tmp_path / name), config=api.RunConfig(**config),
                      params={}).train(models.input_fn(), max_steps=5)
    continued = {}
    for api, name in ((tfe, "a"), (runtime, "b")):
        estimator = api.Estimator(factory(api), model_dir=str(tmp_path / name), config=api.RunConfig(**config),
                                  params={})
        estimator.train(models.input_fn(), max_steps=9)
        continued[name] = {n: estimator.get_variable_value(n) for n in estimator.get_variable_names()}
    for name, value in continued["a"].items():
        np.testing.assert_array_equal(continued["b"][name], value, err_msg=name)
    assert continued["b"]["global_step"] == 9
