"""Early stopping (tf.estimator.experimental's): hooks that end training when a predicate over the evaluations
says so.

make_early_stopping_hook(estimator, should_stop_fn) calls should_stop_fn on the
chief every run_every_secs seconds (or run_every_steps steps); once it returns
True the chief sets a `signal_early_stopping/STOP` variable and stops, and
other tasks, which read that variable every step, stop too. The stop_if_*
helpers build should_stop_fn from the evaluation metrics Estimator.evaluate
(or train_and_evaluate) wrote to the eval directory's event files.
"""
from __future__ import annotations

import collections
import operator
import os
from typing import Any, Callable, Iterator

import tensorflow as tf

from estimator.runtime.estimator import is_estimator

_EVENT_FILE_GLOB_PATTERN = "events.out.tfevents.*"
_MULTI_WORKER_STRATEGIES = ("CollectiveAllReduceStrategy", "MultiWorkerMirroredStrategy")


def make_early_stopping_hook(estimator: Any, should_stop_fn: Callable[[], bool], run_every_secs: float | None = 60,
                             run_every_steps: int | None = None) -> Any:
    """A hook that stops training once should_stop_fn() (no arguments) returns True.

    The chief calls it every run_every_secs seconds or every run_every_steps
    steps (set exactly one); other tasks stop when the chief has. With a
    train_distribute strategy, every replica calls it (steps only) and the
    votes are summed.
    """
    if not is_estimator(estimator):
        raise TypeError(f"`estimator` must have type `tf.estimator.Estimator`. Got: {type(estimator)}")
    if run_every_secs is not None and run_every_steps is not None:
        raise ValueError("Only one of `run_every_secs` and `run_every_steps` must be set.")
    if estimator.config.train_distribute:
        # tf.estimator 2.15 takes this branch for any train_distribute strategy (its check of the strategy's
        # class name never fails), not only MultiWorkerMirroredStrategy: so does this runtime.
        if run_every_secs:
            raise ValueError("run_every_secs should not be set when using MultiWorkerMirroredStrategy.")
        return _MultiWorkerEarlyStoppingHook(should_stop_fn, run_every_steps)
    if estimator.config.is_chief:
        return _StopOnPredicateHook(should_stop_fn, run_every_secs, run_every_steps)
    return _CheckForStoppingHook()


def stop_if_higher_hook(estimator: Any, metric_name: str, threshold: float, eval_dir: str | None = None,
                        min_steps: int = 0, run_every_secs: float | None = 60,
                        run_every_steps: int | None = None) -> Any:
    """Stop once an evaluation at global step >= min_steps has `metric_name` above `threshold`."""
    return _stop_if_threshold_crossed_hook(estimator, metric_name, threshold, True, eval_dir, min_steps,
                                           run_every_secs, run_every_steps)


def stop_if_lower_hook(estimator: Any, metric_name: str, threshold: float, eval_dir: str | None = None,
                       min_steps: int = 0, run_every_secs: float | None = 60,
                       run_every_steps: int | None = None) -> Any:
    """Stop once an evaluation at global step >= min_steps has `metric_name` below `threshold`."""
    return _stop_if_threshold_crossed_hook(estimator, metric_name, threshold, False, eval_dir, min_steps,
                                           run_every_secs, run_every_steps)


def stop_if_no_increase_hook(estimator: Any, metric_name: str, max_steps_without_increase: int,
                             eval_dir: str | None = None, min_steps: int = 0, run_every_secs: float | None = 60,
                             run_every_steps: int | None = None) -> Any:
    """Stop once `metric_name` has not risen above its best for max_steps_without_increase global steps."""
    return _stop_if_no_metric_improvement_hook(estimator, metric_name, max_steps_without_increase, True, eval_dir,
                                               min_steps, run_every_secs, run_every_steps)


def stop_if_no_decrease_hook(estimator: Any, metric_name: str, max_steps_without_decrease: int,
                             eval_dir: str | None = None, min_steps: int = 0, run_every_secs: float | None = 60,
                             run_every_steps: int | None = None) -> Any:
    """Stop once `metric_name` has not fallen below its best for max_steps_without_decrease global steps."""
    return _stop_if_no_metric_improvement_hook(estimator, metric_name, max_steps_without_decrease, False, eval_dir,
                                               min_steps, run_every_secs, run_every_steps)


