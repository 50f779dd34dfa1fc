"""The runtime's tf.estimator.experimental API and the rest it gained for issue 25, on every supported TensorFlow.

InMemoryEvaluatorHook, make_stop_at_checkpoint_step_hook, the early-stopping hooks, call_logit_fn,
build_raw_supervised_input_receiver_fn (and UnsupervisedInputReceiver, build_supervised_input_receiver_fn_
from_input_fn), add_metrics, Estimator.export_savedmodel (refused; tf.compat.v1's EstimatorV1 keeps it) and
RunConfig refusing TF 2's ParameterServerStrategy, each with tf.estimator 2.15's behaviour and messages
(upstream's own tests of them run against the runtime in benchmarks/upstream_estimator_tests.py).
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from estimator import runtime
from estimator.runtime import Estimator, EstimatorSpec, ModeKeys, RunConfig, early_stopping, training_hooks
from estimator.runtime.receivers import (
    SupervisedInputReceiver,
    UnsupervisedInputReceiver,
    build_supervised_input_receiver_fn_from_input_fn,
)


@pytest.fixture(autouse=True)
def _no_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)


def _range_input_fn():
    return tf.compat.v1.data.Dataset.range(10)


def _counting_model_fn(features, labels, mode):
    """Trains one step per element (w = step + 2 after each); EVAL's metric is the mean of w."""
    del labels
    step = tf.compat.v1.train.get_global_step()
    w = tf.compat.v1.get_variable("w", shape=[], dtype=tf.int64, initializer=tf.compat.v1.zeros_initializer())
    if mode == ModeKeys.TRAIN:
        with tf.control_dependencies([features]):
            increment = tf.compat.v1.assign_add(step, 1)
        with tf.control_dependencies([increment]):
            train_op = w.assign(step + 2)
        return EstimatorSpec(mode, loss=tf.constant(3.0), train_op=train_op)
    with tf.control_dependencies([features]):
        loss = tf.constant(5.0)
    return EstimatorSpec(mode, loss=loss, eval_metric_ops={"mean_w": tf.compat.v1.metrics.mean(w)})


def _eval_summaries(eval_dir):
    """{step: {tag: simple_value}} of eval_dir's event files."""
    tf.compat.v1.summary.FileWriterCache.clear()
    return early_stopping.read_eval_metrics(eval_dir)


# ---------------------------------------------------------------------------------------------- in-memory eval


def test_in_memory_evaluator_evaluates_the_variables_being_trained(tmp_path):
    est = Estimator(_counting_model_fn, model_dir=str(tmp_path))
    hook = runtime.experimental.InMemoryEvaluatorHook(est, _range_input_fn, every_n_iter=4)
    est.train(_range_input_fn, hooks=[hook])
    results = _eval_summaries(est.eval_dir())
    assert sorted(results) == [0, 4, 8, 10]  # before training, every 4 iterations, at the end
    assert [results[step]["mean_w"] for step in (0, 4, 10)] == [0, 6, 12]  # w = step + 2 once trained
    assert results[10]["loss"] == 5.0


def test_in_memory_evaluator_named_and_with_steps(tmp_path):
    est = Estimator(_counting_model_fn, model_dir=str(tmp_path))
    hook = runtime.experimental.InMemoryEvaluatorHook(est, _range_input_fn, steps=2, name="mem", every_n_iter=100)
    est.train(_range_input_fn, hooks=[hook])
    assert os.path.isdir(est.eval_dir("mem")) and not os.path.exists(est.eval_dir())
    assert sorted(_eval_summaries(est.eval_dir("mem"))) == [0, 10]


def test_in_memory_evaluator_refusals(tmp_path, monkeypatch):
    est = Estimator(_counting_model_fn, model_dir=str(tmp_path))
    with pytest.raises(ValueError, match="invalid every_n_iter=0"):
        runtime.experimental.InMemoryEvaluatorHook(est, _range_input_fn, every_n_iter=0)
    with pytest.raises(ValueError, match="Must specify steps > 0, given: 0"):
        runtime.experimental.InMemoryEvaluatorHook(est, _range_input_fn, steps=0)
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"chief": ["h:0"], "worker": ["h:1"]}, '
                                    '"task": {"type": "chief", "index": 0}}')
    distributed = Estimator(_counting_model_fn, model_dir=str(tmp_path), config=RunConfig())
    with pytest.raises(ValueError, match="supports only single machine"):
        runtime.experimental.InMemoryEvaluatorHook(distributed, _range_input_fn)


