"""CS-system rules on the model_fn's spec and the run calls (rules 6, 7, 12), and compile()'s report of all problems."""
from __future__ import annotations

import re

import pytest
import tensorflow as tf

import estimator as estimator_api
from estimator import ModeKeys
from cerebras_tf import errors


EVAL_METRIC_OPS_IN_TRAINING = "[Unsupported TensorFlow] Detected unsupported eval_metric_ops in CS system training run."


class StepCounterHook(tf.compat.v1.train.SessionRunHook):
    pass


class ChiefHook(tf.compat.v1.train.SessionRunHook):
    pass


class SaveListener(tf.compat.v1.train.CheckpointSaverListener):
    pass


def _named(hook_type: type) -> str:
    return f"{hook_type.__name__} ({hook_type.__module__})"


# --------------------------------------------------------------------------- rule 6


@pytest.mark.parametrize("argument, hook_type", [("hooks", StepCounterHook), ("saving_listeners", SaveListener)])
def test_train_hooks_and_saving_listeners_are_refused_by_name(
        make_estimator, make_input_fn, assert_refused, argument, hook_type):
    estimator = make_estimator()
    assert_refused(estimator, errors.HookError,
                   lambda: estimator.train(make_input_fn(), max_steps=5, **{argument: [hook_type()]}),
                   f"User-defined hooks are not supported on the CS system: train({argument}=...) = "
                   f"[{_named(hook_type)}]", "not initialized", "host_call")


def test_evaluate_hooks_are_refused_by_name(make_estimator, make_input_fn, assert_refused):
    estimator = make_estimator()
    assert_refused(estimator, errors.HookError,
                   lambda: estimator.evaluate(make_input_fn(), steps=2, hooks=[StepCounterHook()], use_cs=True),
                   f"evaluate(hooks=...) = [{_named(StepCounterHook)}]")


@pytest.mark.parametrize("field, mode", [
    ("training_hooks", ModeKeys.TRAIN),
    ("training_chief_hooks", ModeKeys.TRAIN),
    ("evaluation_hooks", ModeKeys.EVAL),
])
def test_spec_hooks_are_refused_by_name(
        make_estimator, make_model_fn, make_input_fn, assert_refused, defined_at, field, mode):
    model_fn = make_model_fn(**{field: [StepCounterHook(), ChiefHook()]})
    estimator = make_estimator(model_fn)
    run = {
        ModeKeys.TRAIN: lambda: estimator.train(make_input_fn(), max_steps=5),
        ModeKeys.EVAL: lambda: estimator.evaluate(make_input_fn(), steps=2, use_cs=True),
    }[mode]
    assert_refused(estimator, errors.HookError, run,
                   f"EstimatorSpec.{field} = [{_named(StepCounterHook)}, {_named(ChiefHook)}]",
                   f"Where: {defined_at(model_fn)}")


# --------------------------------------------------------------------------- rule 7


def test_eval_metric_ops_are_refused_in_a_cs_training_run(
        make_estimator, make_model_fn, make_input_fn, assert_refused, model_fn_lines):
    model_fn = make_model_fn(eval_metric_ops=True)
    estimator = make_estimator(model_fn)
    assert_refused(estimator, errors.EvalMetricOpsError, lambda: estimator.train(make_input_fn(), max_steps=5),
                   EVAL_METRIC_OPS_IN_TRAINING, f"Where: {model_fn_lines['metric']}\n", "host_call",
                   "['mean_label']")


def test_eval_metric_ops_are_refused_in_a_cs_evaluation_run(
        make_estimator, make_model_fn, make_input_fn, assert_refused):
    estimator = make_estimator(make_model_fn(eval_metric_ops=True))
    assert_refused(estimator, errors.EvalMetricOpsError,
                   lambda: estimator.evaluate(make_input_fn(), steps=2, use_cs=True),
                   "Detected unsupported eval_metric_ops in CS system evaluation run.")


# --------------------------------------------------------------------------- rule 12 and run arguments


@pytest.mark.parametrize("cluster", [True, False])  # TF_CONFIG's chief takes run_chief; without, run_local
def test_train_and_evaluate_is_refused_on_cs(make_estimator, make_input_fn, assert_refused, tf_config, cluster):
    refused = "[Unsupported TensorFlow] tf.estimator.train_and_evaluate is not supported on the CS system"
    if cluster:
        error_type, fragments = errors.UnsupportedModeError, [refused]
    else:  # the missing TF_CONFIG is reported with it
        tf_config.clear()
        error_type = errors.MultipleProblemsError
        fragments = [f"1. {refused}", "2. [Unsupported Config] The TF_CONFIG environment variable must be set"]
    estimator = make_estimator()
    train_spec = estimator_api.TrainSpec(make_input_fn(), max_steps=5)
    eval_spec = estimator_api.EvalSpec(make_input_fn(repeat=False), steps=2)
    assert_refused(estimator, error_type, lambda: estimator_api.train_and_evaluate(estimator, train_spec, eval_spec),
                   *fragments)


