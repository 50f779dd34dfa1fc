"""Estimator.train's graph and loop.

The graph is built in tf.estimator's order (graph seed, global step and its
read, input_fn, iterator, model_fn), so op-level random seeds, and therefore
initial values and dropout masks, are the ones tf.estimator gets. The loop is
a MonitoredTrainingSession with the hooks users see from tf.estimator:
"loss = ..., step = ..." every log_step_count_steps, global_step/sec,
summaries every save_summary_steps (a `loss` scalar included), checkpoints
`model.ckpt-<step>` (keep_checkpoint_max of them, one at the end),
graph.pbtxt, and saving listeners on the checkpoint saver. In a cluster with
a `master` and workers, worker 0 writes the summaries and global_step/sec
instead of the master (tf.estimator's placement). With a MultiWorkerMirroredStrategy
in a cluster every worker runs a session of its own (run_collective_training).

distributed.py builds the TRAIN graph with a train_distribute and runs it here
(run_training); this module does not import it (Estimator.train chooses).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import tensorflow as tf

from estimator.runtime import tf_internal
from estimator.runtime.cluster import TaskType
from estimator.runtime.mode_keys import ModeKeys
from estimator.runtime.spec import EstimatorSpec
from estimator.runtime.warm_start import maybe_warm_start

if TYPE_CHECKING:
    from estimator.runtime.estimator import Estimator


def global_step_in(model_dir: str) -> int:
    """The global step of model_dir's latest checkpoint (0 when there is none)."""
    latest = tf.train.latest_checkpoint(model_dir)
    if not latest:
        return 0
    try:
        return int(tf.train.load_variable(latest, tf.compat.v1.GraphKeys.GLOBAL_STEP))
    except (tf.errors.OpError, ValueError):  # no global_step in it, or unreadable: train from the start
        return 0


def train_model(estimator: "Estimator", input_fn: Callable[..., Any], hooks: list[Any],
                saving_listeners: list[Any]) -> Any:
    """Build the TRAIN graph and run it until a hook stops it or the input ends; returns the last loss."""
    with tf.Graph().as_default() as graph, graph.device(estimator._device_fn):
        tf.compat.v1.random.set_random_seed(estimator.config.tf_random_seed)
        if estimator._create_and_assert_global_step(graph) is not None:
            tf_internal.create_global_step_read(graph)
        features, labels, input_hooks = estimator._get_features_and_labels_from_input_fn(input_fn, ModeKeys.TRAIN)
        spec = estimator._call_model_fn(features, labels, ModeKeys.TRAIN, estimator.config)
        global_step = tf.compat.v1.train.get_global_step(graph)
        return run_training(estimator, spec, input_hooks + hooks, global_step, saving_listeners)


def run_training(estimator: "Estimator", spec: EstimatorSpec, hooks: list[Any], global_step: Any,
                 saving_listeners: list[Any]) -> Any:
    """Run `spec.train_op` in a MonitoredTrainingSession with the Estimator's hooks; returns the last loss."""
    config = estimator.config
    if estimator._warm_start_settings is not None and not tf.train.latest_checkpoint(estimator.model_dir):
        maybe_warm_start(estimator._warm_start_settings)
    if not any(summary.op.name == "loss" for summary in tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.SUMMARIES)):
        tf.compat.v1.summary.scalar("loss", spec.loss)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.LOSSES, spec.loss)
    worker_hooks = [*hooks, tf.compat.v1.train.NanTensorHook(spec.loss)]
    if config.log_step_count_steps is not None:
        worker_hooks.append(tf.compat.v1.train.LoggingTensorHook(
            {"loss": spec.loss, "step": global_step}, every_n_iter=config.log_step_count_steps))
    worker_hooks.extend(spec.training_hooks)
    _add_default_saver(spec.scaffold, config)
    if runs_collective_session(estimator):  # MultiWorkerMirroredStrategy in a cluster
        return run_collective_training(estimator, spec, worker_hooks, saving_listeners)
    chief_hooks = _checkpoint_hooks(estimator, spec, worker_hooks, saving_listeners)
    save_summary_steps, log_step_count_steps = _summary_hooks_on_worker_0(config, spec, worker_hooks)
    session = tf_internal.monitored_training_session(
            master=config.master,
            is_chief=config.is_chief,
            checkpoint_dir=estimator.model_dir,
            scaffold=spec.scaffold,
            hooks=worker_hooks,
            chief_only_hooks=[*chief_hooks, *spec.training_chief_hooks],
            save_checkpoint_secs=0,  # the CheckpointSaverHook above saves
            save_summaries_steps=save_summary_steps,
            config=config.session_config,
            max_wait_secs=config.session_creation_timeout_secs,
            log_step_count_steps=log_step_count_steps,
            save_graph_def=config.checkpoint_save_graph_def)
    return _train_in(session, spec)


def _train_in(session: Any, spec: EstimatorSpec) -> Any:
    """Run spec.train_op in a MonitoredSession until it stops (closing it); returns the last loss."""
    with session:
        loss, steps = None, 0
        while not session.should_stop():
            steps += 1
            _, loss = session.run([spec.train_op, spec.loss])
    if steps == 0:
        tf.compat.v1.logging.warning("Training with estimator made no steps. Perhaps input is empty or misspecified.")
    return loss


