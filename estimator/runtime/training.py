"""train_and_evaluate: train, evaluating (and exporting) as checkpoints are written (tf.estimator's contract).

Locally (no cluster in TF_CONFIG) it is one `Estimator.train` up to
train_spec.max_steps with a saving listener that evaluates each new
checkpoint, at most once every eval_spec.throttle_secs, and always the last
one, then runs the exporters into model_dir/export/<exporter name>/. So
the number of evaluations follows the checkpoints, as with tf.estimator:
with save_checkpoints_steps=S and max_steps=N, one per S steps (throttle
permitting) plus the final step. Returns (the last evaluation's metrics,
the exporters' results of that evaluation).

In a TF_CONFIG cluster each task does its part, as in tf.estimator, and
returns None: the chief and workers train (a `master` task also evaluates, as
a local run does), and the `evaluator` task evaluates each new checkpoint the
chief writes (at most once per throttle_secs, after start_delay_secs) until
one at max_steps, running the exporters.

Clusters with parameter servers are tf.estimator's between-graph replication.
A `ps` task starts its TF server and joins it: it serves variables until the
process is stopped. Each trainer starts its own server before anything else
(so peers can reach it while it waits), a worker then waits (task id + 1) * 5
secs (at most experimental_max_worker_delay_secs), and trains with
Estimator.train: the Estimator's replica device setter puts variables on the
`ps` tasks and the rest of the graph on this task, and the
MonitoredTrainingSession runs on this task's server (RunConfig.master), the
chief initialising and saving, workers waiting for the chief's variables. The
steps are asynchronous: each trainer stops once it sees max_steps, so the
final global step may pass it by up to the number of trainers - 1. In a
`master` cluster with workers, worker 0 writes the summaries (trainer.py).

With a train_distribute strategy and a cluster without a `master`, the
distribute coordinator runs the task instead (distributed.train_and_evaluate:
MultiWorkerMirroredStrategy, the V1 ParameterServerStrategy), as tf.estimator
does.

estimator.api.called_from_train_and_evaluate recognises this module's frames
by their names (train_and_evaluate, run_local, run_chief, run_worker,
run_evaluator, _start_distributed_training): keep them.
"""
from __future__ import annotations

import collections
import json
import os
import time
from typing import Any, Callable, Iterable

import tensorflow as tf

from estimator.runtime import distributed
from estimator.runtime.cluster import TaskType
from estimator.runtime.estimator import Estimator, is_estimator
from estimator.runtime.exporter import Exporter

_log = tf.compat.v1.logging

_DELAY_SECS_PER_WORKER = 5  # a worker with task id i waits (i + 1) * this before training (asynchronous SGD)
_MAX_DELAY_SECS = 60
_TRAINER_JOBS = (TaskType.CHIEF, TaskType.MASTER, TaskType.WORKER)


def _checked_input_fn(input_fn: Any) -> Any:
    if not callable(input_fn):
        raise TypeError(f"`input_fn` must be callable, given: {input_fn}")
    return input_fn


def _checked_hooks(hooks: Iterable[Any] | None) -> tuple[Any, ...]:
    hooks = tuple(hooks or [])
    for hook in hooks:
        if not isinstance(hook, tf.compat.v1.train.SessionRunHook):
            raise TypeError(f"All hooks must be `SessionRunHook` instances, given: {hook}")
    return hooks


def _checked_listeners(listeners: Iterable[Any] | None) -> tuple[Any, ...]:
    listeners = tuple(listeners or [])
    for listener in listeners:
        if not isinstance(listener, tf.compat.v1.train.CheckpointSaverListener):
            raise TypeError(f"All saving_listeners must be `CheckpointSaverListener` instances, given: {listener}")
    return listeners


def _is_exporter(value: Any) -> bool:
    """Ours, or any object with an Exporter's `name` and `export` (tf.estimator's exporters on TF 2.15 too)."""
    return isinstance(value, Exporter) or (hasattr(type(value), "name") and callable(getattr(value, "export", None)))


