"""Without a CS system (cs_ip=None, or use_cs=False) the CerebrasEstimator is a plain tf.estimator.Estimator."""
from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import estimator as estimator_api
from estimator import Estimator
from cerebras_tf import CerebrasEstimator

SEED = 42
STEPS = 6


@pytest.fixture(autouse=True)
def _no_cluster(tf_config):
    """No TF_CONFIG: CPU/GPU runs do not need one, and train_and_evaluate then runs locally."""
    tf_config.clear()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, build_estimator, make_model_fn, make_input_fn) -> CerebrasEstimator:
    """A CPU CerebrasEstimator (host_call "list": an "mse" metric) trained STEPS steps with tf_random_seed=SEED."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("TF_CONFIG", raising=False)
        estimator = build_estimator(str(tmp_path_factory.mktemp("trained") / "model"),
                                    make_model_fn(host_call="list"), cs_ip=None, tf_random_seed=SEED)
    return estimator.train(make_input_fn(), max_steps=STEPS)


def _numpy_predictions(estimator: Estimator, x: np.ndarray) -> np.ndarray:
    """The MLP of make_model_fn, in numpy, with the estimator's latest checkpoint."""
    value = estimator.get_variable_value
    hidden = np.maximum(x @ value("hidden/kernel") + value("hidden/bias"), 0.0)
    return hidden @ value("output/kernel") + value("output/bias")


def _examples(count: int, total: int) -> np.ndarray:
    """Indices of the first `count` examples of a repeating, unshuffled pass over `total` examples."""
    return np.arange(count) % total


def test_cerebras_estimator_is_a_tf_estimator():
    assert issubclass(CerebrasEstimator, estimator_api.Estimator)
    if estimator_api.BACKEND == "tf.estimator":
        assert issubclass(CerebrasEstimator, tf.estimator.Estimator)


@pytest.mark.parametrize("cs_ip, run", [(None, {}), ("localhost:9000", {"use_cs": False})])
def test_training_gives_the_same_variables_as_tf_estimator(
        trained, build_estimator, make_model_fn, make_input_fn, tmp_path, cs_ip, run):
    reference = estimator_api.Estimator(make_model_fn(host_call="list"), model_dir=str(tmp_path / "reference"),
                                        config=estimator_api.RunConfig(tf_random_seed=SEED), params=trained.params)
    reference.train(make_input_fn(), max_steps=STEPS)
    if cs_ip is None:
        estimator = trained
    else:
        estimator = build_estimator(str(tmp_path / "cs"), make_model_fn(host_call="list"), cs_ip=cs_ip,
                                    tf_random_seed=SEED)
        estimator.train(make_input_fn(), max_steps=STEPS, **run)

    names = reference.get_variable_names()
    assert estimator.get_variable_names() == names
    assert {"global_step", "hidden/kernel", "output/kernel"} <= set(names)
    assert estimator.get_variable_value("global_step") == STEPS
    for name in names:
        np.testing.assert_array_equal(estimator.get_variable_value(name), reference.get_variable_value(name),
                                      err_msg=name)


class CountingHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self) -> None:
        self.runs = 0

    def after_run(self, run_context, run_values) -> None:
        self.runs += 1


class RecordingListener(tf.compat.v1.train.CheckpointSaverListener):
    def __init__(self) -> None:
        self.saved_steps: list[int] = []

    def after_save(self, session, global_step_value) -> None:
        self.saved_steps.append(int(global_step_value))


@pytest.mark.parametrize("cs_ip, run", [(None, {}), ("localhost:9000", {"use_cs": False})])
def test_hooks_eval_metric_ops_and_the_other_cs_limitations_work_on_cpu(
        build_estimator, make_model_fn, make_input_fn, data, model_dir, cs_ip, run):
    hooks = {name: CountingHook() for name in ("train", "spec_train", "spec_chief", "evaluate", "spec_eval")}
    listener = RecordingListener()
    model_fn = make_model_fn(eval_metric_ops=True, training_hooks=[hooks["spec_train"]],
                             training_chief_hooks=[hooks["spec_chief"]], evaluation_hooks=[hooks["spec_eval"]])
    # Everything here breaks a CS-system rule; none of them applies on CPU/GPU.
    estimator = build_estimator(model_dir, model_fn, cs_ip=cs_ip, save_checkpoints_steps=1)
    one_epoch = make_input_fn(repeat=False, drop_remainder=False)  # 3 batches: 4, 4, 2

    estimator.train(one_epoch, hooks=[hooks["train"]], saving_listeners=[listener], **run)
    metrics = estimator.evaluate(one_epoch, hooks=[hooks["evaluate"]])

    assert {name: hook.runs for name, hook in hooks.items()} == dict.fromkeys(hooks, 3)
    assert listener.saved_steps[-3:] == [1, 2, 3]
    assert metrics["global_step"] == 3
    np.testing.assert_allclose(metrics["mean_label"], data.y.mean(), rtol=1e-6)


