"""Capture a model for a mode and apply every CS-system rule, reporting all problems at once."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import tensorflow as tf

from cerebras_tf import rules
from cerebras_tf.amp.target import capturing_for_cs_system
from cerebras_tf.errors import CerebrasError, raise_problems
from cerebras_tf.settings import CSSettings
from estimator import (
    CapturedInput,
    CapturedModel,
    DatasetBuildError,
    EstimatorBase,
    capture_input,
    capture_model,
    dataset_call_failure,
    inspect_dataset,
)

_log = tf.compat.v1.logging


@contextlib.contextmanager
def _tf_op_determinism_off() -> Iterator[None]:
    """Capture the model as TensorFlow builds it without op determinism (TF_DETERMINISTIC_OPS=1, or
    tf.config.experimental.enable_op_determinism), and restore the setting after.

    TF's determinism swaps some ops for GPU-deterministic compositions, e.g. sparse softmax cross-entropy for
    a log_softmax + gather whose gradient TF cannot even build at the Model Zoo's real sizes (its segment
    count, batch x sequence x vocabulary, overflows int32: R1.7's GPT-3 sets TF_DETERMINISTIC_OPS with
    tf_random_seed). The simulated system's kernels are deterministic whatever TF's setting; CPU/GPU runs are
    untouched."""
    from tensorflow.python.framework import config as tf_config  # the setting's only reader and writer

    enabled = tf_config.is_op_determinism_enabled()
    if enabled:
        tf_config.disable_op_determinism()
    try:
        yield
    finally:
        if enabled:
            tf_config.enable_op_determinism()


def _estimator_can_call(input_fn: Callable[..., Any]) -> bool:
    """Whether the Estimator can call input_fn at all (to capture it and report every other problem too):
    the input_fn signature rule, with the arguments the Estimator passes instead of the CS system's."""
    return callable(input_fn) and not rules.input.unfilled_input_fn_parameters(
        input_fn, rules.input.ESTIMATOR_INPUT_FN_ARGS)


def precheck(
    estimator: EstimatorBase,
    input_fn: Callable[..., Any],
    mode: str,
    earlier_problems: Sequence[CerebrasError] = (),
    settings: CSSettings | None = None,
) -> CapturedModel:
    """Capture input_fn + model_fn for `mode` and check them against the CS-system rules.

    Raises the single problem found, or a MultipleProblemsError listing all of
    them (`earlier_problems`, e.g. from the call's arguments, come first); when
    input_fn is not callable as input_fn(params), or params is not a dict
    (rules.run.check_params, among the earlier problems), before calling it.
    `settings` are the run's (default: resolved from estimator.config now).
    Writes nothing to disk.
    """
    if settings is None:
        settings = CSSettings.resolve(estimator.config)
    problems = list(earlier_problems)
    problems += rules.config.check_run_config(settings)
    problems += rules.input.check_input_fn_signature(input_fn)
    if not _estimator_can_call(input_fn) or not isinstance(estimator.params, dict):
        raise_problems(problems)  # input_fn(params) cannot run as the CS system runs it: report what is known

    failed = None
    try:
        captured_input = capture_input(estimator, input_fn, mode)
    except Exception as error:
        failed = dataset_call_failure(error)  # e.g. batch(-1): TF's bare ValueError from inside tf.data
        if failed is None:
            raise
    if failed is not None:  # raised outside the handler: the error names the call, TF's message is in it
        raise_problems(problems + rules.input.check_dataset_builds(failed))
    problems += rules.input.check_returns_dataset(captured_input, input_fn)
    model_fn = estimator.user_model_fn
    model = None
    try:
        # amp.optimizer_step leaves loss scaling to the executor; TF's GPU-deterministic op variants are not the
        # model the wafer runs
        with capturing_for_cs_system(), _tf_op_determinism_off():
            model = capture_model(estimator, captured_input, estimator.call_user_model_fn_unchecked)
    except Exception as error:
        spec_problems = rules.spec.model_fn_spec_error(error, mode, model_fn)  # tf.estimator refused the spec
        if not spec_problems:
            # The failure may follow from a rule broken by the input (e.g. sparse features, or an element
            # that is not (features, labels)): report those problems first (the failure stays their context).
            raise_problems(problems + _dataset_problems(captured_input, settings))
            raise
    else:  # model_fn returned: is it a spec at all? (the other spec rules cannot read anything else)
        spec_problems = rules.spec.check_model_fn_result(model.spec, mode, model_fn)
    if spec_problems:  # raised outside the handler: the error says it all, with TF's message
        raise_problems(problems + spec_problems + _dataset_problems(captured_input, settings))
    assert model is not None
    if not settings.summaries:
        _skip_summaries(model)
    problems += rules.spec.check_spec(model.spec, mode, model_fn,
                                      host_runs_eval_metric_ops=settings.host_runs_eval_metric_ops)
    problems += _dataset_problems(captured_input, settings)  # after model_fn, so op ids match plain TF
    raise_problems(problems)
    return model


def _skip_summaries(model: CapturedModel) -> None:
    """Leave model_fn's summaries out of the program (cs1_disable_summaries()), saying so once."""
    summaries = model.graph.get_collection_ref(tf.compat.v1.GraphKeys.SUMMARIES)
    if summaries:
        _log.info("%d summaries of model_fn are not computed on the system: cs1_disable_summaries() is in "
                  "effect.", len(summaries))
        del summaries[:]


def _dataset_problems(captured_input: CapturedInput, settings: CSSettings) -> list[CerebrasError]:
    """The rules on the returned dataset (none if input_fn did not return one).

    The input-worker rules run here, once, on the dataset already captured:
    the input stream calls input_fn only to read it.
    """
    if not captured_input.is_dataset:
        return []
    with captured_input.graph.as_default():
        try:
            info = inspect_dataset(captured_input.result, settings.session_config)
        except DatasetBuildError as error:  # e.g. batch(0): no other dataset rule can run
            return rules.input.check_dataset_builds(error)
    return (
        rules.input.check_element_structure(info)
        + rules.input.check_fixed_batch(info)
        + rules.input.check_repeats_forever(info, captured_input.mode)
        + rules.input.check_shuffle_seeds(info, settings.input_workers)
        + rules.input.check_remote_python_functions(info, settings.input_workers, captured_input.mode)
    )