def _checked_exporters(exporters: Any) -> tuple[Exporter, ...]:
    """`exporters` (None, one, or an iterable of them) as a tuple; each has a unique non-empty string name."""
    if not exporters:
        return ()
    if _is_exporter(exporters):
        exporters = [exporters]
    not_exporters = TypeError(f"`exporters` must be an Exporter, an iterable of Exporter, or `None`, found "
                              f"{exporters}.")
    try:
        exporters = list(exporters)
    except TypeError:
        raise not_exporters from None
    names: list[str] = []
    for exporter in exporters:
        if not _is_exporter(exporter):
            raise not_exporters
        if not exporter.name:
            raise ValueError("An Exporter cannot have a name that is `None` or empty. All exporter names: "
                             f"{[e.name for e in exporters]}")
        if not isinstance(exporter.name, str):
            raise ValueError(f"An Exporter must have a string name. Given: {type(exporter.name)}")
        if exporter.name in names:
            raise ValueError("`exporters` must have unique names. Such a name cannot be `None`. All exporter names: "
                             f"{[e.name for e in exporters]}")
        names.append(exporter.name)
    return tuple(exporters)


class TrainSpec(collections.namedtuple("TrainSpec", ["input_fn", "max_steps", "hooks", "saving_listeners"])):
    """The training half of train_and_evaluate: input, the global step to stop at (None: forever), hooks and
    saving listeners (the latter on the chief)."""

    def __new__(cls, input_fn: Callable[..., Any], max_steps: int | None = None, hooks: Iterable[Any] | None = None,
                saving_listeners: Iterable[Any] | None = None) -> "TrainSpec":
        _checked_input_fn(input_fn)
        if max_steps is not None and max_steps <= 0:
            raise ValueError(f"Must specify max_steps > 0, given: {max_steps}")
        return super().__new__(cls, input_fn=input_fn, max_steps=max_steps, hooks=_checked_hooks(hooks),
                               saving_listeners=_checked_listeners(saving_listeners))


