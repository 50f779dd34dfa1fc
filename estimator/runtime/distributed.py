"""Distribution strategies: RunConfig(train_distribute=..., eval_distribute=..., experimental_distribute=...).

tf.estimator's contract (TF 2.15), with its graphs and messages:

- RunConfig refuses a V2 `tf.distribute.experimental.ParameterServerStrategy`
  (the V1 one, tf.compat.v1.distribute.experimental.ParameterServerStrategy,
  is the Estimator's). With a strategy and a TF_CONFIG cluster that has no
  `master`, the config is set up for the distribute coordinator
  (INDEPENDENT_WORKER): the cluster is kept as TF_CONFIG gives it (workers
  alone are a valid cluster: worker 0 is the chief) and each task's place in
  it is settled when train_and_evaluate runs the task. Estimator.train and
  .evaluate are refused in that mode, as tf.estimator refuses them.
  experimental_distribute, a DistributeConfig, may carry the strategies and
  a remote_cluster: then this process is a client of that cluster's servers
  (STANDALONE_CLIENT), where train and evaluate work with in-graph
  strategies.
- train: the model_fn is called once per replica (call_for_each_replica)
  under the strategy's scope, on input from strategy.make_input_fn_iterator
  (an input_fn may take `input_context`); the replicas' losses are reduced
  for the log and the hooks, their train ops grouped; the hooks and scaffold
  come from the first replica. A V1 optimizer scales the loss by 1/replicas,
  so N replicas on batches of B train as one device on batches of N*B.
- MultiWorkerMirroredStrategy in a cluster: every worker runs checkpoint and
  summary ops (they hold collective ops); the chief writes to model_dir,
  the others to model_dir/tmp_worker_<i> (MonitoredTrainingSession's
  worker-context path). Saving listeners are refused.
- evaluate with eval_distribute: the metrics, `loss` included, are computed
  per replica and aggregated; a step is one batch on each replica.
- train_and_evaluate in such a cluster: through the coordinator, the chief
  and workers train (without the TrainSpec's saving listeners), an
  `evaluator` task evaluates each new checkpoint, `ps` tasks serve until
  killed.

TF 2.21 keeps the strategies (graph-mode call_for_each_replica included),
the distribute coordinator with its worker context, and
MonitoredTrainingSession's worker-context path. It removed
tensorflow/python/distribute/estimator_training.py, the glue between those
and the Estimator: this module is that glue (and the Estimator's own
distributed paths). TPUStrategy is not supported (no TPU here).

It sits above trainer.py and evaluator.py (it builds the graphs they run);
Estimator.train/.evaluate come here when the config has a strategy. A
collective worker's session is trainer.py's (run_collective_training).
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Callable

import tensorflow as tf

from estimator.runtime import cluster, evaluator, inputs, tf_internal, trainer
from estimator.runtime.mode_keys import ModeKeys
from estimator.runtime.spec import LOSS_METRIC_KEY, EstimatorSpec

if TYPE_CHECKING:
    from estimator.runtime.estimator import Estimator
    from estimator.runtime.run_config import RunConfig

_log = tf.compat.v1.logging


# ---------------------------------------------------------------------------------------------------- RunConfig


def verify_strategy_compatibility(train_distribute: Any, eval_distribute: Any) -> None:
    """Refuse the V2 ParameterServerStrategy (its V1 form is the Estimator's)."""
    v2 = tf.distribute.experimental.ParameterServerStrategy
    if (train_distribute is not None and train_distribute.__class__ == v2) or (
            eval_distribute is not None and eval_distribute.__class__ == v2):
        raise ValueError("Please use `tf.compat.v1.distribute.experimental.ParameterServerStrategy` for parameter "
                         "server strategy with estimator.")


def configures_strategies(train_distribute: Any, eval_distribute: Any, experimental_distribute: Any) -> bool:
    """Whether RunConfig sets itself up for strategies (init_run_config) rather than from TF_CONFIG alone."""
    def usable(strategy: Any) -> bool:
        return bool(strategy) and not strategy.__class__.__name__.startswith("TPUStrategy")

    return usable(train_distribute) or usable(eval_distribute) or bool(experimental_distribute)


def init_run_config(config: "RunConfig", tf_config: dict[str, Any]) -> None:
    """Set a RunConfig with strategies up: the coordinator's mode and the cluster properties.

    Without a cluster, with a `master` in it or without train_distribute, the
    config reads TF_CONFIG as usual (no coordinator). Otherwise the cluster is
    kept as given and the task reads as a local one until the coordinator
    runs it (INDEPENDENT_WORKER), or, with experimental_distribute's
    remote_cluster, this process is that cluster's client (STANDALONE_CLIENT).
    """
    experimental = config._experimental_distribute
    if experimental and experimental.train_distribute:
        if config._train_distribute:
            raise ValueError("Either `train_distribute` or`experimental_distribute.train_distribute` can be set.")
        config._train_distribute = experimental.train_distribute
    if experimental and experimental.eval_distribute:
        if config._eval_distribute:
            raise ValueError("Either `eval_distribute` or`experimental_distribute.eval_distribute` can be set.")
        config._eval_distribute = experimental.eval_distribute
    cluster_spec = tf.train.ClusterSpec(tf_config.get("cluster", {}))
    config._init_cluster(cluster.cluster_settings({}))
    if config._train_distribute and experimental and experimental.remote_cluster:
        if cluster_spec:
            raise ValueError('Cannot set both "cluster_spec" of TF_CONFIG and `experimental_distribute.remote_cluster`')
        config._distribute_coordinator_mode = tf_internal.STANDALONE_CLIENT
        config._cluster_spec = experimental.remote_cluster
        _log.info("RunConfig initialized for Distribute Coordinator with STANDALONE_CLIENT mode")
        return
    if not cluster_spec or cluster.TaskType.MASTER in cluster_spec.jobs or not config._train_distribute:
        config._distribute_coordinator_mode = None
        config._init_cluster(cluster.cluster_settings(tf_config))
        _log.info("Not using Distribute Coordinator.")
        return
    config._cluster_spec = cluster_spec
    config._distribute_coordinator_mode = tf_internal.INDEPENDENT_WORKER
    _log.info("RunConfig initialized for Distribute Coordinator with INDEPENDENT_WORKER mode")


def coordinator_mode(config: Any) -> str | None:
    """The distribute coordinator mode a RunConfig was set up for (None: no coordinator)."""
    return getattr(config, "_distribute_coordinator_mode", None)


def should_run_distribute_coordinator(config: Any) -> bool:
    """Whether train_and_evaluate runs through the distribute coordinator (a strategy and a cluster)."""
    mode = coordinator_mode(config)
    if mode is None:
        _log.info("Not using Distribute Coordinator.")
        return False
    if mode not in (tf_internal.STANDALONE_CLIENT, tf_internal.INDEPENDENT_WORKER):
        _log.warning("Unexpected distribute_coordinator_mode: %r", mode)
        return False
    if not config.cluster_spec:
        _log.warning("Running `train_and_evaluate` locally, ignoring `experimental_distribute_coordinator_mode`.")
        return False
    return True


def _init_run_config_from_worker_context(config: Any, context: Any) -> None:
    """The task's place in the cluster, as the coordinator's worker context gives it."""
    config._service = None
    config._cluster_spec = context.cluster_spec
    config._task_type = context.task_type
    config._task_id = context.task_id
    config._evaluation_master = context.master_target
    config._master = context.master_target
    config._is_chief = context.is_chief
    if not config._cluster_spec:
        config._global_id_in_cluster, config._num_ps_replicas, config._num_worker_replicas = 0, 0, 1
    elif config._task_type == cluster.TaskType.EVALUATOR:  # an evaluator is not part of the training cluster
        config._cluster_spec = tf.train.ClusterSpec({})
        config._global_id_in_cluster, config._num_ps_replicas, config._num_worker_replicas = None, 0, 0
    else:
        jobs = config._cluster_spec.as_dict()
        config._num_ps_replicas = len(jobs.get(cluster.TaskType.PS, []))
        config._num_worker_replicas = len(jobs.get(cluster.TaskType.WORKER, [])) + len(
            jobs.get(cluster.TaskType.CHIEF, []))
        config._global_id_in_cluster = _global_id(config._cluster_spec, config._task_type, config._task_id)


def _global_id(spec: Any, task_type: str | None, task_id: int | None) -> int:
    """The task's index among all tasks (chief first, parameter servers last); 0 for an in-graph client."""
    if not task_type:
        return 0
    order = [cluster.TaskType.CHIEF] if cluster.TaskType.CHIEF in spec.jobs else []
    order += [job for job in sorted(spec.jobs) if job not in (cluster.TaskType.CHIEF, cluster.TaskType.PS)]
    if cluster.TaskType.PS in spec.jobs:
        order.append(cluster.TaskType.PS)
    first = 0
    for job in order:
        if job == task_type:
            return first + int(task_id or 0)
        first += len(spec.job_tasks(job))
    raise RuntimeError(f"Internal Error: `task_type` ({task_type}) is not in cluster_spec ({spec}).")


def _task_estimator(estimator: "Estimator", strategy: Any, train: bool) -> "Estimator":
    """A copy of `estimator` for the coordinator's current task: its strategy and place in the cluster."""
    local = copy.deepcopy(estimator)
    if train:
        local._config._train_distribute = strategy
        local._train_distribution = strategy
    else:
        local._config._eval_distribute = strategy
        local._eval_distribution = strategy
    _init_run_config_from_worker_context(local._config, tf_internal.current_worker_context())
    _log.info("Updated config: %s", str(vars(local._config)))
    return local


# ---------------------------------------------------------------------------------------------------- input


class DistributedIteratorInitializerHook(tf.compat.v1.train.SessionRunHook):
    """Initializes a strategy's input iterator once the session exists."""

    def __init__(self, iterator: Any) -> None:
        self._iterator = iterator
        self._initializer: Any = None

    def begin(self) -> None:
        self._initializer = self._iterator.initialize()

    def after_create_session(self, session: Any, coord: Any) -> None:
        del coord
        session.run(self._initializer)


def _iterator_from_input_fn(estimator: "Estimator", input_fn: Callable[..., Any], mode: str,
                            strategy: Any) -> tuple[Any, list[Any]]:
    """The strategy's iterator over input_fn's dataset (input_fn gets the InputContext if it takes one)."""
    iterator = strategy.make_input_fn_iterator(
        lambda input_context: estimator._call_input_fn(input_fn, mode, input_context))
    return iterator, [DistributedIteratorInitializerHook(iterator)]


# ---------------------------------------------------------------------------------------------------- train


def train_model(estimator: "Estimator", input_fn: Callable[..., Any], hooks: list[Any],
                saving_listeners: list[Any]) -> Any:
    """Estimator.train with train_distribute; returns the last loss (the Estimator under a coordinator)."""
    config = estimator._config
    if coordinator_mode(config):
        return _train_with_coordinator(estimator, input_fn, hooks, saving_listeners)
    config._train_distribute.configure(config.session_config)
    return _train_with_strategy(estimator, config._train_distribute, input_fn, hooks, saving_listeners)


def _standalone_client_cluster(config: "RunConfig", strategy: Any, api: str, called_as: str) -> Any:
    """The coordinator's cluster for Estimator.train/.evaluate (`api`), refused as tf.estimator refuses it:
    with an evaluator job, outside STANDALONE_CLIENT mode (its message names the call `called_as`), or with a
    between-graph strategy."""
    cluster_spec = tf_internal.normalize_cluster_spec(config.cluster_spec)
    if cluster.TaskType.EVALUATOR in cluster_spec.jobs:
        raise ValueError("'evaluator' job is not supported if you don't use `train_and_evaluate`")
    if coordinator_mode(config) != tf_internal.STANDALONE_CLIENT:
        raise ValueError(f"Only `STANDALONE_CLIENT` mode is supported when you call `{called_as}`")
    if strategy.extended.experimental_between_graph:
        raise ValueError(f"`{api}` API is not supported for {strategy.__class__.__name__} with `STANDALONE_CLIENT` "
                         "mode.")
    return cluster_spec


def _train_with_coordinator(estimator: "Estimator", input_fn: Callable[..., Any], hooks: list[Any],
                            saving_listeners: list[Any]) -> "Estimator":
    """Estimator.train on a remote cluster (STANDALONE_CLIENT, in-graph strategies); refused otherwise."""
    config = estimator._config
    cluster_spec = _standalone_client_cluster(config, config._train_distribute, "Estimator.train", "estimator.train")

    def worker_fn(strategy: Any) -> "Estimator":
        local = _task_estimator(estimator, strategy, train=True)
        chief_hooks = hooks if tf_internal.current_worker_context().is_chief else []
        _train_with_strategy(local, strategy, input_fn, chief_hooks, saving_listeners)
        return local

    tf_internal.run_distribute_coordinator(worker_fn, config._train_distribute, mode=coordinator_mode(config),
                                           cluster_spec=cluster_spec, session_config=config.session_config)
    return estimator


def _train_with_strategy(estimator: "Estimator", strategy: Any, input_fn: Callable[..., Any], hooks: list[Any],
                         saving_listeners: list[Any]) -> Any:
    """Build the TRAIN graph with the model_fn on every replica, then run it as trainer.run_training does."""
    with tf.Graph().as_default() as graph, strategy.scope(), tf_internal.scale_loss_for_estimator(strategy):
        tf.compat.v1.random.set_random_seed(estimator._config.tf_random_seed)
        iterator, input_hooks = _iterator_from_input_fn(estimator, input_fn, ModeKeys.TRAIN, strategy)
        global_step = estimator._create_and_assert_global_step(graph)
        # The read goes to the collection here, in cross-replica context, not from a replica's thread.
        tf.compat.v1.add_to_collection(tf_internal.GLOBAL_STEP_READ_KEY, strategy.extended.read_var(global_step))
        features, labels = inputs.split_features_and_labels(iterator.get_next())
        grouped = strategy.extended.call_for_each_replica(
            estimator._call_model_fn, args=(features, labels, ModeKeys.TRAIN, estimator.config))
        loss = strategy.reduce(_loss_reduce_op(graph), grouped.loss, axis=None)
        spec = EstimatorSpec(
            mode=grouped.mode, loss=loss, train_op=strategy.group(grouped.train_op),
            training_hooks=_first_replica(strategy, grouped.training_hooks),
            training_chief_hooks=_first_replica(strategy, grouped.training_chief_hooks),
            scaffold=combine_scaffolds(grouped.scaffold, strategy))
        return trainer.run_training(estimator, spec, [*input_hooks, *hooks], global_step, saving_listeners)


def _loss_reduce_op(graph: tf.Graph) -> Any:
    """How the replicas' losses combine into the loss reported: the optimizer's reduction when it scaled the
    loss per replica (a mean), else their sum."""
    if tf_internal.loss_is_scaled_by_optimizer(graph):
        return tf.compat.v1.distribute.get_loss_reduction()
    return tf.distribute.ReduceOp.SUM


def _first_replica(strategy: Any, per_replica_hooks: Any) -> list[Any]:
    """Each hook as the first replica's model_fn made it."""
    return [strategy.experimental_local_results(hook)[0] for hook in per_replica_hooks]


# ---------------------------------------------------------------------------------------------------- scaffold


def _per_replica_ready_for_local_init_op(scaffold: Any) -> Any:
    """A replica's ready_for_local_init_op: its scaffold's, else the graph's default."""
    if scaffold.ready_for_local_init_op:
        return scaffold.ready_for_local_init_op
    return tf.compat.v1.train.Scaffold.get_or_default(
        "ready_for_local_init_op", tf.compat.v1.GraphKeys.READY_FOR_LOCAL_INIT_OP,
        lambda: tf.compat.v1.report_uninitialized_variables(tf.compat.v1.global_variables()))


def combine_scaffolds(grouped_scaffold: Any, strategy: Any) -> Any:
    """One Scaffold from the replicas' (their init/local_init/summary ops grouped, ready ops concatenated,
    the first saver and init_fn)."""
    scaffolds = strategy.experimental_local_results(grouped_scaffold)

    def grouped(ops: list[Any]) -> Any:
        return strategy.group(ops) if ops else None

    def concatenated(value: Any) -> Any:
        values = tf.nest.flatten(strategy.experimental_local_results(value))
        return tf.concat(values, 0) if len(values) != 1 else values[0]

    init_fns = [tf_internal.scaffold_init_fn(s) for s in scaffolds if tf_internal.scaffold_init_fn(s) is not None]
    ready_op = strategy.extended.call_for_each_replica(lambda scaffold: scaffold.ready_op, args=(grouped_scaffold,))
    ready_for_local_init_op = strategy.extended.call_for_each_replica(
        _per_replica_ready_for_local_init_op, args=(grouped_scaffold,))
    savers = [s.saver for s in scaffolds if s.saver is not None]
    return tf.compat.v1.train.Scaffold(
        init_op=grouped([s.init_op for s in scaffolds if s.init_op is not None]),
        ready_op=concatenated(ready_op) if ready_op is not None else None,
        ready_for_local_init_op=concatenated(ready_for_local_init_op) if ready_for_local_init_op is not None
        else None,
        local_init_op=grouped([s.local_init_op for s in scaffolds if s.local_init_op is not None]),
        summary_op=grouped([s.summary_op for s in scaffolds if s.summary_op is not None]),
        saver=savers[0] if savers else None,
        init_feed_dict=grouped([s.init_feed_dict for s in scaffolds if s.init_feed_dict is not None]),
        init_fn=init_fns[0] if init_fns else None)


# ---------------------------------------------------------------------------------------------------- evaluate


def evaluate_model(estimator: "Estimator", input_fn: Callable[..., Any], hooks: list[Any],
                   checkpoint_path: str | None, output_dir: str) -> dict[str, Any]:
    """Estimator.evaluate with eval_distribute (the evaluator's run and results, the graph built per replica)."""
    if coordinator_mode(estimator._config):
        return _evaluate_with_coordinator(estimator, input_fn, hooks, checkpoint_path, output_dir)
    strategy = estimator._eval_distribution
    with tf.Graph().as_default() as graph:
        tf_internal.create_steps_per_run_variable()  # on the host, outside the strategy
        with strategy.scope():
            tf.compat.v1.random.set_random_seed(estimator._config.tf_random_seed)
            estimator._create_and_assert_global_step(graph)
            iterator, input_hooks = _iterator_from_input_fn(estimator, input_fn, ModeKeys.EVAL, strategy)
            features, labels = inputs.split_features_and_labels(iterator.get_next())
            grouped = strategy.extended.call_for_each_replica(
                estimator._call_model_fn, args=(features, labels, ModeKeys.EVAL, estimator.config))
            update_op, metrics = _metric_ops(grouped.eval_metric_ops, grouped.loss, strategy)
            scaffold = combine_scaffolds(grouped.scaffold, strategy)
            all_hooks = [*input_hooks, *hooks, *_first_replica(strategy, grouped.evaluation_hooks)]
            return evaluator.run_evaluation(estimator, scaffold, update_op, metrics, all_hooks, checkpoint_path,
                                            output_dir)


def _metric_ops(eval_metric_ops: dict[str, Any], loss: Any, strategy: Any) -> tuple[Any, dict[str, Any]]:
    """(one op running every replica's metric updates, {name: value}), with the `loss` metric added."""
    if LOSS_METRIC_KEY in eval_metric_ops:
        raise ValueError(f'Metric with name "{LOSS_METRIC_KEY}" is not allowed, because Estimator already defines '
                         "a default metric with the same name.")
    metric_ops = {**eval_metric_ops,
                  LOSS_METRIC_KEY: strategy.extended.call_for_each_replica(tf.compat.v1.metrics.mean, args=(loss,))}
    names = sorted(metric_ops)
    update_op = tf.group(*[strategy.group(metric_ops[name][1]) for name in names])
    return update_op, {name: metric_ops[name][0] for name in names}


def _evaluate_with_coordinator(estimator: "Estimator", input_fn: Callable[..., Any], hooks: list[Any],
                               checkpoint_path: str | None, output_dir: str) -> Any:
    """Estimator.evaluate on a remote cluster (STANDALONE_CLIENT, in-graph strategies); refused otherwise."""
    config = estimator._config
    cluster_spec = _standalone_client_cluster(config, config._eval_distribute, "Estimator.evaluate",
                                              "Estimator.evaluate")

    def worker_fn(strategy: Any) -> dict[str, Any]:
        local = _task_estimator(estimator, strategy, train=False)
        local._config._distribute_coordinator_mode = None
        chief_hooks = hooks if tf_internal.current_worker_context().is_chief else []
        return evaluate_model(local, input_fn, chief_hooks, checkpoint_path, output_dir)

    return tf_internal.run_distribute_coordinator(worker_fn, config._eval_distribute, mode=coordinator_mode(config),
                                                  cluster_spec=cluster_spec, session_config=config.session_config)


# -------------------------------------------------------------------------------------------- train_and_evaluate


def train_and_evaluate(estimator: "Estimator", train_spec: Any, eval_spec: Any, executor_cls: Any) -> None:
    """train_and_evaluate through the distribute coordinator: this task trains (chief, worker), evaluates
    (evaluator) or serves variables (ps), as TF_CONFIG says (STANDALONE_CLIENT: runs the whole cluster)."""
    config = estimator.config
    mode = coordinator_mode(config)
    if not mode:
        raise ValueError("Distribute coordinator mode is not specified in `RunConfig`.")

    def worker_fn(strategy: Any) -> None:
        local = _task_estimator(estimator, strategy, train=True)
        # In a standalone client every worker is a thread here: the user's hooks run on the chief's only.
        everywhere = mode == tf_internal.INDEPENDENT_WORKER or tf_internal.current_worker_context().is_chief
        local._config._distribute_coordinator_mode = None  # train() must not come back here
        local.train(input_fn=train_spec.input_fn, max_steps=train_spec.max_steps,
                    hooks=list(train_spec.hooks) if everywhere else [])

    def eval_fn(strategy: Any) -> None:
        local = _task_estimator(estimator, strategy, train=False)
        local._config._distribute_coordinator_mode = None
        executor_cls(local, train_spec, eval_spec).run_evaluator()

    tf_internal.run_distribute_coordinator(
        worker_fn, config.train_distribute, eval_fn, config.eval_distribute, mode=mode,
        cluster_spec=config.cluster_spec if mode == tf_internal.STANDALONE_CLIENT else None,
        session_config=config.session_config)
