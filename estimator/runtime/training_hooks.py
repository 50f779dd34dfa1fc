"""Hooks users add to training (tf.estimator.experimental's): evaluation in memory, stopping at a checkpoint step.

InMemoryEvaluatorHook evaluates the model being trained without a checkpoint:
it builds the EVAL graph once, copies the training session's variable values
into it and runs the evaluation, as Estimator.evaluate writes it (eval/ or
eval_<name>/ summaries), before training, every `every_n_iter` training steps
and at the end. make_stop_at_checkpoint_step_hook stops a chief at a global
step, and a worker once the chief's checkpoint has reached it.

The hooks use only the Estimator members tf.estimator's Estimator has too, so
they work with tf.estimator's estimators (canned ones on TF 2.15) as well.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable

import tensorflow as tf

from estimator.runtime import evaluator as evaluator_lib, tf_internal
from estimator.runtime.hooks import StopAfterNEvalsHook, check_hooks
from estimator.runtime.trainer import global_step_in


class InMemoryEvaluatorHook(tf.compat.v1.train.SessionRunHook):
    """Runs Estimator.evaluate's evaluation on the variables being trained, without a checkpoint.

    Args are evaluate()'s (input_fn, steps, hooks, name); every_n_iter: evaluate
    every this many training iterations (also before the first and after the
    last). Only for single-machine training; the model's EVAL Scaffold may not
    bring its own saver or init_fn, and only variables (no other saveables)
    are copied.
    """

    def __init__(self, estimator: Any, input_fn: Callable[..., Any], steps: int | None = None,
                 hooks: Iterable[Any] | None = None, name: str | None = None, every_n_iter: int = 100) -> None:
        if every_n_iter is None or every_n_iter <= 0:
            raise ValueError(f"invalid every_n_iter={every_n_iter}.")
        if estimator.config.num_ps_replicas > 0 or estimator.config.num_worker_replicas > 1:
            raise ValueError("InMemoryEvaluator supports only single machine (aka Local) setting.")
        self._estimator = estimator
        self._input_fn = input_fn
        self._steps = steps
        self._name = name
        self._every_n_iter = every_n_iter
        self._eval_dir = os.path.join(estimator.model_dir, "eval_" + name if name else "eval")
        self._hooks = check_hooks(hooks)
        if steps is not None:
            if steps <= 0:
                raise ValueError(f"Must specify steps > 0, given: {steps}")
            self._hooks.append(StopAfterNEvalsHook(num_evals=steps))
        self._timer = tf.compat.v1.train.SecondOrStepTimer(every_steps=every_n_iter)
        self._graph: Any = None
        self._eval_graph: Any = None
        self._iter_count = 0

    def begin(self) -> None:
        """Build the EVAL graph, and a placeholder to feed each of its variables."""
        self._timer.reset()
        self._iter_count = 0
        self._graph = tf.Graph()
        with self._graph.as_default():
            self._eval_graph = evaluator_lib.build_eval_graph(self._estimator, self._input_fn, self._hooks,
                                                              checkpoint_path=None)
            if self._eval_graph.scaffold.saver is not None:
                raise ValueError("InMemoryEvaluator does not support custom saver")
            if self._eval_graph.scaffold.init_fn is not None:
                raise ValueError("InMemoryEvaluator does not support custom init_fn")
            variables = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
            self._eval_variables = {v.name: v for v in variables}
            self._placeholders = {v.name: tf.compat.v1.placeholder(v.dtype) for v in variables}

    def after_create_session(self, session: Any, coord: Any) -> None:
        """Pair the training variables with the EVAL graph's (by name), then evaluate before training."""
        del coord
        if tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS):
            raise ValueError("InMemoryEvaluator does not support saveables other than global variables.")
        train_variables = {v.name: v for v in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
        names = set(self._placeholders) & set(train_variables)
        self._train_variables = {name: train_variables[name] for name in names}
        with self._graph.as_default():
            self._feed_op = tf.group([tf.compat.v1.assign(self._eval_variables[name], self._placeholders[name])
                                      for name in names])
        self._evaluate(session)

    def _evaluate(self, train_session: Any) -> None:
        values = train_session.run(self._train_variables)
        feed = {self._placeholders[name]: value for name, value in values.items()}

        def feed_variables(scaffold: Any, session: Any) -> None:
            del scaffold
            session.run(self._feed_op, feed_dict=feed)

        graph = self._eval_graph._replace(scaffold=tf.compat.v1.train.Scaffold(
            init_fn=feed_variables, copy_from_scaffold=self._eval_graph.scaffold))
        with self._graph.as_default():
            evaluator_lib.run_eval(self._estimator, graph, checkpoint_path=None, output_dir=self._eval_dir)
        self._timer.update_last_triggered_step(self._iter_count)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self._iter_count += 1
        if self._timer.should_trigger_for_step(self._iter_count):
            self._evaluate(run_context.session)

    def end(self, session: Any) -> None:
        self._evaluate(session)


class _StopAtCheckpointStepHook(tf.compat.v1.train.SessionRunHook):
    """Stops once the latest checkpoint in model_dir is at `last_step` (for workers, whose chief saves).

    Checked when this task's next step would reach last_step; while the
    checkpoint is behind, waits wait_after_file_check_secs after each look
    (many workers reading one file)."""

    def __init__(self, model_dir: str, last_step: int, wait_after_file_check_secs: float = 30) -> None:
        if last_step is None:
            raise ValueError("last_step must be specified.")
        if model_dir is None:
            raise ValueError("model_dir must be specified.")
        self._model_dir = model_dir
        self._last_step = last_step
        self._wait_after_file_check_secs = wait_after_file_check_secs
        self._global_step_tensor: Any = None

    def begin(self) -> None:
        self._global_step_tensor = tf_internal.create_global_step_read(tf.compat.v1.get_default_graph())
        if self._global_step_tensor is None:
            raise RuntimeError("Global step should be created to use StopAtCheckpointStepHook.")

    def before_run(self, run_context: Any) -> Any:
        return tf.compat.v1.train.SessionRunArgs(self._global_step_tensor)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if run_values.results + 1 < self._last_step:
            return
        if global_step_in(self._model_dir) >= self._last_step:
            run_context.request_stop()
        else:
            time.sleep(self._wait_after_file_check_secs)


def make_stop_at_checkpoint_step_hook(estimator: Any, last_step: int,
                                      wait_after_file_check_secs: float = 30) -> Any:
    """A hook stopping training at global step last_step: on the chief a StopAtStepHook, on other tasks one
    that waits for the chief's checkpoint to reach that step."""
    if estimator.config.is_chief:
        return tf.compat.v1.train.StopAtStepHook(last_step=last_step)
    return _StopAtCheckpointStepHook(model_dir=estimator.model_dir, last_step=last_step,
                                     wait_after_file_check_secs=wait_after_file_check_secs)
