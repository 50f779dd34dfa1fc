"""Issue 16, class 1: what model_fn returns. Every mistake is a ModelFnError pointing at model_fn (the line
that built the refused spec, or the def line when it returned something else), raised before anything is
written; on CPU/GPU (no cs_ip) tf.estimator's own error is left as it is."""
from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
from bad_input_helpers import BATCH, ModeKeys, X, Y, estimator, refused, regression_input_fn

from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig
from cerebras_tf.errors import ModelFnError

THIS_FILE = __file__
# TF's own specs, where the installed TensorFlow has tf.estimator (TF <= 2.15).
TF_ESTIMATOR = getattr(tf.compat.v1, "estimator", None)
needs_tf_estimator = pytest.mark.skipif(TF_ESTIMATOR is None, reason="this TensorFlow has no tf.estimator")


def _layers(features, labels):
    hidden = tf.compat.v1.layers.dense(features, 8, activation=tf.nn.relu, name="hidden")
    predictions = tf.compat.v1.layers.dense(hidden, 1, name="output")
    loss = None if labels is None else tf.compat.v1.losses.mean_squared_error(labels, predictions)
    return predictions, loss


def _minimize(loss):
    return tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())


class HookLike:  # not a SessionRunHook
    pass


def returning(kind: str, in_mode: str = ModeKeys.TRAIN):
    """A model_fn that makes mistake `kind` in mode `in_mode` (a correct spec in the other modes)."""

    def model_fn(features, labels, mode, params):
        predictions, loss = _layers(features, labels)
        train_op = _minimize(loss) if mode == ModeKeys.TRAIN else None
        if mode != in_mode:
            return CSEstimatorSpec(mode, loss=loss, train_op=train_op, predictions={"y": predictions})
        if kind == "dict":
            return {"loss": loss, "train_op": train_op}
        if kind == "none":
            if mode == ModeKeys.TRAIN:
                pass  # forgot the return in this branch
            return None
        if kind == "tuple":
            return loss, train_op
        if kind == "tensor":
            return loss
        if kind == "tpu_spec":
            return TF_ESTIMATOR.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)
        if kind == "tf_estimator_spec":  # not a mistake: tf.estimator's own spec (also on the runtime)
            return TF_ESTIMATOR.EstimatorSpec(mode, loss=loss, train_op=train_op, predictions={"y": predictions})
        if kind == "no_loss":
            return CSEstimatorSpec(mode, train_op=train_op, predictions=predictions)  # returns: no_loss
        if kind == "no_train_op":
            return CSEstimatorSpec(mode, loss=loss)  # returns: no_train_op
        if kind == "per_example_loss":
            per_example = tf.reduce_sum(tf.square(labels - predictions), axis=1)
            return CSEstimatorSpec(mode, loss=per_example, train_op=train_op)  # returns: per_example_loss
        if kind == "unreduced_loss":
            unreduced = tf.square(labels - predictions)
            return CSEstimatorSpec(mode, loss=unreduced, train_op=train_op)  # returns: unreduced_loss
        if kind == "float_loss":
            return CSEstimatorSpec(mode, loss=0.5, train_op=train_op)  # returns: float_loss
        if kind == "numpy_loss":
            return CSEstimatorSpec(mode, loss=np.float32(0.5), train_op=train_op)  # returns: numpy_loss
        if kind == "optimizer_as_train_op":
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.01)
            return CSEstimatorSpec(mode, loss=loss, train_op=optimizer)  # returns: optimizer_as_train_op
        if kind == "uncalled_minimize":
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.01)
            return CSEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize)  # returns: uncalled_minimize
        if kind == "string_train_op":
            return CSEstimatorSpec(mode, loss=loss, train_op="train")  # returns: string_train_op
        if kind == "numpy_predictions":
            return CSEstimatorSpec(mode, predictions=np.zeros((BATCH, 1)))  # returns: numpy_predictions
        if kind == "float_in_preds":
            extra = {"y": predictions, "bias": 0.5}
            return CSEstimatorSpec(mode, loss=loss, train_op=train_op, predictions=extra)  # returns: float_in_preds
        if kind == "list_predictions":
            return CSEstimatorSpec(mode, predictions=[predictions, predictions])  # returns: list_predictions
        if kind == "no_predictions":
            return CSEstimatorSpec(mode)  # returns: no_predictions
        if kind == "hook_not_a_hook":
            hooks = [HookLike()]
            return CSEstimatorSpec(mode, loss=loss, train_op=train_op, training_hooks=hooks)  # returns: hook_not_a_hook
        if kind == "metrics_not_a_dict":
            metrics = [tf.compat.v1.metrics.mean(loss)]
            return CSEstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)  # returns: metrics_not_a_dict
        raise AssertionError(kind)

    return model_fn


def _returns_line(kind: str) -> str:
    """'file:line' of the `return` marked `# returns: <kind>` above."""
    with open(THIS_FILE, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if re.search(rf"# returns: {kind}$", line.rstrip()):
                return f"{THIS_FILE}:{number}"
    raise AssertionError(kind)


def _def_line(fn) -> str:
    return f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}"


def _run(est: CerebrasEstimator, mode: str, call: str = "run"):
    if call == "compile":
        return lambda: est.compile(regression_input_fn(), validate_only=True, mode=mode)
    return {
        ModeKeys.TRAIN: lambda: est.train(regression_input_fn(), max_steps=2),
        ModeKeys.EVAL: lambda: est.evaluate(regression_input_fn(), steps=1, use_cs=True),
        ModeKeys.PREDICT: lambda: list(est.predict(regression_input_fn(), use_cs=True, num_samples=2)),
    }[mode]


