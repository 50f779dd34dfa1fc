"""Hook plumbing: argument checks, and the hooks that end train and evaluate runs.

The hooks themselves are TF's (tf.compat.v1.train.*, which tf.estimator
re-exports under its own name: tf.estimator.StopAtStepHook is
tf.compat.v1.train.StopAtStepHook); this module names them and adds the
Estimator's own: the argument checks with tf.estimator's messages, and the
hook that stops an evaluation after N batches.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import tensorflow as tf

SessionRunHook = tf.compat.v1.train.SessionRunHook
CheckpointSaverListener = tf.compat.v1.train.CheckpointSaverListener
CheckpointSaverHook = tf.compat.v1.train.CheckpointSaverHook
FeedFnHook = tf.compat.v1.train.FeedFnHook
FinalOpsHook = tf.compat.v1.train.FinalOpsHook
GlobalStepWaiterHook = tf.compat.v1.train.GlobalStepWaiterHook
LoggingTensorHook = tf.compat.v1.train.LoggingTensorHook
NanLossDuringTrainingError = tf.compat.v1.train.NanLossDuringTrainingError
NanTensorHook = tf.compat.v1.train.NanTensorHook
ProfilerHook = tf.compat.v1.train.ProfilerHook
SecondOrStepTimer = tf.compat.v1.train.SecondOrStepTimer
SessionRunArgs = tf.compat.v1.train.SessionRunArgs
SessionRunContext = tf.compat.v1.train.SessionRunContext
SessionRunValues = tf.compat.v1.train.SessionRunValues
StepCounterHook = tf.compat.v1.train.StepCounterHook
StopAtStepHook = tf.compat.v1.train.StopAtStepHook
SummarySaverHook = tf.compat.v1.train.SummarySaverHook


def check_hooks(hooks: Iterable[Any] | None) -> list[Any]:
    """`hooks` as a list, every one a SessionRunHook."""
    hooks = list(hooks or [])
    for hook in hooks:
        if not isinstance(hook, SessionRunHook):
            raise TypeError(f"Hooks must be a SessionRunHook, given: {hook}")
    return hooks


def check_listeners(listeners: Iterable[Any] | None) -> list[Any]:
    """`saving_listeners` as a list, every one a CheckpointSaverListener."""
    listeners = list(listeners or [])
    for listener in listeners:
        if not isinstance(listener, CheckpointSaverListener):
            raise TypeError(f"saving_listeners must be a list of CheckpointSaverListener, given: {listener}")
    return listeners


def train_step_hooks(steps: int | None, max_steps: int | None) -> list[Any]:
    """The hook ending training after `steps` more steps or at global step `max_steps` (none: until input ends)."""
    if steps is None and max_steps is None:
        return []
    return [tf.compat.v1.train.StopAtStepHook(steps, max_steps)]


def eval_step_counter() -> Any:
    """The graph's evaluation-step counter: a local int64 variable in the EVAL_STEP collection."""
    graph = tf.compat.v1.get_default_graph()
    existing = graph.get_collection(tf.compat.v1.GraphKeys.EVAL_STEP)
    if len(existing) > 1:
        raise ValueError("Multiple tensors added to tf.GraphKeys.EVAL_STEP")
    if existing:
        return existing[0]
    return tf.compat.v1.get_variable(
        "eval_step", shape=[], dtype=tf.int64, initializer=tf.compat.v1.zeros_initializer(), trainable=False,
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES, tf.compat.v1.GraphKeys.EVAL_STEP])


class StopAfterNEvalsHook(tf.compat.v1.train.SessionRunHook):
    """Stops an evaluation after `num_evals` batches (None: when the input ends) and logs the progress."""

    def __init__(self, num_evals: int | None, log_progress: bool = True) -> None:
        self._num_evals = num_evals
        self._log_progress = log_progress
        self._log_every = 1 if num_evals is None or num_evals < 20 else math.floor(num_evals / 10.0)
        self._evals_completed: Any = None

    def set_evals_completed_tensor(self, tensor: Any) -> None:
        """The tensor counting batches evaluated so far (the eval step after this batch's update)."""
        self._evals_completed = tensor

    def before_run(self, run_context: Any) -> Any:
        return tf.compat.v1.train.SessionRunArgs({"evals_completed": self._evals_completed})

    def after_run(self, run_context: Any, run_values: Any) -> None:
        done = run_values.results["evals_completed"]
        if self._log_progress:
            if self._num_evals is None:
                tf.compat.v1.logging.info("Evaluation [%d]", done)
            elif done % self._log_every == 0 or done == self._num_evals:
                tf.compat.v1.logging.info("Evaluation [%d/%d]", done, self._num_evals)
        if self._num_evals is not None and done >= self._num_evals:
            run_context.request_stop()
