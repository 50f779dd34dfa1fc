"""CS-system rules on input_fn and its dataset (rules 1-5 and 11)."""
from __future__ import annotations

import pytest
import tensorflow as tf

from cerebras_tf import errors

ModeKeys = tf.estimator.ModeKeys

NOT_A_DATASET = "[Unsupported TensorFlow] Input function must return a tf.data.Dataset"
INCONSISTENT_BATCH = (
    "[Unsupported TensorFlow] Inconsistent batch sizes detected. To ensure a fixed batch size across all steps, "
    "set `drop_remainder=True` when batching your Dataset in the input function."
)


def _train(estimator, input_fn):
    return lambda: estimator.train(input_fn, max_steps=5)


# --------------------------------------------------------------------------- rule 1


def test_input_fn_must_return_a_dataset(make_estimator, make_input_fn, assert_refused, defined_at):
    estimator = make_estimator()
    input_fn = make_input_fn(dataset=False)  # (features, labels) tensors: fine for tf.estimator, not for the CS
    assert_refused(estimator, errors.InputFunctionError, _train(estimator, input_fn),
                   NOT_A_DATASET, f"Where: {defined_at(input_fn)}", "returned tuple")


# --------------------------------------------------------------------------- rule 2


@pytest.mark.parametrize("element, structure, problem", [
    ("dict", "({'x': float32[4,4]}, float32[4,1])", "features must be a single dense numeric tensor"),
    ("nested", "((float32[4,2], float32[4,2]), float32[4,1])", "features must be a single dense numeric tensor"),
    ("sparse", "(SparseTensorSpec(float32[4,4]), float32[4,1])", "features must be a single dense numeric tensor"),
    ("ragged", "(RaggedTensorSpec(float32[4,4]), float32[4,1])", "features must be a single dense numeric tensor"),
    ("string_features", "(string[4,4], float32[4,1])", "features must be a single dense numeric tensor"),
    ("string_labels", "(float32[4,4], string[4,1])", "labels must be a single dense numeric tensor or None"),
    # tf.estimator itself cannot split this element: the rule is still what gets reported.
    ("triple", "(float32[4,4], float32[4,1], float32[4])", "an element must be (features, labels) or features alone"),
])
def test_element_structure_must_be_features_and_labels_tensors(
        make_estimator, make_input_fn, assert_refused, element, structure, problem):
    estimator = make_estimator()
    assert_refused(estimator, errors.InputFunctionError, _train(estimator, make_input_fn(element=element)),
                   f"Unsupported dataset element structure {structure}: {problem}.")


def test_a_model_fn_that_cannot_take_the_element_still_gets_the_structure_error(
        make_estimator, make_input_fn, assert_refused):
    def model_fn(features, labels, mode, params):
        raise TypeError(f"this model wants a tensor, got {type(features).__name__}")

    estimator = make_estimator(model_fn)
    error = assert_refused(estimator, errors.InputFunctionError,
                           lambda: estimator.compile(make_input_fn(element="dict"), validate_only=True),
                           "Unsupported dataset element structure ({'x': float32[4,4]}, float32[4,1])")
    assert isinstance(error.__context__, TypeError)  # the model_fn failure stays visible in the traceback


# --------------------------------------------------------------------------- rule 3


def test_batch_without_drop_remainder_is_refused_at_the_batch_call(
        make_estimator, make_input_fn, assert_refused, input_fn_lines):
    estimator = make_estimator()
    assert_refused(estimator, errors.InputFunctionError, _train(estimator, make_input_fn(drop_remainder=False)),
                   INCONSISTENT_BATCH, f"Where: {input_fn_lines['batch']}", "float32[?,4]")


# --------------------------------------------------------------------------- rule 4


def test_finite_repeat_is_refused_for_training_at_the_repeat_call(
        make_estimator, make_input_fn, assert_refused, input_fn_lines):
    estimator = make_estimator()
    assert_refused(estimator, errors.InputFunctionError, _train(estimator, make_input_fn(repeat=2)),
                   "The training Dataset must repeat indefinitely, but it has a finite repeat(count)",
                   f"Where: {input_fn_lines['repeat']}", "repeat() with the default count=None")


