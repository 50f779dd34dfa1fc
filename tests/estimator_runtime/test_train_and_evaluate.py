"""estimator.runtime's train_and_evaluate (local mode): evaluations follow checkpoints and throttling, exporters run.

Runs on every supported TensorFlow; where tf.estimator exists (TF <= 2.15)
the same run is repeated with tf.estimator.train_and_evaluate and compared
(final metrics, number and steps of the evaluations, export directories).
"""
from __future__ import annotations

import json
import os
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import runtime_models as models
from estimator import api as estimator_api, runtime
from estimator.runtime import Estimator, RunConfig

try:
    from tensorflow_estimator import estimator as tfe
except ImportError:  # TF >= 2.16
    tfe = None

needs_tf_estimator = pytest.mark.skipif(tfe is None, reason="tf.estimator is not installed (TF >= 2.16)")


@pytest.fixture(autouse=True)
def _no_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)


def _receiver_fn(api: Any) -> Any:
    def serving_input_receiver_fn():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        return api.export.TensorServingInputReceiver(x, {"x": x})

    return serving_input_receiver_fn


class _CountEvaluations(tf.compat.v1.train.SessionRunHook):
    """Counts the evaluations it runs in (an eval hook: `begin` runs once per evaluation)."""

    def __init__(self) -> None:
        self.count = 0

    def begin(self) -> None:
        self.count += 1


def _run(api: Any, model_dir: str, max_steps: int = 10, throttle_secs: float = 0, save_checkpoints_steps: int = 4,
         exporters: Any = "latest+final") -> tuple[Any, int, list[int]]:
    """train_and_evaluate with `api`: (its result, how many evaluations ran, the steps they were at)."""
    estimator = api.Estimator(models.dense_model_fn(api, metrics=True), model_dir=model_dir, params={"lr": 0.05},
                              config=api.RunConfig(tf_random_seed=11, save_checkpoints_steps=save_checkpoints_steps))
    if exporters == "latest+final":
        exporters = [api.LatestExporter("latest", _receiver_fn(api), exports_to_keep=2),
                     api.FinalExporter("final", _receiver_fn(api))]
    counter = _CountEvaluations()
    result = api.train_and_evaluate(
        estimator, api.TrainSpec(models.input_fn(), max_steps=max_steps),
        api.EvalSpec(models.input_fn(repeat=False), steps=2, hooks=[counter], exporters=exporters,
                     throttle_secs=throttle_secs))
    eval_steps = sorted(step for step, _ in models.event_tags(os.path.join(model_dir, "eval")).get("loss", []))
    return result, counter.count, eval_steps


def _exports(model_dir: str, name: str) -> list[str]:
    path = os.path.join(model_dir, "export", name)
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def test_local_run_evaluates_every_checkpoint_and_exports(tmp_path):
    model_dir = str(tmp_path / "model")
    (metrics, exports), count, eval_steps = _run(runtime, model_dir)
    assert (count, eval_steps) == (3, [4, 8, 10])  # each checkpoint after the first, and the final one
    assert metrics["global_step"] == 10 and set(metrics) == {"global_step", "loss", "mae", "rmse", "prediction/mean"}
    estimator = Estimator(models.dense_model_fn(runtime, metrics=True), model_dir=model_dir, params={"lr": 0.05})
    assert metrics == estimator.evaluate(models.input_fn(repeat=False), steps=2)
    latest, final = _exports(model_dir, "latest"), _exports(model_dir, "final")
    assert len(latest) == 2 and len(final) == 1  # exports_to_keep=2 of three; the final export once
    assert [tf.compat.as_str_any(e) for e in exports] == [os.path.join(model_dir, "export", "latest", latest[-1]),
                                                         os.path.join(model_dir, "export", "final", final[0])]
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta_graph = tf.compat.v1.saved_model.load(session, ["serve"], tf.compat.as_str_any(exports[1]))
        sig = meta_graph.signature_def["serving_default"]
        served = session.run(sig.outputs["y"].name, {sig.inputs["x"].name: models.X})
    predicted = np.concatenate([b["y"] for b in estimator.predict(models.predict_input_fn,
                                                                  yield_single_examples=False)])
    np.testing.assert_allclose(served, predicted, rtol=1e-6, atol=1e-6)


def test_throttle_secs_skips_evaluations_but_not_the_last(tmp_path):
    _, count, eval_steps = _run(runtime, str(tmp_path / "model"), throttle_secs=600, exporters=None)
    assert (count, eval_steps) == (2, [4, 10])