@pytest.mark.parametrize("scaffold, message", [
    (lambda: tf.compat.v1.train.Scaffold(saver=tf.compat.v1.train.Saver()), "does not support custom saver"),
    (lambda: tf.compat.v1.train.Scaffold(init_fn=lambda scaffold, session: None), "does not support custom init_fn"),
])
def test_in_memory_evaluator_refuses_a_custom_saver_or_init_fn(tmp_path, scaffold, message):
    def model_fn(features, labels, mode):
        tf.compat.v1.get_variable("v", shape=[])
        return EstimatorSpec(mode, loss=tf.constant(3.0), train_op=tf.constant(5.0), scaffold=scaffold())

    hook = runtime.experimental.InMemoryEvaluatorHook(Estimator(model_fn, model_dir=str(tmp_path)), _range_input_fn)
    with pytest.raises(ValueError, match=message):
        hook.begin()


# ---------------------------------------------------------------------------------------------- stop at step


def test_stop_at_checkpoint_step_hook_for_chief_and_workers(tmp_path):
    est = Estimator(_counting_model_fn, model_dir=str(tmp_path))
    chief_hook = runtime.experimental.make_stop_at_checkpoint_step_hook(est, 300)
    assert isinstance(chief_hook, tf.compat.v1.train.StopAtStepHook) and chief_hook._last_step == 300

    class WorkerConfig(RunConfig):
        @property
        def is_chief(self):
            return False

    worker = Estimator(_counting_model_fn, model_dir=str(tmp_path), config=WorkerConfig())
    hook = runtime.experimental.make_stop_at_checkpoint_step_hook(worker, 300, wait_after_file_check_secs=7)
    assert isinstance(hook, training_hooks._StopAtCheckpointStepHook)
    assert (hook._model_dir, hook._last_step, hook._wait_after_file_check_secs) == (str(tmp_path), 300, 7)


def test_stop_at_checkpoint_step_waits_for_the_chiefs_checkpoint(tmp_path, monkeypatch):
    sleeps = []
    monkeypatch.setattr(training_hooks.time, "sleep", sleeps.append)
    model_dir = str(tmp_path)
    with tf.Graph().as_default():
        step = tf.compat.v1.train.create_global_step()
        set_step, set_last_step, no_op = step.assign(9), step.assign(10), tf.no_op()
        saver = tf.compat.v1.train.Saver()
        hook = training_hooks._StopAtCheckpointStepHook(model_dir=model_dir, last_step=10,
                                                        wait_after_file_check_secs=3)
        with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as session:
            session.raw_session().run(set_step)
            session.run(no_op)  # the next step reaches 10, but no checkpoint has: wait and go on
            assert sleeps == [3] and not session.should_stop()
            session.raw_session().run(set_last_step)
            saver.save(session.raw_session(), os.path.join(model_dir, "model.ckpt"))
            session.run(no_op)
            assert session.should_stop() and sleeps == [3]
    with pytest.raises(ValueError, match="last_step must be specified."):
        training_hooks._StopAtCheckpointStepHook(model_dir, None)


# ---------------------------------------------------------------------------------------------- early stopping


def _write_eval_metrics(eval_dir, by_step, suffix=""):
    with tf.Graph().as_default():  # v1 summary writers refuse eager mode
        writer = tf.compat.v1.summary.FileWriter(eval_dir, filename_suffix=suffix)
        for step, metrics in by_step.items():
            summary = tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag=tag, simple_value=value)
                                                  for tag, value in metrics.items()])
            writer.add_summary(summary, step)
        writer.close()


@pytest.mark.parametrize("make_hook, stops", [
    (lambda est: runtime.experimental.stop_if_higher_hook(est, "accuracy", 0.9, run_every_secs=None,
                                                          run_every_steps=1), True),
    (lambda est: runtime.experimental.stop_if_higher_hook(est, "accuracy", 0.95, run_every_secs=None,
                                                          run_every_steps=1), False),
    (lambda est: runtime.experimental.stop_if_lower_hook(est, "loss", 0.4, run_every_secs=None,
                                                         run_every_steps=1), True),
    (lambda est: runtime.experimental.stop_if_lower_hook(est, "loss", 0.4, min_steps=30, run_every_secs=None,
                                                         run_every_steps=1), False),
    (lambda est: runtime.experimental.stop_if_no_increase_hook(est, "accuracy", 10, run_every_secs=None,
                                                               run_every_steps=1), True),
    (lambda est: runtime.experimental.stop_if_no_decrease_hook(est, "loss", 20, run_every_secs=None,
                                                               run_every_steps=1), False),
])
def test_early_stopping_hooks_read_the_evaluations(tmp_path, make_hook, stops):
    est = Estimator(_counting_model_fn, model_dir=str(tmp_path))
    # accuracy peaks at step 10; loss is lowest at step 20
    _write_eval_metrics(est.eval_dir(), {10: {"accuracy": 0.92, "loss": 0.5}, 20: {"accuracy": 0.91, "loss": 0.3},
                                         25: {"accuracy": 0.90, "loss": 0.35}})
    est.train(lambda: tf.compat.v1.data.Dataset.range(1000), hooks=[make_hook(est)], max_steps=50)
    assert (est.get_variable_value("global_step") < 50) == stops