def test_missing_repeat_is_refused_for_training_by_compile_even_without_a_cs_ip(
        make_estimator, make_input_fn, assert_refused):
    estimator = make_estimator(cs_ip=None)  # compile() checks every rule whatever the target
    assert_refused(estimator, errors.InputFunctionError,
                   lambda: estimator.compile(make_input_fn(repeat=False), validate_only=True),
                   "The training Dataset must repeat indefinitely, but it has no repeat()")


@pytest.mark.parametrize("repeat", [2, False])
def test_finite_data_is_fine_for_evaluation(make_estimator, make_input_fn, assert_refused, repeat):
    estimator = make_estimator()
    estimator.compile(make_input_fn(repeat=repeat), mode=ModeKeys.EVAL, validate_only=True)
    assert_refused(estimator, errors.RunArgumentError,  # every rule passed: only the checkpoint is missing
                   lambda: estimator.evaluate(make_input_fn(repeat=repeat), steps=2, use_cs=True),
                   "evaluate() on the CS system found no checkpoint")


# --------------------------------------------------------------------------- rule 5


@pytest.fixture(params=["(params, mode)", "()", "(batch_size)"])
def badly_signed_input_fn(request, make_input_fn):
    """(input_fn, its signature as the error shows it): each serves a good dataset but takes more than params."""
    good = make_input_fn()

    def with_mode(params, mode):
        return good(params)

    def no_arguments():
        return good({"batch_size": 4})

    def batch_size_only(batch_size):
        return good({"batch_size": batch_size})

    functions = {"(params, mode)": with_mode, "()": no_arguments, "(batch_size)": batch_size_only}
    return functions[request.param], request.param


def test_input_fn_takes_only_params(make_estimator, assert_refused, defined_at, badly_signed_input_fn):
    input_fn, signature = badly_signed_input_fn
    estimator = make_estimator()
    assert_refused(estimator, errors.InputFunctionError, _train(estimator, input_fn),
                   "The input function only takes a single dictionary parameter, params;",
                   f"{input_fn.__name__} takes {signature}", f"Where: {defined_at(input_fn)}")


# --------------------------------------------------------------------------- rule 11


@pytest.mark.parametrize("input_kwargs, config_kwargs", [
    ({"shuffle_seed": 5}, {}),  # shuffle(seed=...)
    ({}, {"tf_random_seed": 1}),  # a graph-level seed makes the unseeded shuffle deterministic too
])
def test_deterministic_shuffle_with_two_input_workers_is_refused_at_the_shuffle(
        make_estimator, make_input_fn, assert_refused, input_fn_lines, input_kwargs, config_kwargs):
    estimator = make_estimator(num_input_workers=2, **config_kwargs)
    assert_refused(estimator, errors.InputFunctionError, _train(estimator, make_input_fn(**input_kwargs)),
                   "Deterministic shuffle seed with 2 input workers", f"Where: {input_fn_lines['shuffle']}",
                   "Each input worker must shuffle its data differently")


def test_input_workers_from_tf_config_count_for_the_shuffle_rule(
        make_estimator, make_input_fn, assert_refused, tf_config):
    tf_config.set({"cluster": {"chief": ["localhost:2222"], "worker": ["localhost:2223", "localhost:2224"]},
                   "task": {"type": "chief", "index": 0}})
    estimator = make_estimator()
    assert_refused(estimator, errors.InputFunctionError,
                   lambda: estimator.compile(make_input_fn(shuffle_seed=5), validate_only=True),
                   "Deterministic shuffle seed with 2 input workers")


@pytest.mark.parametrize("workers, seed", [(1, 5), (2, None)])
def test_seeded_shuffle_with_one_worker_or_unseeded_with_two_is_allowed(make_estimator, make_input_fn, workers, seed):
    make_estimator(num_input_workers=workers).compile(make_input_fn(shuffle_seed=seed), validate_only=True)
