"""Rules on the train/evaluate/predict/compile calls of a CS-system run, and on what they write to.

TF records nothing about a call's arguments (hooks are Python objects), so each
problem is reported at the user's line that made the call. Step counts follow
tf.estimator: its messages, raised (as a StepCountError, a ValueError too)
before anything else, as the Estimator checks them first. The model_dir and
compile_dir checks run before anything is written: a run must not leave half
its files behind and then fail on a directory it cannot use.
"""
from __future__ import annotations

import numbers
import os
from typing import Any

from cerebras_tf.errors import (
    CerebrasError,
    EstimatorArgumentError,
    ModelDirError,
    RunArgumentError,
    StepCountError,
    UnsupportedModeError,
)
from cerebras_tf.rules.spec import hooks_not_supported
from estimator import ModeKeys, called_from_train_and_evaluate
from estimator.source import caller_location

# compile(mode=...) takes the Estimator's three modes.
COMPILE_MODES = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT)


def check_train_call(hooks: Any, steps: Any, max_steps: Any, saving_listeners: Any) -> list[CerebrasError]:
    """train() on the CS system: no train_and_evaluate, no hooks/listeners, a step count."""
    where = caller_location()
    if called_from_train_and_evaluate():
        return [
            UnsupportedModeError(
                "tf.estimator.train_and_evaluate is not supported on the CS system: the fabric is programmed "
                "once for training and cannot switch to an evaluation program in the same run.",
                fix="Train on the CS system, then evaluate the checkpoint in a separate run "
                "(e.g. run.py --mode train, then --mode eval), or run train_and_evaluate on CPU/GPU (cs_ip=None).",
                where=where,
            )
        ]
    problems = hooks_not_supported("train(hooks=...)", hooks, where)
    problems += hooks_not_supported("train(saving_listeners=...)", saving_listeners, where)
    if steps is None and max_steps is None:
        problems.append(
            RunArgumentError(
                "train() on the CS system needs steps or max_steps: the dataset repeats forever, so the "
                "number of steps is what ends training.",
                fix="Call train(input_fn, max_steps=N) (or steps=N).",
                where=where,
            )
        )
    return problems


def check_evaluate_call(hooks: Any, steps: Any) -> list[CerebrasError]:
    """evaluate() on the CS system: no hooks, an explicit number of steps."""
    where = caller_location()
    problems = hooks_not_supported("evaluate(hooks=...)", hooks, where)
    if steps is None:
        problems.append(
            RunArgumentError(
                "evaluate() on the CS system needs an explicit number of steps.",
                fix="Call evaluate(input_fn, steps=N), or evaluate on CPU/GPU with use_cs=False.",
                where=where,
            )
        )
    return problems


def check_predict_call(hooks: Any) -> list[CerebrasError]:
    """predict() on the CS system: no hooks."""
    return hooks_not_supported("predict(hooks=...)", hooks, caller_location())


def _is_count(value: Any) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_step_count(name: str, value: Any, fix: str) -> list[CerebrasError]:
    """`value` (a step count the call was given, not None) is an integer > 0.

    tf.estimator's message for a count <= 0 ("Must specify steps > 0, given: 0"); a float, a string or a
    bool is refused too (tf.estimator trains 2 steps for steps=1.5, and fails on steps='2' with a raw TypeError).
    """
    if _is_count(value) and value > 0:
        return []
    if _is_count(value) or (isinstance(value, numbers.Real) and not isinstance(value, bool) and value <= 0):
        message = f"Must specify {name} > 0, given: {value}"
    else:
        message = f"Must specify {name} > 0 as an integer, given: {value!r} ({type(value).__name__})"
    return [StepCountError(message, where=caller_location(), fix=fix)]


def check_train_steps(steps: Any, max_steps: Any) -> list[CerebrasError]:
    """train()'s steps/max_steps as tf.estimator checks them: not both, each an integer > 0."""
    if steps is not None and max_steps is not None:
        return [StepCountError("Can not provide both steps and max_steps.", where=caller_location(),
                               fix="Give max_steps=N (train until global step N) or steps=N (N more steps).")]
    fix = "Call train(input_fn, max_steps=N) (train until global step N) or steps=N (N more steps), N an int > 0."
    if steps is not None:
        return check_step_count("steps", steps, fix)
    if max_steps is not None:
        return check_step_count("max_steps", max_steps, fix)
    return []


