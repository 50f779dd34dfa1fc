"""Behaviours tensorflow/estimator's own tests (benchmarks/upstream_estimator_tests.py) found the runtime lacked.

Each is tf.estimator 2.15's: subclasses may not redefine Estimator members; train_and_evaluate's checks of
what evaluate returns; the evaluator task waits out throttle_secs after each evaluation before it looks at
the step (also after the last); the training session is looked up where tf.estimator looks it up; and
train_and_evaluate takes tf.estimator's own estimators (TF 2.15). Runs on every supported TensorFlow.
"""
from __future__ import annotations

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest
import tensorflow as tf
from tensorflow.python.training import training as tf_training

import runtime_models as models
from estimator import runtime
from estimator.runtime import Estimator, RunConfig, training as training_lib


@pytest.fixture(autouse=True)
def _no_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)


def _model_fn(features, labels, mode):
    return models.dense_model_fn(runtime)(features, labels, mode, {"lr": 0.05})


def test_subclasses_may_add_members_but_not_redefine_the_estimators():
    class Redefines(Estimator):
        def predict(self, input_fn, predict_keys=None, hooks=None):
            return None

    class Extends(Estimator):
        def predict_proba(self):
            return None

        def latest_checkpoint(self):  # one of the members tf.estimator lets subclasses redefine
            return None

    with pytest.raises(ValueError, match=r"cannot override members of Estimator.*\['predict'\]"):
        Redefines(model_fn=_model_fn)
    Extends(model_fn=_model_fn)

    class LiftsTheGuard(Redefines):  # as estimator.EstimatorBase does for CerebrasEstimator
        def _assert_members_are_not_overridden(self):
            pass

    LiftsTheGuard(model_fn=_model_fn)
    from estimator.runtime import v1

    v1.Estimator(model_fn=_model_fn)  # its own export_savedmodel is no override


@pytest.mark.parametrize("metrics, error, message", [
    ({}, ValueError, "Internal error: `Estimator.evaluate` should never return empty metrics."),
    (123, TypeError, "`Estimator.evaluate` should return dict. Given <class 'int'>."),
    ({"loss": 1.0}, ValueError, "Internal error: `Estimator.evaluate` result should have `global_step` in result"),
])
def test_train_and_evaluate_checks_what_evaluate_returns(tmp_path, metrics, error, message):
    estimator = Estimator(_model_fn, model_dir=str(tmp_path), config=RunConfig(save_checkpoints_steps=2))
    estimator.evaluate = lambda **kwargs: metrics  # an instance attribute: no subclass needed
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        runtime.train_and_evaluate(estimator, runtime.TrainSpec(models.input_fn(), max_steps=4),
                                   runtime.EvalSpec(models.input_fn(repeat=False), throttle_secs=0))


def test_the_evaluator_waits_out_throttle_secs_after_its_last_evaluation(tmp_path, monkeypatch):
    model_dir = str(tmp_path)
    Estimator(_model_fn, model_dir=model_dir).train(models.input_fn(), max_steps=3)
    sleeps: list[float] = []
    monkeypatch.setattr(training_lib.time, "sleep", sleeps.append)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["localhost:2222"]},
                                                "task": {"type": "evaluator", "index": 0}}))
    estimator = Estimator(_model_fn, model_dir=model_dir)
    runtime.train_and_evaluate(estimator, runtime.TrainSpec(models.input_fn(), max_steps=3), runtime.EvalSpec(
        models.input_fn(repeat=False), steps=1, start_delay_secs=0, throttle_secs=1000))
    assert len(sleeps) == 1 and 990 < sleeps[0] <= 1000  # the checkpoint is at max_steps: one evaluation, one wait


def test_training_runs_the_session_tf_estimator_looks_up(tmp_path, monkeypatch):
    """tf.estimator's tests patch MonitoredTrainingSession in TF's training module to see what an Estimator
    trains with; the runtime takes it from there too."""
    calls = []

    def recording_session(**kwargs):
        calls.append(kwargs)
        raise RuntimeError("recorded")

    monkeypatch.setattr(tf_training, "MonitoredTrainingSession", recording_session)
    estimator = Estimator(_model_fn, model_dir=str(tmp_path),
                          config=RunConfig(save_summary_steps=7, log_step_count_steps=9))
    with pytest.raises(RuntimeError, match="recorded"):
        estimator.train(models.input_fn(), steps=1)
    assert (calls[0]["save_summaries_steps"], calls[0]["log_step_count_steps"]) == (7, 9)
    assert any(isinstance(hook, tf.compat.v1.train.NanTensorHook) for hook in calls[0]["hooks"])


def test_train_and_evaluate_takes_tf_estimators_estimators(tmp_path):
    try:
        from tensorflow_estimator import estimator as tfe
    except ImportError:
        pytest.skip("tf.estimator is not installed (TF >= 2.16)")
    estimator = tfe.Estimator(models.dense_model_fn(tfe), model_dir=str(tmp_path), params={"lr": 0.05},
                              config=tfe.RunConfig(save_checkpoints_steps=4))
    metrics, exports = runtime.train_and_evaluate(
        estimator, runtime.TrainSpec(models.input_fn(), max_steps=8),
        runtime.EvalSpec(models.input_fn(repeat=False), steps=2, throttle_secs=0))
    assert metrics["global_step"] == 8 and exports == []
    with pytest.raises(TypeError, match="`estimator` must have type `tf.estimator.Estimator`"):
        runtime.train_and_evaluate(object(), runtime.TrainSpec(models.input_fn()),
                                   runtime.EvalSpec(models.input_fn()))
