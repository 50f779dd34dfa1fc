"""Each rule's "Where" is the line that made the offending object, not a line near it.

Every mistake below is made on a line marked `# here: <name>`; the test asserts
the error's `where` is exactly that file:line. TF records where each op was
created (op.traceback), so eval_metric_ops, returned tensors, dataset elements
and Python functions inside map functions are found there; a call's arguments
(hooks) are reported at the call.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

from estimator import ModeKeys
from cerebras_tf import CSEstimatorSpec, errors

THIS_FILE = __file__
X = np.arange(32, dtype=np.float32).reshape(8, 4)
Y = np.ones((8, 1), np.float32)


def line(name: str) -> str:
    """'file:line' of the line of this file marked `# here: <name>`."""
    with open(THIS_FILE, encoding="utf-8") as handle:
        numbers = [number for number, text in enumerate(handle, 1) if re.search(rf"# here: {name}$", text.rstrip())]
    assert len(numbers) == 1, f"{name}: {numbers}"
    return f"{THIS_FILE}:{numbers[0]}"


def problem_of(error: errors.CerebrasError, error_type: type) -> errors.CerebrasError:
    """The one problem of `error_type` in `error` (a single error or a MultipleProblemsError)."""
    found = [problem for problem in getattr(error, "problems", [error]) if type(problem) is error_type]
    assert len(found) == 1, str(error)
    return found[0]


def refused(action, error_type: type) -> errors.CerebrasError:
    with pytest.raises(errors.CerebrasError) as info:
        action()
    return problem_of(info.value, error_type)


# --------------------------------------------------------------------------- the model_fn's spec


def metric_model_fn(features, labels, mode, params):
    predictions = tf.compat.v1.layers.dense(features, 1, name="linear")
    loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    error = tf.abs(labels - predictions)
    metrics = {
        "mean_error": tf.compat.v1.metrics.mean(error),  # here: metric
        "mse": tf.compat.v1.metrics.mean_squared_error(labels, predictions),
    }
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


def xy_input_fn(params):
    return tf.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(4, drop_remainder=True)


@pytest.mark.parametrize("mode", [ModeKeys.TRAIN, ModeKeys.EVAL])
def test_eval_metric_ops_are_reported_where_the_first_metric_is_built(make_estimator, mode):
    estimator = make_estimator(metric_model_fn)
    problem = refused(lambda: estimator.compile(xy_input_fn, validate_only=True, mode=mode),
                      errors.EvalMetricOpsError)
    assert problem.where == line("metric")  # not `def metric_model_fn`


# --------------------------------------------------------------------------- input_fn and its dataset


def string_in_dict_input_fn(params):
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(8)
    ds = ds.map(lambda x, y: ({"x": x, "id": tf.strings.as_string(x[0])}, y))  # here: dict
    return ds.repeat().batch(4, drop_remainder=True).prefetch(1)


def sparse_input_fn(params):
    ds = tf.data.Dataset.from_tensor_slices((tf.sparse.from_dense(X), Y))  # here: sparse
    return ds.repeat().batch(4, drop_remainder=True)


def triple_input_fn(params):
    ds = tf.data.Dataset.from_tensor_slices((X, Y, np.ones(8, np.float32)))  # here: triple
    return ds.repeat().batch(4, drop_remainder=True)


def iterator_input_fn(params):  # TF1 style: the iterator's tensors instead of the dataset
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(4, drop_remainder=True)
    return tf.compat.v1.data.make_one_shot_iterator(ds).get_next()  # here: get_next


@pytest.mark.parametrize("input_fn, mistake", [
    (string_in_dict_input_fn, "dict"),  # the map that builds the features dict, not the batch/prefetch after it
    (sparse_input_fn, "sparse"),
    (triple_input_fn, "triple"),
    (iterator_input_fn, "get_next"),  # not `def iterator_input_fn`
])
def test_input_problems_are_reported_where_the_pipeline_makes_them(make_estimator, make_model_fn, input_fn,
                                                                   mistake):
    estimator = make_estimator(make_model_fn())
    problem = refused(lambda: estimator.compile(input_fn, validate_only=True), errors.InputFunctionError)
    assert problem.where == line(mistake), str(problem)


def _flip(x, y):
    x = tf.numpy_function(np.flip, [x], tf.float32)  # here: py_function
    return tf.reshape(x, [4]), y


def python_function_input_fn(params):
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).map(_flip)
    return ds.repeat().batch(4, drop_remainder=True)


def test_a_python_function_for_remote_workers_is_reported_at_its_call_in_the_map_function(
        make_estimator, make_model_fn, tf_config):
    tf_config.set({"cluster": {"chief": ["localhost:2222"], "worker": ["localhost:2223", "localhost:2224"]},
                   "task": {"type": "chief", "index": 0}})
    estimator = make_estimator(make_model_fn())
    problem = refused(lambda: estimator.compile(python_function_input_fn, validate_only=True),
                      errors.InputFunctionError)
    assert "cannot run on remote input workers" in problem.message
    assert problem.where == line("py_function")  # not the .map(...) line


# --------------------------------------------------------------------------- the run's call


class CountingHook(tf.compat.v1.train.SessionRunHook):
    pass


def test_call_arguments_are_reported_at_the_call(make_estimator, make_input_fn):
    estimator = make_estimator()
    with pytest.raises(errors.CerebrasError) as info:
        estimator.train(make_input_fn(), hooks=[CountingHook()])  # here: train
    assert problem_of(info.value, errors.HookError).where == line("train")
    assert problem_of(info.value, errors.RunArgumentError).where == line("train")
    with pytest.raises(errors.RunArgumentError) as info:
        estimator.evaluate(make_input_fn(), use_cs=True)  # here: evaluate
    assert info.value.where == line("evaluate")
    with pytest.raises(errors.HookError) as info:
        estimator.predict(make_input_fn(), hooks=[CountingHook()], use_cs=True)  # here: predict
    assert info.value.where == line("predict")