def test_early_stopping_stop_variable_and_non_chief_hook(tmp_path):
    est = Estimator(_counting_model_fn, model_dir=str(tmp_path))
    hook = runtime.experimental.make_early_stopping_hook(est, lambda: True, run_every_secs=None, run_every_steps=1)
    est.train(lambda: tf.compat.v1.data.Dataset.range(1000), hooks=[hook], max_steps=50)
    assert est.get_variable_value("global_step") == 1
    assert bool(est.get_variable_value("signal_early_stopping/STOP"))  # the chief's request, for the workers

    class WorkerConfig(RunConfig):
        @property
        def is_chief(self):
            return False

    worker = Estimator(_counting_model_fn, model_dir=str(tmp_path), config=WorkerConfig())
    assert isinstance(runtime.experimental.make_early_stopping_hook(worker, lambda: True),
                      early_stopping._CheckForStoppingHook)


def test_early_stopping_refusals(tmp_path):
    est = Estimator(_counting_model_fn, model_dir=str(tmp_path))
    with pytest.raises(TypeError, match="`estimator` must have type `tf.estimator.Estimator`"):
        runtime.experimental.make_early_stopping_hook(object(), lambda: True)
    with pytest.raises(ValueError, match="Only one of `run_every_secs` and `run_every_steps` must be set."):
        runtime.experimental.make_early_stopping_hook(est, lambda: True, run_every_secs=1, run_every_steps=1)
    with pytest.raises(TypeError, match="`should_stop_fn` must be callable."):
        runtime.experimental.make_early_stopping_hook(est, True)


def test_read_eval_metrics_merges_steps_in_order(tmp_path):
    _write_eval_metrics(str(tmp_path), {20: {"a": 2.0}, 10: {"a": 1.0}})
    _write_eval_metrics(str(tmp_path), {10: {"b": 3.0}}, suffix=".second")
    assert list(early_stopping.read_eval_metrics(str(tmp_path)).items()) == [(10, {"a": 1.0, "b": 3.0}),
                                                                              (20, {"a": 2.0})]
    assert early_stopping.read_eval_metrics(str(tmp_path / "missing")) == {}


# ---------------------------------------------------------------------------------------------- receivers


def test_build_raw_supervised_input_receiver_fn():
    with tf.Graph().as_default():
        features = {"f1": tf.constant([[1.0]]), "f2": tf.constant([[2]])}
        labels = {"l": tf.constant([3.0])}
        receiver = runtime.experimental.build_raw_supervised_input_receiver_fn(features, labels,
                                                                               default_batch_size=5)()
        assert isinstance(receiver, SupervisedInputReceiver)
        assert set(receiver.features) == {"f1", "f2"} and set(receiver.labels) == {"l"}
        assert set(receiver.receiver_tensors) == {"f1", "f2", "l"}
        assert receiver.features["f2"].dtype == tf.int32 and receiver.features["f1"].shape.as_list() == [5, 1]
        raw = runtime.experimental.build_raw_supervised_input_receiver_fn(tf.constant([[1.0]]), tf.constant([2]))()
        assert isinstance(raw.features, tf.Tensor) and isinstance(raw.labels, tf.Tensor)
        assert set(raw.receiver_tensors) == {"input", "label"}
        assert raw.features.shape.as_list() == [None, 1]
        with pytest.raises(ValueError, match="Features and labels must have distinct keys"):
            runtime.experimental.build_raw_supervised_input_receiver_fn({"x": tf.constant(1)}, {"x": tf.constant(2)})
        with pytest.raises(ValueError, match="Features and labels must have distinct keys"):
            runtime.experimental.build_raw_supervised_input_receiver_fn(tf.constant(1), {"input": tf.constant(2)})


def test_supervised_receiver_fn_from_input_fn_and_unsupervised_receiver():
    def input_fn(scale):
        return {"x": tf.constant([[1.0, 2.0]]) * scale}, tf.constant([[1]])

    receiver_fn = build_supervised_input_receiver_fn_from_input_fn(input_fn, scale=2.0)
    with tf.Graph().as_default() as graph:
        receiver = receiver_fn()
        assert receiver.features["x"].graph is graph and receiver.features["x"].op.type == "Placeholder"
        assert receiver.labels.dtype == tf.int32
        unsupervised = UnsupervisedInputReceiver({"x": receiver.features["x"]}, receiver.features["x"])
        assert unsupervised.receiver_tensors == {"input": receiver.features["x"]}
        assert unsupervised.receiver_tensors_alternatives is None
        assert isinstance(unsupervised, runtime.export.ServingInputReceiver)


