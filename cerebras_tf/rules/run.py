"""Rules on the train/evaluate/predict calls of a CS-system run.

TF records nothing about a call's arguments (hooks are Python objects), so each
problem is reported at the user's line that made the call.
"""
from __future__ import annotations

from typing import Any

from cerebras_tf.errors import CerebrasError, RunArgumentError, UnsupportedModeError
from cerebras_tf.rules.spec import hooks_not_supported
from estimator import called_from_train_and_evaluate
from estimator.source import caller_location


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