def test_nothing_to_train_returns_none(tmp_path):
    model_dir = str(tmp_path / "model")
    _run(runtime, model_dir, max_steps=4, exporters=None)
    (metrics, exports), count, _ = _run(runtime, model_dir, max_steps=4, exporters=None)
    assert (metrics, exports, count) == (None, None, 0)


def test_resumed_run_evaluates_only_new_checkpoints(tmp_path):
    model_dir = str(tmp_path / "model")
    _run(runtime, model_dir, max_steps=4, exporters=None)
    (metrics, _), count, eval_steps = _run(runtime, model_dir, max_steps=8, exporters=None)
    assert count == 1 and metrics["global_step"] == 8 and eval_steps == [4, 8]


def test_train_and_evaluate_is_recognised_by_the_estimator_layer(tmp_path):
    seen = []

    class Probe(tf.compat.v1.train.SessionRunHook):
        def begin(self):
            seen.append(estimator_api.called_from_train_and_evaluate())

    estimator = Estimator(models.dense_model_fn(runtime), model_dir=str(tmp_path), params={},
                          config=RunConfig(save_checkpoints_steps=2))
    runtime.train_and_evaluate(estimator, runtime.TrainSpec(models.input_fn(), max_steps=2, hooks=[Probe()]),
                               runtime.EvalSpec(models.input_fn(repeat=False), steps=1, hooks=[Probe()]))
    assert seen == [True, True]
    Probe().begin()
    assert seen[-1] is False


def test_a_single_chief_trains_without_evaluating(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["localhost:2222"]},
                                                "task": {"type": "chief", "index": 0}}))
    counter = _CountEvaluations()
    estimator = Estimator(models.dense_model_fn(runtime), model_dir=str(tmp_path), params={})
    result = runtime.train_and_evaluate(estimator, runtime.TrainSpec(models.input_fn(), max_steps=3),
                                        runtime.EvalSpec(models.input_fn(repeat=False), hooks=[counter]))
    assert result is None and counter.count == 0  # None in a cluster, as tf.estimator returns
    assert estimator.get_variable_value("global_step") == 3


def test_a_single_master_trains_and_evaluates_as_a_local_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"master": ["localhost:2222"]},
                                                "task": {"type": "master", "index": 0}}))
    model_dir = str(tmp_path / "model")
    result, count, eval_steps = _run(runtime, model_dir, exporters=None)
    assert result is None and (count, eval_steps) == (3, [4, 8, 10])


def test_the_evaluator_evaluates_new_checkpoints_until_max_steps(tmp_path, monkeypatch):
    model_dir = str(tmp_path / "model")
    _run(runtime, model_dir, max_steps=4, exporters=None)  # a checkpoint at step 4, evaluated once here
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["localhost:2222"]},
                                                "task": {"type": "evaluator", "index": 0}}))
    estimator = Estimator(models.dense_model_fn(runtime, metrics=True), model_dir=model_dir, params={"lr": 0.05})
    counter = _CountEvaluations()
    thread_errors: list[BaseException] = []

    def evaluate() -> None:
        try:
            runtime.train_and_evaluate(estimator, runtime.TrainSpec(models.input_fn(), max_steps=8), runtime.EvalSpec(
                models.input_fn(repeat=False), steps=2, hooks=[counter], start_delay_secs=0, throttle_secs=1,
                exporters=runtime.FinalExporter("final", _receiver_fn(runtime))))
        except BaseException as e:  # reported below, in the test's thread
            thread_errors.append(e)

    evaluator = threading.Thread(target=evaluate)
    evaluator.start()
    while counter.count == 0 and evaluator.is_alive():  # it evaluates step 4 first
        time.sleep(0.1)
    monkeypatch.delenv("TF_CONFIG")
    Estimator(models.dense_model_fn(runtime, metrics=True), model_dir=model_dir, params={"lr": 0.05},
              config=RunConfig(save_checkpoints_steps=100)).train(models.input_fn(), max_steps=8)
    evaluator.join(timeout=120)
    assert not evaluator.is_alive() and not thread_errors, thread_errors
    assert counter.count == 2  # step 4, then step 8 (max_steps): it stops
    assert len(_exports(model_dir, "final")) == 1