def _summary_hooks_on_worker_0(config: Any, spec: EstimatorSpec, worker_hooks: list[Any]) -> tuple[int, int | None]:
    """(save_summaries_steps, log_step_count_steps) for the session, as tf.estimator sets them.

    In a cluster with a `master` and workers, the master also evaluates, which
    would stall its summaries: worker 0 writes the summaries and
    global_step/sec to model_dir instead (hooks appended to worker_hooks), and
    no task's session adds its own.
    """
    jobs = config.cluster_spec.jobs if config.cluster_spec else []
    if not (TaskType.WORKER in jobs and TaskType.MASTER in jobs):
        return config.save_summary_steps, config.log_step_count_steps
    if config.task_type == TaskType.WORKER and config.task_id == 0:
        if config.save_summary_steps and config.save_summary_steps > 0:
            worker_hooks.append(tf.compat.v1.train.SummarySaverHook(
                save_steps=config.save_summary_steps, output_dir=config.model_dir, scaffold=spec.scaffold))
        if config.log_step_count_steps and config.log_step_count_steps > 0:
            worker_hooks.append(tf.compat.v1.train.StepCounterHook(
                every_n_steps=config.log_step_count_steps, output_dir=config.model_dir))
    return 0, None


def _add_default_saver(scaffold: Any, config: Any) -> None:
    """Unless the model brought its own, the Saver that writes model_dir's checkpoints (relative paths, so the
    directory can move)."""
    if scaffold.saver or tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS):
        return
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, tf.compat.v1.train.Saver(
        sharded=True, max_to_keep=config.keep_checkpoint_max,
        keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours, defer_build=True,
        save_relative_paths=True))


def _checkpoint_hooks(estimator: "Estimator", spec: EstimatorSpec, worker_hooks: list[Any],
                      saving_listeners: list[Any]) -> list[Any]:
    """The chief's CheckpointSaverHook (unless the user's hooks have one), with the saving listeners on it."""
    config = estimator.config
    savers = [hook for hook in [*worker_hooks, *spec.training_chief_hooks]
              if isinstance(hook, tf.compat.v1.train.CheckpointSaverHook)]
    chief_hooks: list[Any] = []
    if (config.save_checkpoints_secs or config.save_checkpoints_steps) and not savers:
        chief_hooks.append(tf.compat.v1.train.CheckpointSaverHook(
            estimator.model_dir, save_secs=config.save_checkpoints_secs, save_steps=config.save_checkpoints_steps,
            scaffold=spec.scaffold, listeners=saving_listeners,
            save_graph_def=config.checkpoint_save_graph_def))
        return chief_hooks
    if saving_listeners:
        if not savers:
            raise ValueError("There should be a CheckpointSaverHook to use saving_listeners. Please set one of the "
                             "RunConfig.save_checkpoints_steps or RunConfig.save_checkpoints_secs.")
        known = savers[0]._listeners  # TF keeps a hook's listeners here (no public way to add one later)
        known.extend(listener for listener in saving_listeners if listener not in known)
    return chief_hooks


# Strategies whose workers each run their own session in a cluster (collective all-reduce): a MultiWorkerMirrored
# train_distribute trains here, with the graph distributed.py builds for it.
_COLLECTIVE_STRATEGIES = ("CollectiveAllReduceStrategy", "CollectiveAllReduceStrategyV1", "MultiWorkerMirroredStrategy")


def runs_collective_session(estimator: "Estimator") -> bool:
    """Whether training runs a session per worker of a cluster (MultiWorkerMirroredStrategy in a cluster)."""
    return bool(estimator._config.cluster_spec) and type(
        estimator._train_distribution).__name__ in _COLLECTIVE_STRATEGIES


def run_collective_training(estimator: "Estimator", spec: EstimatorSpec, worker_hooks: list[Any],
                            saving_listeners: list[Any]) -> Any:
    """Train on one worker of a collective cluster; the coordinator's worker context, if any, decides who
    checkpoints and writes summaries to model_dir (MonitoredTrainingSession reads it). Returns the last loss."""
    if saving_listeners:
        raise ValueError("Saving listenor is not supported by the current Distribution Strategies.")
    config = estimator._config  # not a deep copy: a MultiWorkerMirroredStrategy may refuse to be copied
    session = tf_internal.monitored_training_session(
            master=config.master,
            is_chief=config.is_chief,
            checkpoint_dir=estimator.model_dir,
            scaffold=spec.scaffold,
            hooks=worker_hooks,
            chief_only_hooks=tuple(spec.training_chief_hooks),
            save_checkpoint_secs=config.save_checkpoints_secs,
            save_checkpoint_steps=config.save_checkpoints_steps,
            save_summaries_steps=config.save_summary_steps,
            config=estimator._session_config,
            max_wait_secs=config.session_creation_timeout_secs,
            log_step_count_steps=config.log_step_count_steps,
            save_graph_def=config.checkpoint_save_graph_def)
    return _train_in(session, spec)