class EvalSpec(collections.namedtuple("EvalSpec", ["input_fn", "steps", "name", "hooks", "exporters",
                                                   "start_delay_secs", "throttle_secs"])):
    """The evaluation half of train_and_evaluate: input and batches per evaluation (None: until the input
    ends), the eval_<name> directory, hooks, exporters run after each evaluation, and timing: evaluations
    start at least throttle_secs apart (start_delay_secs delays a separate evaluator's first)."""

    def __new__(cls, input_fn: Callable[..., Any], steps: int | None = 100, name: str | None = None,
                hooks: Iterable[Any] | None = None, exporters: Any = None, start_delay_secs: float = 120,
                throttle_secs: float = 600) -> "EvalSpec":
        _checked_input_fn(input_fn)
        if steps is not None and steps <= 0:
            raise ValueError(f"Must specify steps > 0, given: {steps}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"`name` must be string, given: {name}")
        hooks = _checked_hooks(hooks)
        exporters = _checked_exporters(exporters)
        if start_delay_secs < 0:
            raise ValueError(f"Must specify start_delay_secs >= 0, given: {start_delay_secs}")
        if throttle_secs < 0:
            raise ValueError(f"Must specify throttle_secs >= 0, given: {throttle_secs}")
        return super().__new__(cls, input_fn=input_fn, steps=steps, name=name, hooks=hooks, exporters=exporters,
                               start_delay_secs=start_delay_secs, throttle_secs=throttle_secs)


def _assert_eval_spec(eval_spec: Any) -> None:
    if not isinstance(eval_spec, EvalSpec):
        raise TypeError(f"`eval_spec` must have type `tf.estimator.EvalSpec`. Got: {type(eval_spec)}")


def train_and_evaluate(estimator: Estimator, train_spec: TrainSpec,
                       eval_spec: EvalSpec) -> tuple[dict[str, Any] | None, list[Any] | None] | None:
    """Train `estimator` per train_spec, evaluating and exporting per eval_spec (see the module docstring).

    Returns (eval metrics, export results) of the last evaluation locally;
    (None, None) when training had nothing to do (max_steps already reached);
    None in a cluster (tf.estimator leaves it undefined there).
    """
    _assert_eval_spec(eval_spec)  # fail fast
    executor = _TrainingExecutor(estimator, train_spec, eval_spec)  # checks the estimator and train_spec
    config = estimator.config
    if distributed.should_run_distribute_coordinator(config):  # a strategy and a cluster
        _log.info("Running `train_and_evaluate` with Distribute Coordinator.")
        distributed.train_and_evaluate(estimator, train_spec, eval_spec, _TrainingExecutor)
        return None
    if config.task_type == TaskType.EVALUATOR and config.task_id > 0:
        raise ValueError("For distributed training, there can only be one `evaluator` task (with task id 0).  "
                         f"Given task id {config.task_id}")
    return executor.run()


class _EvalResult(collections.namedtuple("EvalResult", ["metrics", "checkpoint_path"])):
    """One evaluation of one checkpoint."""


def _check_eval_metrics(metrics: Any) -> None:
    """Estimator.evaluate's result must be a non-empty dict with the global step (tf.estimator's errors)."""
    if not metrics:
        raise ValueError("Internal error: `Estimator.evaluate` should never return empty metrics.")
    if not isinstance(metrics, dict):
        raise TypeError(f"`Estimator.evaluate` should return dict. Given {type(metrics)}.")
    if tf.compat.v1.GraphKeys.GLOBAL_STEP not in metrics:
        raise ValueError(f"Internal error: `Estimator.evaluate` result should have `global_step` in result. Given "
                         f"{metrics}")


class _Evaluator:
    """Evaluates the latest checkpoint (once per checkpoint) and runs the exporters on the result."""

    def __init__(self, estimator: Estimator, eval_spec: EvalSpec, max_training_steps: int | None) -> None:
        self._estimator = estimator
        self._eval_spec = eval_spec
        self._max_training_steps = max_training_steps
        self._previous_checkpoint: str | None = None
        self._last_warning_time = 0.0

    def evaluate_and_export(self) -> tuple[_EvalResult | None, list[Any]]:
        """(the result, the exporters' results); (None, []) when there is no new checkpoint to evaluate."""
        checkpoint = self._estimator.latest_checkpoint()
        if not checkpoint:
            self._warn("Estimator is not trained yet. Will start an evaluation when a checkpoint is ready.")
            return None, []
        if checkpoint == self._previous_checkpoint:
            self._warn("No new checkpoint ready for evaluation. Skip the current evaluation pass as evaluation "
                       "results are expected to be same for the same checkpoint.")
            return None, []
        metrics = self._estimator.evaluate(input_fn=self._eval_spec.input_fn, steps=self._eval_spec.steps,
                                           name=self._eval_spec.name, checkpoint_path=checkpoint,
                                           hooks=self._eval_spec.hooks)
        _check_eval_metrics(metrics)
        result = _EvalResult(metrics=metrics, checkpoint_path=checkpoint)
        final = bool(self._max_training_steps) and metrics[tf.compat.v1.GraphKeys.GLOBAL_STEP] >= (
            self._max_training_steps or 0)
        exports = self._export(result, final)
        self._last_warning_time = 0.0
        self._previous_checkpoint = checkpoint
        return result, exports

    def _warn(self, message: str) -> None:
        """Log `message` at most once every 10 minutes (a waiting evaluator would repeat it every pass)."""
        if time.time() - self._last_warning_time > 600:
            _log.warning(message)
            self._last_warning_time = time.time()

    def _export(self, result: _EvalResult, is_the_final_export: bool) -> list[Any]:
        base = os.path.join(tf.compat.as_str_any(self._estimator.model_dir), "export")
        return [exporter.export(estimator=self._estimator, export_path=os.path.join(base, exporter.name),
                                checkpoint_path=result.checkpoint_path, eval_result=result.metrics,
                                is_the_final_export=is_the_final_export)
                for exporter in self._eval_spec.exporters]


class _EvaluateAfterSaving(tf.compat.v1.train.CheckpointSaverListener):
    """Evaluates after each checkpoint the chief saves (not the one saved when training starts), at most once
    every throttle_secs, and after the last one unless it was just evaluated."""

    def __init__(self, evaluator: _Evaluator, throttle_secs: float) -> None:
        self._evaluator = evaluator
        self._throttle_secs = throttle_secs
        self.eval_result: _EvalResult | None = None
        self.export_results: list[Any] | None = None
        self._last_evaluated_step: int | None = None
        self._last_evaluated_time = 0.0
        self._first_save = True

    def begin(self) -> None:
        self._first_save = True
        self._last_evaluated_step = None

    def after_save(self, session: Any, global_step_value: int) -> None:
        del session
        if self._first_save:  # the checkpoint written as the session starts: nothing trained since the last
            self._first_save = False
            return
        if self._last_evaluated_step is None or (global_step_value != self._last_evaluated_step and
                                                 time.time() - self._last_evaluated_time >= self._throttle_secs):
            self._evaluate(global_step_value)
        else:
            _log.info(f"Skip the current checkpoint eval due to throttle secs ({self._throttle_secs} secs).")

    def end(self, session: Any, global_step_value: int) -> None:
        del session
        if global_step_value != self._last_evaluated_step:
            self._evaluate(global_step_value)

    def _evaluate(self, global_step_value: int) -> None:
        self._last_evaluated_step = global_step_value
        self._last_evaluated_time = time.time()
        self.eval_result, self.export_results = self._evaluator.evaluate_and_export()
        if self.eval_result is None:
            raise RuntimeError("There was no new checkpoint after the training. Eval status: no new checkpoint")


class _TrainingExecutor:
    """Runs this task's part of train_and_evaluate, chosen by RunConfig's task type (run_<task type>)."""

    def __init__(self, estimator: Estimator, train_spec: TrainSpec, eval_spec: EvalSpec) -> None:
        if not is_estimator(estimator):
            raise TypeError(f"`estimator` must have type `tf.estimator.Estimator`. Got: {type(estimator)}")
        if not isinstance(train_spec, TrainSpec):
            raise TypeError(f"`train_spec` must have type `tf.estimator.TrainSpec`. Got: {type(train_spec)}")
        self._estimator = estimator
        self._train_spec = train_spec
        self._eval_spec = eval_spec

    def run(self) -> tuple[dict[str, Any] | None, list[Any] | None] | None:
        config = self._estimator.config
        if not config.cluster_spec and config.task_type != TaskType.EVALUATOR:
            _log.info("Running training and evaluation locally (non-distributed).")
            return self.run_local()
        if not config.task_type:
            raise ValueError("`estimator.config` must have task_type set. This usually means TF_CONFIG environment "
                             "is not set correctly.")
        if config.task_type == "local":
            raise ValueError("`task.type` in TF_CONFIG cannot be `local`. Leaving `cluster` and `task` properties "
                             "in TF_CONFIG absent triggers train and evaluate `Estimator` locally (non-distributed).")
        runs = {TaskType.CHIEF: self.run_chief, TaskType.EVALUATOR: self.run_evaluator,
                TaskType.MASTER: self.run_master, TaskType.PS: self.run_ps, TaskType.WORKER: self.run_worker}
        if config.task_type not in runs:
            raise ValueError(f"Task type {config.task_type} is not supported. Supported task types are "
                             f"{list(runs)}")
        runs[config.task_type]()
        return None

    def run_ps(self) -> None:
        """A parameter server: start this task's TF server and serve the trainers' variables until killed."""
        server = _start_std_server(self._estimator.config)
        server.join()

    def run_local(self) -> tuple[dict[str, Any] | None, list[Any] | None]:
        """Train to max_steps, evaluating and exporting after checkpoints (see the module docstring)."""
        _assert_eval_spec(self._eval_spec)
        config = self._estimator.config
        _log.info("Start train and evaluate loop. The evaluate will happen after every checkpoint. Checkpoint "
                  "frequency is determined based on RunConfig arguments: save_checkpoints_steps "
                  f"{config.save_checkpoints_steps} or save_checkpoints_secs {config.save_checkpoints_secs}.")
        evaluator = _Evaluator(self._estimator, self._eval_spec, self._train_spec.max_steps)
        listener = _EvaluateAfterSaving(evaluator, self._eval_spec.throttle_secs)
        self._estimator.train(input_fn=self._train_spec.input_fn, max_steps=self._train_spec.max_steps,
                              hooks=list(self._train_spec.hooks),
                              saving_listeners=[*self._train_spec.saving_listeners, listener])
        metrics = listener.eval_result.metrics if listener.eval_result is not None else None
        return metrics, listener.export_results

    def run_chief(self) -> None:
        self._start_distributed_training(saving_listeners=self._train_spec.saving_listeners)

    def run_master(self) -> None:
        """The chief of a `master` cluster: trains and evaluates its own checkpoints, as a local run does."""
        _assert_eval_spec(self._eval_spec)
        evaluator = _Evaluator(self._estimator, self._eval_spec, self._train_spec.max_steps)
        listener = _EvaluateAfterSaving(evaluator, self._eval_spec.throttle_secs)
        self._start_distributed_training(saving_listeners=[*self._train_spec.saving_listeners, listener])

    def run_evaluator(self) -> None:
        """Evaluate each new checkpoint the chief writes, until one at max_steps (forever when it is None)."""
        _assert_eval_spec(self._eval_spec)
        if self._eval_spec.start_delay_secs:
            _log.info("Waiting %f secs before starting eval.", self._eval_spec.start_delay_secs)
            time.sleep(self._eval_spec.start_delay_secs)
        evaluator = _Evaluator(self._estimator, self._eval_spec, self._train_spec.max_steps)
        throttle_secs = self._eval_spec.throttle_secs
        max_steps = self._train_spec.max_steps
        result: _EvalResult | None = None
        while True:
            if result is not None:  # checked after the throttle wait that follows each evaluation, as tf.estimator
                step = result.metrics.get(tf.compat.v1.GraphKeys.GLOBAL_STEP)
                if step and max_steps and step >= max_steps:
                    _log.info("Exiting evaluation, global_step=%s >= train max_steps=%s", step, max_steps)
                    return
            started = time.time()
            result, _ = evaluator.evaluate_and_export()
            wait = throttle_secs - (time.time() - started)
            if wait > 0:
                _log.info("Waiting %f secs before starting next eval run.", wait)
                time.sleep(wait)
            elif throttle_secs == 0 and result is None:
                _log.warning("EvalSpec.throttle_secs is set as 0. This might overload the job before finding (next) "
                             "new checkpoint. Please consider to increase it.")

    def run_worker(self) -> None:
        self._start_distributed_training()

    def _start_distributed_training(self, saving_listeners: Iterable[Any] | None = None) -> None:
        """Start this task's TF server (unless the cluster is this one trainer), wait a worker's delay, train."""
        config = self._estimator.config
        if json.loads(os.environ.get("TF_CONFIG") or "{}").get("environment") != "google":
            _start_std_server(config)
        delay = 0
        if config.task_type == TaskType.WORKER:
            max_delay = _MAX_DELAY_SECS if config.experimental_max_worker_delay_secs is None else int(
                config.experimental_max_worker_delay_secs)
            delay = min(max_delay, (config.task_id + 1) * _DELAY_SECS_PER_WORKER)
        if delay > 0:
            _log.info("Waiting %d secs before starting training.", delay)
            time.sleep(delay)
        self._estimator.train(input_fn=self._train_spec.input_fn, max_steps=self._train_spec.max_steps,
                              hooks=list(self._train_spec.hooks), saving_listeners=saving_listeners)


def _start_std_server(config: Any) -> Any:
    """This task's in-process TF server, started; None when the cluster is this single trainer (no server)."""
    if not config.cluster_spec or not config.task_type or config.task_id is None:
        raise RuntimeError("Could not start server; be sure to specify cluster_spec, task_type, and task in "
                           "RunConfig or set the TF_CONFIG environment variable.")
    if not config.master:
        jobs = config.cluster_spec.jobs
        if len(jobs) == 1 and len(config.cluster_spec.job_tasks(jobs[0])) == 1 and config.task_type in _TRAINER_JOBS:
            _log.info("Skip starting Tensorflow server as there is only one node in the cluster.")
            return None
        raise RuntimeError("Could not start server; be sure to specify master in RunConfig or set the TF_CONFIG "
                           "environment variable.")
    _log.info("Start Tensorflow server.")
    gpu_options = config.session_config.gpu_options if config.session_config is not None else None
    session_config = tf.compat.v1.ConfigProto(log_device_placement=False, gpu_options=gpu_options)
    server = tf.distribute.Server(config.cluster_spec, job_name=config.task_type, task_index=config.task_id,
                                  config=session_config, start=False, protocol=config.protocol)
    server.start()
    return server
