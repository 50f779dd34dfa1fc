"""RunConfig: where and how an Estimator runs (checkpoints, summaries, sessions, cluster).

Same constructor arguments, defaults, properties, `replace()` and validation
messages as tf.estimator.RunConfig. Each argument `name` is kept as the
attribute `_name`, as tf.estimator keeps it: code that reads a setting the
config has no public property for (estimator.api.run_config_value) and
subclasses (CSRunConfig) rely on that.
"""
from __future__ import annotations

import copy
from typing import Any

import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

from estimator.runtime import cluster
from estimator.runtime.calls import fn_args

_USE_DEFAULT: Any = object()

# The arguments `replace()` may change (all constructor arguments).
REPLACEABLE = (
    "model_dir", "tf_random_seed", "save_summary_steps", "save_checkpoints_steps", "save_checkpoints_secs",
    "session_config", "keep_checkpoint_max", "keep_checkpoint_every_n_hours", "log_step_count_steps",
    "train_distribute", "device_fn", "protocol", "eval_distribute", "experimental_distribute",
    "experimental_max_worker_delay_secs", "session_creation_timeout_secs", "checkpoint_save_graph_def",
)

_BOTH_SAVE_SETTINGS = "`save_checkpoints_steps` and `save_checkpoints_secs` cannot be both set."


def default_session_config() -> Any:
    """The session config Estimators run with when none is given: soft placement, one grappler pass."""
    rewrite = rewriter_config_pb2.RewriterConfig(meta_optimizer_iterations=rewriter_config_pb2.RewriterConfig.ONE)
    return tf.compat.v1.ConfigProto(allow_soft_placement=True,
                                    graph_options=tf.compat.v1.GraphOptions(rewrite_options=rewrite))


def path_to_str(path: Any) -> Any:
    """A PathLike as its string; anything else unchanged."""
    return tf.compat.as_str_any(path.__fspath__()) if hasattr(path, "__fspath__") else path


