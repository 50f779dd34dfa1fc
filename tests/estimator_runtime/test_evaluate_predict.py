"""estimator.runtime's evaluate() and predict(); runs on every supported TensorFlow."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

import runtime_models as models
from estimator import runtime
from estimator.runtime import Estimator, EstimatorSpec, ModeKeys, RunConfig


@pytest.fixture
def trained(tmp_path):
    """An Estimator of the metrics model trained to step 6, checkpoints at 3 and 6."""
    estimator = Estimator(models.dense_model_fn(runtime, metrics=True, layers=False), model_dir=str(tmp_path),
                          config=RunConfig(tf_random_seed=5, save_checkpoints_steps=3), params={})
    estimator.train(models.input_fn(), max_steps=6)
    return estimator


def _numpy_model(estimator, checkpoint=None):
    """The dense model's forward pass in numpy, from a checkpoint's values."""
    path = checkpoint or estimator.latest_checkpoint()
    value = lambda name: tf.train.load_variable(path, name)  # noqa: E731
    hidden = np.maximum(models.X @ value("hidden/kernel") + value("hidden/bias"), 0)
    return hidden, hidden @ value("output/kernel") + value("output/bias")


def test_evaluate_returns_the_metrics_computed_from_the_checkpoint(trained):
    with models.tf_log_lines() as log:
        metrics = trained.evaluate(models.input_fn(repeat=False))
    _, output = _numpy_model(trained)
    errors = output - models.Y
    assert set(metrics) == {"loss", "global_step", "mae", "rmse", "prediction/mean"}
    assert metrics["global_step"] == 6
    batch_losses = [np.mean(errors[i:i + 4] ** 2) for i in range(0, 16, 4)]
    np.testing.assert_allclose(metrics["loss"], np.mean(batch_losses), rtol=1e-5)
    np.testing.assert_allclose(metrics["mae"], np.mean(np.abs(errors)), rtol=1e-5)
    np.testing.assert_allclose(metrics["rmse"], np.sqrt(np.mean(errors ** 2)), rtol=1e-5)
    np.testing.assert_allclose(metrics["prediction/mean"], np.mean(output), rtol=1e-5)
    assert not any(line.startswith("Evaluation [") for line in log)  # progress is logged only with steps
    saved = [line for line in log if line.startswith("Saving dict for global step 6: ")]
    assert saved == ["Saving dict for global step 6: global_step = 6, loss = %s, mae = %s, prediction/mean = %s, "
                     "rmse = %s" % (metrics["loss"], metrics["mae"], metrics["prediction/mean"], metrics["rmse"])]
    tags = models.event_tags(os.path.join(trained.model_dir, "eval"))
    assert {"loss", "mae", "rmse", "prediction/mean", "checkpoint_path"} <= set(tags)
    assert tags["mae"] == [(6, pytest.approx(float(metrics["mae"])))]


def test_evaluate_steps_name_and_checkpoint_path(trained):
    first = os.path.join(trained.model_dir, "model.ckpt-3")
    metrics = trained.evaluate(models.input_fn(), steps=2, checkpoint_path=first, name="early")
    assert metrics["global_step"] == 3
    _, output = _numpy_model(trained, first)
    np.testing.assert_allclose(metrics["mae"], np.mean(np.abs(output[:8] - models.Y[:8])), rtol=1e-5)
    assert trained.eval_dir("early") == os.path.join(trained.model_dir, "eval_early")
    assert set(models.event_tags(trained.eval_dir("early"))) >= {"mae", "loss"}
    assert not os.path.exists(trained.eval_dir())


def test_evaluate_argument_checks_and_reserved_metric_names(tmp_path, trained):
    with pytest.raises(ValueError, match="^Must specify steps > 0, given: 0$"):
        trained.evaluate(models.input_fn(), steps=0)
    with pytest.raises(TypeError, match="Hooks must be a SessionRunHook"):
        trained.evaluate(models.input_fn(), steps=1, hooks=["nope"])
    base = models.dense_model_fn(runtime, layers=False)

    def with_metric(name):
        def model_fn(features, labels, mode, params):
            spec = base(features, labels, mode, params)
            return spec._replace(eval_metric_ops={name: tf.compat.v1.metrics.mean(spec.loss)})

        return model_fn

    for name in ("loss", "global_step"):
        model_fn = with_metric(name)
        with pytest.raises(ValueError, match=f"Metric with name .{name}. is not allowed, because Estimator already"):
            Estimator(model_fn, model_dir=str(tmp_path), params={}).evaluate(models.input_fn(), steps=1)


def test_evaluate_without_a_checkpoint_uses_initial_values(tmp_path):
    estimator = Estimator(models.dense_model_fn(runtime, layers=False), model_dir=str(tmp_path), params={})
    with models.tf_log_lines() as log:
        metrics = estimator.evaluate(models.input_fn(), steps=1)
    assert metrics["global_step"] == 0
    assert any(line.startswith("Could not find trained model in model_dir") for line in log)


def test_evaluation_hooks_run(trained):
    class Counter(tf.compat.v1.train.SessionRunHook):
        runs = 0

        def after_run(self, run_context, run_values):
            Counter.runs += 1

    trained.evaluate(models.input_fn(), steps=3, hooks=[Counter()])
    assert Counter.runs == 3


def test_predict_single_examples_batches_and_keys(trained):
    hidden, output = _numpy_model(trained)
    single = list(trained.predict(models.predict_input_fn))
    assert len(single) == 16 and set(single[0]) == {"y", "hidden"}
    np.testing.assert_allclose(np.stack([p["y"] for p in single]), output, rtol=1e-5)
    np.testing.assert_allclose(np.stack([p["hidden"] for p in single]), hidden, rtol=1e-5, atol=1e-6)
    batches = list(trained.predict(models.predict_input_fn, predict_keys=["y"], yield_single_examples=False))
    assert [list(b) for b in batches] == [["y"]] * 4
    assert [b["y"].shape for b in batches] == [(4, 1)] * 4
    first = os.path.join(trained.model_dir, "model.ckpt-3")
    _, early = _numpy_model(trained, first)
    from_first = [p["y"] for p in trained.predict(models.predict_input_fn, checkpoint_path=first)]
    np.testing.assert_allclose(np.stack(from_first), early, rtol=1e-5)


def test_predict_key_checks(trained):
    with pytest.raises(ValueError, match="Expected to run at least one output from"):
        next(trained.predict(models.predict_input_fn, predict_keys=["nope"]))


def test_predict_a_single_tensor_and_features_from_a_dataset_with_labels(tmp_path):
    def model_fn(features, labels, mode):
        assert labels is None and mode == ModeKeys.PREDICT
        return EstimatorSpec(mode, predictions=features * 2.0)

    estimator = Estimator(model_fn, model_dir=str(tmp_path))
    predictions = list(estimator.predict(models.input_fn(repeat=False)))
    np.testing.assert_array_equal(np.stack(predictions), models.X * 2.0)
    with pytest.raises(ValueError, match="predict_keys argument is not valid in case of non-dict predictions."):
        next(estimator.predict(models.input_fn(repeat=False), predict_keys=["y"]))


def test_predict_is_lazy(tmp_path):
    calls = []

    def input_fn():
        calls.append(1)
        return models.predict_input_fn()

    estimator = Estimator(models.dense_model_fn(runtime, layers=False), model_dir=str(tmp_path), params={})
    predictions = estimator.predict(input_fn)
    assert calls == []
    next(predictions)
    assert calls == [1]