def _case(kind: str, mode: str, words: str, *marks: pytest.MarkDecorator) -> object:
    return pytest.param(kind, mode, words, id=f"{kind}-{mode}", marks=marks)


# kind, mode, what the message names
NOT_A_SPEC = [
    _case("dict", ModeKeys.TRAIN, "returned a dict with keys ['loss', 'train_op']"),
    _case("none", ModeKeys.TRAIN, "returned None"),
    _case("tuple", ModeKeys.TRAIN, "returned a tuple of 2"),
    _case("tensor", ModeKeys.TRAIN, "returned a tensor (mean_squared_error/value:0) alone"),
    _case("tpu_spec", ModeKeys.TRAIN, "returned a TPUEstimatorSpec", needs_tf_estimator),
    _case("none", ModeKeys.EVAL, "in eval mode it returned None"),
    _case("none", ModeKeys.PREDICT, "in infer mode it returned None"),
    _case("dict", ModeKeys.PREDICT, "in infer mode it returned a dict"),
]


@pytest.mark.parametrize("kind, mode, names", NOT_A_SPEC)
def test_a_return_that_is_not_a_spec_is_refused_at_model_fn(model_dir, kind, mode, names):
    model_fn = returning(kind, mode)
    refused(_run(estimator(model_dir, model_fn), mode), ModelFnError, "model_fn should return an EstimatorSpec",
            names, f"Where: {_def_line(model_fn)}", model_dir=model_dir)


# kind, mode, tf.estimator's message (kept in ours)
INVALID_SPEC = [
    _case("no_loss", ModeKeys.TRAIN, "Missing loss."),
    _case("no_loss", ModeKeys.EVAL, "Missing loss."),
    _case("no_train_op", ModeKeys.TRAIN, "Missing train_op."),
    _case("per_example_loss", ModeKeys.TRAIN, "Loss must be scalar, given: Tensor("),
    _case("unreduced_loss", ModeKeys.TRAIN, "Loss must be scalar"),
    _case("float_loss", ModeKeys.TRAIN, "loss must be Tensor, given: 0.5"),
    _case("numpy_loss", ModeKeys.TRAIN, "loss must be Tensor, given: 0.5"),
    _case("optimizer_as_train_op", ModeKeys.TRAIN, "train_op must be Operation or Tensor, given: <"),
    _case("uncalled_minimize", ModeKeys.TRAIN, "train_op must be Operation or Tensor, given: <bound method"),
    _case("string_train_op", ModeKeys.TRAIN, "train_op must be Operation or Tensor, given: train"),
    _case("numpy_predictions", ModeKeys.PREDICT, "predictions must be Tensor, given: [[0.]"),
    _case("float_in_preds", ModeKeys.TRAIN, "predictions[bias] must be Tensor, given: 0.5"),
    _case("list_predictions", ModeKeys.PREDICT, "predictions must be Tensor, given: [<tf.Tensor"),
    _case("no_predictions", ModeKeys.PREDICT, "Missing predictions."),
    _case("hook_not_a_hook", ModeKeys.TRAIN, "All hooks must be SessionRunHook instances"),
    _case("metrics_not_a_dict", ModeKeys.EVAL, "eval_metric_ops must be a dict"),
]


@pytest.mark.parametrize("kind, mode, tf_message", INVALID_SPEC)
def test_a_spec_tf_estimator_refuses_is_refused_at_the_line_that_builds_it(model_dir, kind, mode, tf_message):
    error = refused(_run(estimator(model_dir, returning(kind, mode)), mode), ModelFnError,
                    f"model_fn's EstimatorSpec is invalid in {mode} mode", tf_message,
                    f"Where: {_returns_line(kind)}", model_dir=model_dir)
    assert error.__cause__ is None and error.__context__ is None  # no tensorflow_estimator traceback above ours


@pytest.mark.parametrize("kind", ["dict", "per_example_loss"])
def test_compile_refuses_the_same_returns(model_dir, kind):
    refused(_run(estimator(model_dir, returning(kind)), ModeKeys.TRAIN, "compile"), ModelFnError,
            "model_fn", model_dir=model_dir)


def test_a_model_dir_with_a_checkpoint_is_left_as_it_was(prior_checkpoint):
    refused(_run(estimator(prior_checkpoint, returning("no_train_op")), ModeKeys.TRAIN), ModelFnError,
            "Missing train_op.", model_dir=prior_checkpoint)


@pytest.mark.parametrize("kind, tf_error, tf_message", [
    ("dict", ValueError, "model_fn should return an EstimatorSpec."),
    ("no_loss", ValueError, "Missing loss."),
])
def test_on_cpu_tf_estimator_reports_them_as_it_always_did(model_dir, kind, tf_error, tf_message):
    cpu = CerebrasEstimator(returning(kind), model_dir=model_dir, config=CSRunConfig(), params={"batch_size": BATCH})
    with pytest.raises(tf_error) as info:
        cpu.train(regression_input_fn(X, Y), max_steps=1)
    assert type(info.value) is tf_error and str(info.value) == tf_message


@needs_tf_estimator
def test_tf_estimators_own_spec_is_a_spec(model_dir):
    """Not a mistake: a model_fn returning tf.estimator.EstimatorSpec compiles (on the runtime too, which takes
    tf.estimator's spec as its own)."""
    result = estimator(model_dir, returning("tf_estimator_spec")).compile(regression_input_fn(), validate_only=True)
    assert result.validate_only