@pytest.mark.parametrize("host_call, metric, reduce", [
    ("list", "mse", lambda error: np.mean(error ** 2)),
    ("dict", "mae", lambda error: np.mean(np.abs(error))),
])
def test_host_call_becomes_eval_metric_ops_on_cpu(
        trained, build_estimator, make_model_fn, make_input_fn, data, host_call, metric, reduce):
    estimator = build_estimator(trained.model_dir, make_model_fn(host_call=host_call), cs_ip=None)
    metrics = estimator.evaluate(make_input_fn(shuffle=False, repeat=False, drop_remainder=False), name=host_call)
    expected = reduce(_numpy_predictions(trained, data.x) - data.y)
    assert metrics["global_step"] == STEPS
    np.testing.assert_allclose(metrics[metric], expected, rtol=1e-5)


def test_train_and_evaluate_works_on_cpu(build_estimator, make_model_fn, make_input_fn, data, model_dir):
    estimator = build_estimator(model_dir, make_model_fn(host_call="list"), cs_ip=None, tf_random_seed=SEED)
    metrics, _ = estimator_api.train_and_evaluate(
        estimator,
        estimator_api.TrainSpec(make_input_fn(), max_steps=4),
        estimator_api.EvalSpec(make_input_fn(shuffle=False, repeat=False, drop_remainder=False), steps=None,
                               throttle_secs=0),
    )
    assert metrics["global_step"] == 4
    np.testing.assert_allclose(metrics["mse"], np.mean((_numpy_predictions(estimator, data.x) - data.y) ** 2),
                               rtol=1e-5)


def test_export_saved_model_serves_the_trained_model(trained, data, tmp_path):
    def serving_input_receiver_fn():
        features = tf.compat.v1.placeholder(tf.float32, [None, data.x.shape[1]], name="features")
        return estimator_api.export.TensorServingInputReceiver(features, {"features": features})

    export_dir = trained.export_saved_model(str(tmp_path / "export"), serving_input_receiver_fn)
    assert os.path.isfile(os.path.join(export_dir, b"saved_model.pb"))
    served = tf.saved_model.load(export_dir).signatures["serving_default"](features=tf.constant(data.x))
    np.testing.assert_allclose(served["y"].numpy(), _numpy_predictions(trained, data.x), rtol=1e-5)


@pytest.mark.parametrize("num_samples", [3, 13])  # within the first batch; past one pass over the 10 examples
def test_predict_num_samples_yields_exactly_that_many_single_examples(trained, make_input_fn, data, num_samples):
    predictions = list(trained.predict(make_input_fn(shuffle=False), num_samples=num_samples))
    assert len(predictions) == num_samples
    expected = _numpy_predictions(trained, data.x[_examples(num_samples, len(data.x))])
    np.testing.assert_allclose(np.stack([p["y"] for p in predictions]), expected, rtol=1e-5)


def test_predict_num_samples_cuts_the_last_batch(trained, make_input_fn, data):
    batches = list(trained.predict(make_input_fn(shuffle=False), yield_single_examples=False, num_samples=13))
    assert [len(batch["y"]) for batch in batches] == [4, 4, 4, 1]
    expected = _numpy_predictions(trained, data.x[_examples(13, len(data.x))])
    np.testing.assert_allclose(np.concatenate([batch["y"] for batch in batches]), expected, rtol=1e-5)


@pytest.mark.parametrize("num_samples", [0, -2, 2.5])
def test_predict_num_samples_must_be_a_positive_integer(trained, make_input_fn, num_samples):
    with pytest.raises(ValueError, match="Must specify num_samples > 0"):
        trained.predict(make_input_fn(), num_samples=num_samples)