def read_eval_metrics(eval_dir: str) -> dict[int, dict[str, float]]:
    """{global step: {metric: value}}, in step order, from the scalar summaries of eval_dir's event files."""
    by_step: dict[int, dict[str, float]] = collections.defaultdict(dict)
    for event in _summaries(eval_dir):
        if not event.HasField("summary"):
            continue
        metrics = {value.tag: value.simple_value for value in event.summary.value if value.HasField("simple_value")}
        if metrics:
            by_step[event.step].update(metrics)
    return collections.OrderedDict(sorted(by_step.items()))


def _summaries(eval_dir: str) -> Iterator[Any]:
    """The events of eval_dir's event files; a corrupt file is read up to the damage (with a warning)."""
    if not tf.io.gfile.exists(eval_dir):
        return
    for path in tf.io.gfile.glob(os.path.join(eval_dir, _EVENT_FILE_GLOB_PATTERN)):
        try:
            yield from tf.compat.v1.train.summary_iterator(path)
        except tf.errors.DataLossError as e:
            tf.compat.v1.logging.warning(
                "Skipping rest of the file due to encountering data corruption error; file path: %s; original "
                "error raised by `tf.train.summary_iterator`: %s", path, e)


def _stop_if_threshold_crossed_hook(estimator: Any, metric_name: str, threshold: float, higher_is_better: bool,
                                    eval_dir: str | None, min_steps: int, run_every_secs: float | None,
                                    run_every_steps: int | None) -> Any:
    directory = eval_dir if eval_dir is not None else estimator.eval_dir()
    better = operator.gt if higher_is_better else operator.lt
    comparison = "greater than" if higher_is_better else "less than"

    def threshold_crossed() -> bool:
        for step, metrics in read_eval_metrics(directory).items():
            if step < min_steps:
                continue
            value = metrics[metric_name]
            if better(value, threshold):
                tf.compat.v1.logging.info(
                    'At step %s, metric "%s" has value %s which is %s the configured threshold (%s) for early '
                    "stopping.", step, metric_name, value, comparison, threshold)
                return True
        return False

    return make_early_stopping_hook(estimator=estimator, should_stop_fn=threshold_crossed,
                                    run_every_secs=run_every_secs, run_every_steps=run_every_steps)


def _stop_if_no_metric_improvement_hook(estimator: Any, metric_name: str, max_steps_without_improvement: int,
                                        higher_is_better: bool, eval_dir: str | None, min_steps: int,
                                        run_every_secs: float | None, run_every_steps: int | None) -> Any:
    directory = eval_dir if eval_dir is not None else estimator.eval_dir()
    better = operator.gt if higher_is_better else operator.lt
    direction = "increase" if higher_is_better else "decrease"

    def no_improvement() -> bool:
        best_value, best_step = None, 0
        for step, metrics in read_eval_metrics(directory).items():
            if step < min_steps:
                continue
            value = metrics[metric_name]
            if best_value is None or better(value, best_value):
                best_value, best_step = value, step
            if step - best_step >= max_steps_without_improvement:
                tf.compat.v1.logging.info(
                    'No %s in metric "%s" for %s steps, which is greater than or equal to max steps (%s) configured '
                    "for early stopping.", direction, metric_name, step - best_step, max_steps_without_improvement)
                return True
        return False

    return make_early_stopping_hook(estimator=estimator, should_stop_fn=no_improvement,
                                    run_every_secs=run_every_secs, run_every_steps=run_every_steps)


def _get_or_create_stop_var() -> Any:
    """The graph's `signal_early_stopping/STOP` (bool, global, not trainable): the chief's stop request."""
    with tf.compat.v1.variable_scope(name_or_scope="signal_early_stopping", values=[],
                                     reuse=tf.compat.v1.AUTO_REUSE):
        return tf.compat.v1.get_variable(
            name="STOP", shape=[], dtype=tf.dtypes.bool, initializer=tf.compat.v1.initializers.constant(False),
            collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES], trainable=False)