# ---------------------------------------------------------------------------------------------- logits, metrics


def test_call_logit_fn_passes_what_it_names():
    with tf.Graph().as_default():
        def logit_fn(features, mode, params):
            return {"logits": features * params["k"]} if mode == "train" else features

        result = runtime.experimental.call_logit_fn(logit_fn, tf.constant(2.0), "train", {"k": 3.0}, "config")
        assert set(result) == {"logits"}
        with pytest.raises(ValueError, match="logit_fn should return a Tensor or a dictionary mapping strings to "
                                             "Tensors"):
            runtime.experimental.call_logit_fn(lambda features: {1: features}, tf.constant(1.0), "infer", None,
                                               None)


def test_add_metrics_adds_to_the_models_metrics(tmp_path):
    def model_fn(features, labels, mode):
        prediction = tf.compat.v1.get_variable("p", initializer=2.0) * tf.ones_like(features, tf.float32)
        return EstimatorSpec(mode, loss=tf.reduce_mean(prediction), predictions={"p": prediction},
                             train_op=tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1),
                             eval_metric_ops={"own": tf.compat.v1.metrics.mean(prediction)})

    def metric_fn(predictions, features):
        return {"extra": tf.compat.v1.metrics.mean(predictions["p"] + tf.cast(features, tf.float32))}

    def input_fn():
        return tf.compat.v1.data.Dataset.from_tensors(tf.constant([1.0, 3.0]))

    est = Estimator(model_fn, model_dir=str(tmp_path))
    est.train(input_fn, steps=1)
    extended = runtime.add_metrics(est, metric_fn)
    assert isinstance(extended, Estimator) and extended.model_dir == est.model_dir
    metrics = extended.evaluate(input_fn)
    assert (metrics["own"], metrics["extra"]) == (2.0, 4.0)
    with pytest.raises(ValueError, match="has following not expected args: \\['mode'\\]"):
        runtime.add_metrics(est, lambda mode: {})


# ---------------------------------------------------------------------------------------------- export, config


def test_export_savedmodel_is_refused_and_the_v1_estimator_keeps_it(tmp_path):
    def model_fn(features, labels, mode):
        tf.Variable(1.0, name="weight")
        return EstimatorSpec(mode, predictions=tf.constant(10.0), loss=tf.constant(1.0),
                             train_op=tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1))

    def receiver_fn():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        return runtime.export.ServingInputReceiver({"x": x}, {"x": x})

    est = Estimator(model_fn, model_dir=str(tmp_path / "v2"))
    with pytest.raises(AttributeError, match="Please use `export_saved_model`"):
        est.export_savedmodel  # noqa: B018
    from estimator.runtime import v1

    v1_est = v1.Estimator(model_fn, model_dir=str(tmp_path / "v1"))
    v1_est.train(lambda: tf.compat.v1.data.Dataset.from_tensors(1.0), steps=1)

    def weight_attrs(export_dir):
        """The attributes the SavedModel file holds for the `weight` node (as written: loading adds defaults)."""
        saved = saved_model_pb2.SavedModel.FromString(open(os.path.join(export_dir, b"saved_model.pb"), "rb").read())
        return set(next(node for node in saved.meta_graphs[0].graph_def.node if node.name == "weight").attr)

    kept = v1_est.export_savedmodel(str(tmp_path / "kept"), receiver_fn)
    stripped = v1_est.export_savedmodel(str(tmp_path / "stripped"), receiver_fn, strip_default_attrs=True)
    assert "container" in weight_attrs(kept)  # its default value, "", kept
    assert "container" not in weight_attrs(stripped)
    assert "container" not in weight_attrs(v1_est.export_saved_model(str(tmp_path / "new"), receiver_fn))
    with pytest.raises(ValueError, match="An input_receiver_fn must be defined."):
        v1_est.export_savedmodel(str(tmp_path / "none"), None)


@pytest.mark.parametrize("argument", ["train_distribute", "eval_distribute"])
def test_run_config_refuses_tf2_parameter_server_strategy(argument):
    strategy_class = tf.distribute.experimental.ParameterServerStrategy
    with pytest.raises(ValueError, match="Please use `tf.compat.v1.distribute.experimental.ParameterServerStrategy`"):
        RunConfig(**{argument: strategy_class.__new__(strategy_class)})


def test_hooks_tf_estimator_reexports_are_tfs():
    assert runtime.StopAtStepHook is tf.compat.v1.train.StopAtStepHook
    assert runtime.NanLossDuringTrainingError is tf.compat.v1.train.NanLossDuringTrainingError
    assert all(callable(getattr(runtime.experimental, name)) for name in runtime.experimental.__all__)