class RunConfig:
    """The configuration of an Estimator run (tf.estimator.RunConfig's contract).

    With neither save_checkpoints_steps nor save_checkpoints_secs given,
    checkpoints are saved every 600 seconds; giving one turns the other off.
    TF_CONFIG (environment) sets model_dir and the cluster properties.
    """

    # The constructor's arguments, set by _set() (with validation); the cluster's, by _init_cluster().
    _model_dir: str | None
    _tf_random_seed: int | None
    _save_summary_steps: int
    _save_checkpoints_steps: int | None
    _save_checkpoints_secs: int | None
    _session_config: Any
    _keep_checkpoint_max: int
    _keep_checkpoint_every_n_hours: float
    _log_step_count_steps: int
    _train_distribute: Any
    _device_fn: Any
    _protocol: str | None
    _eval_distribute: Any
    _experimental_distribute: Any
    _experimental_max_worker_delay_secs: int | None
    _session_creation_timeout_secs: int
    _checkpoint_save_graph_def: bool
    _cluster_spec: Any
    _task_type: str | None
    _task_id: int
    _master: str
    _evaluation_master: str
    _num_ps_replicas: int
    _num_worker_replicas: int
    _global_id_in_cluster: int | None
    _is_chief: bool
    _service: dict[str, Any] | None

    def __init__(self, model_dir: str | None = None, tf_random_seed: int | None = None,
                 save_summary_steps: int = 100, save_checkpoints_steps: Any = _USE_DEFAULT,
                 save_checkpoints_secs: Any = _USE_DEFAULT, session_config: Any = None,
                 keep_checkpoint_max: int = 5, keep_checkpoint_every_n_hours: float = 10000,
                 log_step_count_steps: int = 100, train_distribute: Any = None, device_fn: Any = None,
                 protocol: str | None = None, eval_distribute: Any = None, experimental_distribute: Any = None,
                 experimental_max_worker_delay_secs: int | None = None,
                 session_creation_timeout_secs: int = 7200, checkpoint_save_graph_def: bool = True) -> None:
        steps_default, secs_default = save_checkpoints_steps is _USE_DEFAULT, save_checkpoints_secs is _USE_DEFAULT
        if steps_default and secs_default:
            save_checkpoints_steps, save_checkpoints_secs = None, 600
        elif secs_default:
            save_checkpoints_secs = None
        elif steps_default:
            save_checkpoints_steps = None
        elif save_checkpoints_steps is not None and save_checkpoints_secs is not None:
            raise ValueError(_BOTH_SAVE_SETTINGS)
        _verify_strategy_compatibility(train_distribute, eval_distribute)
        tf_config = cluster.read_tf_config()
        self._set(
            model_dir=cluster.model_dir_from(tf_config, path_to_str(model_dir)),
            tf_random_seed=tf_random_seed,
            save_summary_steps=save_summary_steps,
            save_checkpoints_steps=save_checkpoints_steps,
            save_checkpoints_secs=save_checkpoints_secs,
            session_config=session_config,
            keep_checkpoint_max=keep_checkpoint_max,
            keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
            log_step_count_steps=log_step_count_steps,
            train_distribute=train_distribute,
            device_fn=device_fn,
            protocol=protocol,
            eval_distribute=eval_distribute,
            experimental_distribute=experimental_distribute,
            experimental_max_worker_delay_secs=experimental_max_worker_delay_secs,
            session_creation_timeout_secs=session_creation_timeout_secs,
            checkpoint_save_graph_def=checkpoint_save_graph_def,
        )
        self._init_cluster(cluster.cluster_settings(tf_config))

    def _init_cluster(self, settings: cluster.ClusterSettings) -> None:
        """Take the cluster properties from TF_CONFIG; a task of a real cluster talks only to its peers."""
        for field in ("cluster_spec", "task_type", "task_id", "master", "evaluation_master", "num_ps_replicas",
                      "num_worker_replicas", "global_id_in_cluster", "is_chief", "service"):
            setattr(self, "_" + field, getattr(settings, field))
        if self._session_config is None and self._cluster_spec:
            self._set(session_config=self._distributed_session_config())

    def _distributed_session_config(self) -> Any:
        """Device filters so a task sees only the parameter servers and itself (None for other task types)."""
        filters = {
            cluster.TaskType.MASTER: ["/job:ps", "/job:master"],
            cluster.TaskType.CHIEF: ["/job:ps", "/job:chief"],
            cluster.TaskType.WORKER: ["/job:ps", f"/job:worker/task:{self._task_id}"],
            cluster.TaskType.PS: ["/job:ps", "/job:worker", "/job:chief", "/job:master"],
        }.get(self._task_type or "")
        if filters is None:
            return None
        config = default_session_config()
        config.device_filters.extend(filters)
        return config

    def _set(self, **kwargs: Any) -> "RunConfig":
        """Set arguments as `_name` attributes, then validate the whole config."""
        for name, value in kwargs.items():
            if name not in REPLACEABLE:
                raise ValueError(f"Replacing {name} is not supported. Allowed properties are {list(REPLACEABLE)}.")
            setattr(self, "_" + name, value)
        if "save_checkpoints_steps" in kwargs and "save_checkpoints_secs" in kwargs:
            if self._save_checkpoints_steps is not None and self._save_checkpoints_secs is not None:
                raise ValueError(_BOTH_SAVE_SETTINGS)
        elif "save_checkpoints_steps" in kwargs and self._save_checkpoints_steps is not None:
            self._save_checkpoints_secs = None
        elif "save_checkpoints_secs" in kwargs and self._save_checkpoints_secs is not None:
            self._save_checkpoints_steps = None
        _validate(self)
        return self

    def replace(self, **kwargs: Any) -> "RunConfig":
        """A copy with some arguments replaced (setting one checkpoint frequency clears the other)."""
        return copy.deepcopy(self)._set(**kwargs)

    # Cluster properties (from TF_CONFIG).
    @property
    def cluster_spec(self) -> Any:
        return self._cluster_spec

    @property
    def task_type(self) -> str | None:
        return self._task_type

    @property
    def task_id(self) -> int:
        return self._task_id

    @property
    def master(self) -> str:
        return self._master

    @property
    def evaluation_master(self) -> str:
        return self._evaluation_master

    @property
    def num_ps_replicas(self) -> int:
        return self._num_ps_replicas

    @property
    def num_worker_replicas(self) -> int:
        return self._num_worker_replicas

    @property
    def global_id_in_cluster(self) -> int | None:
        return self._global_id_in_cluster

    @property
    def is_chief(self) -> bool:
        return self._is_chief

    @property
    def service(self) -> dict[str, Any] | None:
        return self._service

    # The constructor's arguments.
    @property
    def model_dir(self) -> str | None:
        return self._model_dir

    @property
    def tf_random_seed(self) -> int | None:
        return self._tf_random_seed

    @property
    def save_summary_steps(self) -> int:
        return self._save_summary_steps

    @property
    def save_checkpoints_steps(self) -> int | None:
        return self._save_checkpoints_steps

    @property
    def save_checkpoints_secs(self) -> int | None:
        return self._save_checkpoints_secs

    @property
    def session_config(self) -> Any:
        return self._session_config

    @property
    def keep_checkpoint_max(self) -> int:
        return self._keep_checkpoint_max

    @property
    def keep_checkpoint_every_n_hours(self) -> float:
        return self._keep_checkpoint_every_n_hours

    @property
    def log_step_count_steps(self) -> int:
        return self._log_step_count_steps

    @property
    def train_distribute(self) -> Any:
        return self._train_distribute

    @property
    def device_fn(self) -> Any:
        """The device function for graph ops; None means the Estimator's default placement."""
        return self._device_fn

    @property
    def protocol(self) -> str | None:
        return self._protocol

    @property
    def eval_distribute(self) -> Any:
        return self._eval_distribute

    @property
    def experimental_distribute(self) -> Any:
        return self._experimental_distribute

    @property
    def experimental_max_worker_delay_secs(self) -> int | None:
        return self._experimental_max_worker_delay_secs

    @property
    def session_creation_timeout_secs(self) -> int:
        return self._session_creation_timeout_secs

    @property
    def checkpoint_save_graph_def(self) -> bool:
        return self._checkpoint_save_graph_def