def check_evaluate_steps(steps: Any) -> list[CerebrasError]:
    """evaluate()'s steps, when given, an integer > 0 (tf.estimator's check)."""
    if steps is None:
        return []
    return check_step_count("steps", steps, "Call evaluate(input_fn, steps=N) with an int N > 0: the number of "
                                             "batches to evaluate.")


def check_num_samples(num_samples: Any) -> list[CerebrasError]:
    """predict()'s num_samples, when given, an integer > 0 (in tf.estimator's words)."""
    if num_samples is None:
        return []
    return check_step_count("num_samples", num_samples, "Call predict(input_fn, num_samples=N) with an int N > 0, "
                                                         "or leave it out to predict until the data ends.")


def check_compile_mode(mode: Any) -> list[CerebrasError]:
    """compile(mode=...) is one of the Estimator's modes."""
    if isinstance(mode, str) and mode in COMPILE_MODES:
        return []
    valid = ", ".join(repr(m) for m in COMPILE_MODES)
    return [EstimatorArgumentError(
        f"compile(mode={mode!r}): unknown mode; the valid modes are {valid}.", where=caller_location(),
        fix="Pass mode=tf.estimator.ModeKeys.TRAIN (the default), ModeKeys.EVAL or ModeKeys.PREDICT.")]


def check_params(params: Any, where: str | None) -> list[CerebrasError]:
    """params is a dict: the CS system calls input_fn(params) and model_fn with it (and copies it for every
    input worker). tf.estimator passes any value on; a list or a string fails later, inside input_fn or the
    input stream."""
    if isinstance(params, dict):
        return []
    text = repr(params)
    return [EstimatorArgumentError(
        f"params must be a dict, got {type(params).__name__} {text if len(text) <= 60 else text[:57] + '...'}.",
        where=where,
        fix="Pass CerebrasEstimator(params={...}): a dict of everything input_fn and model_fn read "
            "(e.g. {'batch_size': 32}).")]


def check_output_dirs(model_dir: str, compile_dir: str | None) -> list[CerebrasError]:
    """model_dir (checkpoints, summaries, the placement image) and compile_dir (the compiled artifact) are
    directories this process can write to, or can be created.

    A compile_dir inside a model_dir already refused is not reported again.
    """
    problems = _unusable_dir("model_dir", model_dir, "CerebrasEstimator(model_dir=...)")
    if compile_dir is not None and not (problems and _inside(compile_dir, model_dir)):
        problems += _unusable_dir("compile_dir", compile_dir, "CerebrasEstimator(compile_dir=...)")
    return problems


def _inside(path: str, directory: str) -> bool:
    path, directory = os.path.abspath(path), os.path.abspath(directory)
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _unusable_dir(name: str, path: str, argument: str) -> list[CerebrasError]:
    """A ModelDirError if `path` is not a writable directory and cannot be created as one (remote file systems,
    'scheme://...', are left to TensorFlow)."""
    if "://" in path:
        return []
    full = os.path.abspath(path)
    fix = (f"Pass {argument} a directory this process can write to, or a path where one can be created "
           "(every missing parent too).")
    if os.path.exists(full):
        if not os.path.isdir(full):
            return [ModelDirError(f"{name} {full} is a regular file, not a directory.", fix=fix)]
        if not os.access(full, os.W_OK | os.X_OK):
            return [ModelDirError(f"{name} {full} is not writable by this process.",
                                  fix=f"Make it writable (chmod u+w), or {fix[0].lower()}{fix[1:]}")]
        return []
    existing = os.path.dirname(full)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return [ModelDirError(f"{name} {full} cannot be created: {existing} is a regular file.", fix=fix)]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [ModelDirError(f"{name} {full} cannot be created: {existing} is not writable by this process.",
                              fix=fix)]
    return []