class _StopOnPredicateHook(tf.compat.v1.train.SessionRunHook):
    """The chief's: calls should_stop_fn on its timer; when it says stop, sets STOP and requests a stop."""

    def __init__(self, should_stop_fn: Callable[[], bool], run_every_secs: float | None = 60,
                 run_every_steps: int | None = None) -> None:
        if not callable(should_stop_fn):
            raise TypeError("`should_stop_fn` must be callable.")
        self._should_stop_fn = should_stop_fn
        self._timer = tf.compat.v1.train.SecondOrStepTimer(every_secs=run_every_secs, every_steps=run_every_steps)
        self._global_step_tensor: Any = None
        self._stop_var: Any = None
        self._stop_op: Any = None

    def begin(self) -> None:
        self._global_step_tensor = tf.compat.v1.train.get_global_step()
        self._stop_var = _get_or_create_stop_var()
        self._stop_op = tf.compat.v1.assign(self._stop_var, True)

    def before_run(self, run_context: Any) -> Any:
        return tf.compat.v1.train.SessionRunArgs(self._global_step_tensor)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        global_step = run_values.results
        if self._timer.should_trigger_for_step(global_step):
            self._timer.update_last_triggered_step(global_step)
            if self._should_stop_fn():
                tf.compat.v1.logging.info("Requesting early stopping at global step %d", global_step)
                run_context.session.run(self._stop_op)
                run_context.request_stop()


class _CheckForStoppingHook(tf.compat.v1.train.SessionRunHook):
    """A non-chief task's: stops once the chief has set STOP."""

    def __init__(self) -> None:
        self._stop_var: Any = None

    def begin(self) -> None:
        self._stop_var = _get_or_create_stop_var()

    def before_run(self, run_context: Any) -> Any:
        return tf.compat.v1.train.SessionRunArgs(self._stop_var)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if run_values.results:
            tf.compat.v1.logging.info("Early stopping requested, suspending run.")
            run_context.request_stop()


class _MultiWorkerEarlyStoppingHook(tf.compat.v1.train.SessionRunHook):
    """With a distribute strategy: every replica adds its vote (1: stop) to a summed STOP variable on its
    timer (steps only); all stop once the sum is positive."""

    def __init__(self, should_stop_fn: Callable[[], bool], run_every_steps: int | None = None) -> None:
        if not callable(should_stop_fn):
            raise TypeError("`should_stop_fn` must be callable.")
        self._should_stop_fn = should_stop_fn
        self._timer = tf.compat.v1.train.SecondOrStepTimer(every_secs=None, every_steps=run_every_steps)
        self._global_step_tensor: Any = None
        self._stop_var: Any = None
        self._stop_op: Any = None
        self._stop_placeholder: Any = None

    def begin(self) -> None:
        self._global_step_tensor = tf.compat.v1.train.get_global_step()
        with tf.compat.v1.variable_scope(name_or_scope="signal_early_stopping", values=[],
                                         reuse=tf.compat.v1.AUTO_REUSE):
            self._stop_var = tf.compat.v1.get_variable(
                name="STOP", shape=[], dtype=tf.dtypes.int32, initializer=tf.compat.v1.initializers.constant(0),
                collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES],
                synchronization=tf.VariableSynchronization.ON_WRITE,
                aggregation=tf.compat.v1.VariableAggregation.SUM, trainable=False)
        assert tf.distribute.in_cross_replica_context()

        def add_vote(variable: Any) -> Any:
            placeholder = tf.compat.v1.placeholder_with_default(0, (), name="stop_value")
            if self._stop_placeholder is None:
                self._stop_placeholder = placeholder
            return variable.assign_add(placeholder)

        self._stop_op = tf.distribute.get_strategy().run(add_vote, args=(self._stop_var,))

    def before_run(self, run_context: Any) -> Any:
        return tf.compat.v1.train.SessionRunArgs({"global_step": self._global_step_tensor,
                                                  "stop_var": self._stop_var})

    def after_run(self, run_context: Any, run_values: Any) -> None:
        global_step = run_values.results["global_step"]
        if run_values.results["stop_var"] > 0:
            tf.compat.v1.logging.info("Early stopping requested, suspending run.")
            run_context.request_stop()
            return
        if self._timer.should_trigger_for_step(global_step):
            self._timer.update_last_triggered_step(global_step)
            stop = self._should_stop_fn()
            run_context.session.run(self._stop_op, feed_dict={self._stop_placeholder: 1 if stop else 0})
            if stop:
                tf.compat.v1.logging.info("Requesting early stopping at global step %d", global_step)