def test_train_needs_steps_or_max_steps(make_estimator, make_input_fn, assert_refused):
    estimator = make_estimator()
    assert_refused(estimator, errors.RunArgumentError, lambda: estimator.train(make_input_fn()),
                   "[Invalid Run] train() on the CS system needs steps or max_steps")


def test_evaluate_on_cs_needs_steps(make_estimator, make_input_fn, assert_refused):
    estimator = make_estimator()
    assert_refused(estimator, errors.RunArgumentError,
                   lambda: estimator.evaluate(make_input_fn(repeat=False), use_cs=True),
                   "evaluate() on the CS system needs an explicit number of steps")


def test_predict_hooks_are_refused_on_cs(make_estimator, make_input_fn, assert_refused):
    estimator = make_estimator()
    assert_refused(estimator, errors.HookError,
                   lambda: estimator.predict(make_input_fn(), hooks=[StepCounterHook()], use_cs=True),
                   "predict(hooks=...)")


# --------------------------------------------------------------------------- all problems at once


def _assert_numbered(error: errors.MultipleProblemsError, expected_types: list[type]) -> None:
    """The message lists every problem, numbered in order, and the problems have the expected types."""
    message = str(error)
    assert [type(problem) for problem in error.problems] == expected_types
    assert message.startswith(f"{len(expected_types)} problems prevent running this model on the CS system:\n")
    for number, problem in enumerate(error.problems, start=1):
        first_line = problem.render().splitlines()[0]
        assert f"\n{number}. {first_line}\n" in message
    assert not re.search(rf"\n{len(expected_types) + 1}\. ", message)


def test_compile_reports_every_problem_in_one_numbered_list(
        make_estimator, make_model_fn, make_input_fn, assert_refused, input_fn_lines):
    bad_dataset = make_input_fn(shuffle_seed=5, repeat=2, drop_remainder=False)

    def input_fn(params, mode):
        return bad_dataset(params)

    estimator = make_estimator(make_model_fn(eval_metric_ops=True, training_hooks=[StepCounterHook()]),
                               protocol="grpc", save_checkpoints_steps=10, num_input_workers=2)
    error = assert_refused(
        estimator, errors.MultipleProblemsError, lambda: estimator.compile(input_fn, validate_only=True),
        "protocol='grpc'", "save_checkpoints_steps=10", "input_fn takes (params, mode)",
        EVAL_METRIC_OPS_IN_TRAINING, f"EstimatorSpec.training_hooks = [{_named(StepCounterHook)}]",
        "Inconsistent batch sizes detected", f"Where: {input_fn_lines['batch']}",
        "must repeat indefinitely", f"Where: {input_fn_lines['repeat']}",
        "Deterministic shuffle seed with 2 input workers", f"Where: {input_fn_lines['shuffle']}",
    )
    _assert_numbered(error, [errors.ConfigError, errors.ConfigError, errors.InputFunctionError,
                             errors.EvalMetricOpsError, errors.HookError, errors.InputFunctionError,
                             errors.InputFunctionError, errors.InputFunctionError])


def test_train_reports_its_argument_problems_with_the_models(
        make_estimator, make_input_fn, assert_refused, tf_config):
    tf_config.clear()
    estimator = make_estimator()
    error = assert_refused(
        estimator, errors.MultipleProblemsError,
        lambda: estimator.train(make_input_fn(drop_remainder=False), hooks=[StepCounterHook()]),
        "train(hooks=...)", "needs steps or max_steps", "TF_CONFIG", "Inconsistent batch sizes detected")
    _assert_numbered(error, [errors.HookError, errors.RunArgumentError, errors.ConfigError,
                             errors.InputFunctionError])


# --------------------------------------------------------------------------- a model that passes every rule


def test_a_model_that_passes_every_rule_validates_and_reaches_the_system(
        make_estimator, make_model_fn, make_input_fn, assert_refused):
    estimator = make_estimator(make_model_fn(host_call="list"))  # metrics through host_call are fine on CS
    result = estimator.compile(make_input_fn(), validate_only=True)
    assert result.validate_only and result.artifact_dir is None
    estimator.train(make_input_fn(), max_steps=5)
    assert tf.train.latest_checkpoint(estimator.model_dir).endswith("model.ckpt-5")