_BAD_SPECS = [
    (lambda api: api.TrainSpec(None), TypeError, "`input_fn` must be callable, given: None"),
    (lambda api: api.TrainSpec(models.input_fn(), max_steps=0), ValueError, "Must specify max_steps > 0, given: 0"),
    (lambda api: api.TrainSpec(models.input_fn(), hooks=[1]), TypeError,
     "All hooks must be `SessionRunHook` instances, given: 1"),
    (lambda api: api.TrainSpec(models.input_fn(), saving_listeners=[1]), TypeError,
     "All saving_listeners must be `CheckpointSaverListener` instances, given: 1"),
    (lambda api: api.EvalSpec(models.input_fn(), steps=0), ValueError, "Must specify steps > 0, given: 0"),
    (lambda api: api.EvalSpec(models.input_fn(), name=1), TypeError, "`name` must be string, given: 1"),
    (lambda api: api.EvalSpec(models.input_fn(), start_delay_secs=-1), ValueError,
     "Must specify start_delay_secs >= 0, given: -1"),
    (lambda api: api.EvalSpec(models.input_fn(), throttle_secs=-1), ValueError,
     "Must specify throttle_secs >= 0, given: -1"),
    (lambda api: api.EvalSpec(models.input_fn(), exporters=[1]), TypeError,
     "`exporters` must be an Exporter, an iterable of Exporter, or `None`, found [1]."),
    (lambda api: api.EvalSpec(models.input_fn(), exporters=[api.FinalExporter("a", _receiver_fn(api)),
                                                            api.LatestExporter("a", _receiver_fn(api))]),
     ValueError, "`exporters` must have unique names. Such a name cannot be `None`. All exporter names: ['a', 'a']"),
    (lambda api: api.train_and_evaluate(None, api.TrainSpec(models.input_fn()), None), TypeError,
     "`eval_spec` must have type `tf.estimator.EvalSpec`. Got: <class 'NoneType'>"),
    (lambda api: api.train_and_evaluate(None, api.TrainSpec(models.input_fn()), api.EvalSpec(models.input_fn())),
     TypeError, "`estimator` must have type `tf.estimator.Estimator`. Got: <class 'NoneType'>"),
    (lambda api: api.LatestExporter("a", _receiver_fn(api), exports_to_keep=0), ValueError,
     "`exports_to_keep`, if provided, must be positive number"),
]


@pytest.mark.parametrize("case", range(len(_BAD_SPECS)))
def test_spec_checks_match_tf_estimator(case):
    make, error, message = _BAD_SPECS[case]
    for api in [runtime] + ([tfe] if tfe is not None else []):
        with pytest.raises(error) as raised:
            make(api)
        assert str(raised.value) == message, api


@needs_tf_estimator
@pytest.mark.parametrize("throttle_secs", [0, 600])
def test_same_evaluations_and_exports_as_tf_estimator(tmp_path, throttle_secs):
    runs = {}
    for name, api in (("runtime", runtime), ("tf.estimator", tfe)):
        model_dir = str(tmp_path / name)
        (metrics, exports), count, eval_steps = _run(api, model_dir, max_steps=10, throttle_secs=throttle_secs)
        runs[name] = (metrics, len(exports), count, eval_steps, len(_exports(model_dir, "latest")),
                      len(_exports(model_dir, "final")))
    ours, theirs = runs["runtime"], runs["tf.estimator"]
    assert ours[1:] == theirs[1:]
    assert ours[0].keys() == theirs[0].keys()
    for key in theirs[0]:
        np.testing.assert_allclose(ours[0][key], theirs[0][key], rtol=1e-6)


def test_best_exporter_exports_when_the_loss_improves(tmp_path):
    counts = {}
    for name, api in [("runtime", runtime)] + ([("tf.estimator", tfe)] if tfe is not None else []):
        model_dir = str(tmp_path / name)
        best = api.BestExporter(name="best", serving_input_receiver_fn=_receiver_fn(api), exports_to_keep=None)
        (metrics, exports), count, _ = _run(api, model_dir, max_steps=12, exporters=[best])
        losses = [loss for _, loss in sorted(models.event_tags(os.path.join(model_dir, "eval"))["loss"])]
        improved = sum(1 for i, loss in enumerate(losses) if i == 0 or loss < min(losses[:i]))
        assert len(_exports(model_dir, "best")) == improved and count == len(losses) == 3
        counts[name] = (improved, exports[0] is None)
    assert len(set(counts.values())) == 1, counts


@needs_tf_estimator
def test_tf_estimators_exporters_run_on_the_runtime(tmp_path):
    """A TF 2.15 script's tf.estimator exporters and receivers, given to the runtime unchanged."""
    model_dir = str(tmp_path / "model")
    (_, exports), _, _ = _run(runtime, model_dir, exporters=[tfe.LatestExporter("latest", _receiver_fn(tfe))])
    assert len(exports) == 1 and len(_exports(model_dir, "latest")) == 3