def _verify_strategy_compatibility(train_distribute: Any, eval_distribute: Any) -> None:
    """Refuse TF 2's ParameterServerStrategy (itself, not a subclass), which Estimators cannot run, as
    tf.estimator.RunConfig refuses it; its tf.compat.v1 counterpart is the one for Estimators."""
    v2_strategy = getattr(tf.distribute.experimental, "ParameterServerStrategy", None)
    if v2_strategy is not None and v2_strategy in (type(train_distribute), type(eval_distribute)):
        raise ValueError("Please use `tf.compat.v1.distribute.experimental.ParameterServerStrategy` for parameter "
                         "server strategy with estimator.")


def _validate(config: RunConfig) -> None:
    """tf.estimator.RunConfig's checks on set values (None always passes)."""
    checks = (
        ("model_dir", lambda v: v, "model_dir should be non-empty"),
        ("save_summary_steps", lambda v: v >= 0, "save_summary_steps should be >= 0"),
        ("save_checkpoints_steps", lambda v: v >= 0, "save_checkpoints_steps should be >= 0"),
        ("save_checkpoints_secs", lambda v: v >= 0, "save_checkpoints_secs should be >= 0"),
        ("session_config", lambda v: isinstance(v, tf.compat.v1.ConfigProto),
         "session_config must be instance of ConfigProto"),
        ("keep_checkpoint_max", lambda v: v >= 0, "keep_checkpoint_max should be >= 0"),
        ("keep_checkpoint_every_n_hours", lambda v: v > 0, "keep_checkpoint_every_n_hours should be > 0"),
        ("log_step_count_steps", lambda v: v > 0, "log_step_count_steps should be > 0"),
        ("tf_random_seed", lambda v: isinstance(v, int), "tf_random_seed must be integer."),
        ("experimental_max_worker_delay_secs", lambda v: isinstance(v, int),
         "experimental_max_worker_delay_secs must be an integer if set."),
        ("session_creation_timeout_secs", lambda v: v > 0, "session_creation_timeout_secs should be > 0"),
        ("device_fn", lambda v: callable(v) and set(fn_args(v)) == {"op"},
         'device_fn must be callable with exactly one argument "op".'),
        ("protocol", lambda v: v in (None, "grpc", "grpc+verbs"), "protocol should be grpc or grpc+verbs"),
    )
    for name, ok, message in checks:
        value = getattr(config, "_" + name, None)
        if value is not None and not ok(value):
            raise ValueError(message)



def as_run_config(config: Any) -> RunConfig:
    """`config` as our RunConfig.

    tf.estimator's own RunConfig (TF <= 2.15) is copied into one, setting for
    setting, so a script that builds tf.estimator.RunConfig runs on this
    runtime unchanged (CEREBRAS_TF_ESTIMATOR=runtime).
    """
    if isinstance(config, RunConfig):
        return config
    if type(config).__name__ == "RunConfig" and type(config).__module__.startswith("tensorflow_estimator."):
        return RunConfig(**{name: getattr(config, "_" + name) for name in REPLACEABLE if hasattr(config, "_" + name)})
    raise ValueError(f"config must be an instance of `RunConfig`, but provided {config}.")
