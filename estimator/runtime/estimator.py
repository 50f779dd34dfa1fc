"""Estimator: train, evaluate and predict a model_fn on tf.compat.v1 graphs.

The public API and on-disk results are tf.estimator.Estimator's (TF <= 2.15):
the same arguments and checks, the same graphs, checkpoints, summaries and
log lines. The protected members tf.estimator's subclasses use
(`_call_input_fn`, `_call_model_fn`, `_create_and_assert_global_step`,
`_device_fn`, `_model_fn`, `_warm_start_settings`, ...) exist with the same
meaning, so code built on them (estimator.capture, CerebrasEstimator) runs
on either runtime. As tf.estimator's, a subclass may add members but not
redefine the Estimator's (a few are allowed); a subclass that must
(CerebrasEstimator, through estimator.EstimatorBase) redefines
`_assert_members_are_not_overridden` to lift the guard.
"""
from __future__ import annotations

import copy
import os
import tempfile
from typing import Any, Callable, Iterable, Iterator, Sequence

import tensorflow as tf

from estimator.runtime import calls, distributed, evaluator, hooks as hooks_lib, inputs, predictor, saved_model, trainer
from estimator.runtime.cluster import TaskType
from estimator.runtime.mode_keys import ModeKeys
from estimator.runtime.run_config import RunConfig, as_run_config, default_session_config, path_to_str
from estimator.runtime.spec import EstimatorSpec
from estimator.runtime.warm_start import warm_start_settings

_log = tf.compat.v1.logging


class _RemovedAttribute:
    """An attribute whose reading on an instance raises AttributeError with `message` (a removed, renamed
    method); on the class it is this object, as TF's hidden API attributes are."""

    def __init__(self, message: str) -> None:
        self._message = message

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        raise AttributeError(self._message)


class Estimator:
    """Trains, evaluates and predicts with a model_fn (tf.estimator.Estimator's contract).

    Args:
      model_fn: model_fn(features, labels, mode, params, config) -> EstimatorSpec;
        it names only the parameters it wants (features is required).
      model_dir: checkpoints, summaries and graph.pbtxt; a temporary directory
        when neither this nor config.model_dir is given (both given must agree).
      config: a RunConfig.
      params: dict passed to model_fn (and input_fn) as `params`.
      warm_start_from: a checkpoint, SavedModel directory or WarmStartSettings
        to initialize variables from when model_dir has no checkpoint.
    """

    def __init__(self, model_fn: Callable[..., Any], model_dir: str | None = None, config: RunConfig | None = None,
                 params: dict[str, Any] | None = None, warm_start_from: Any = None) -> None:
        self._assert_members_are_not_overridden()
        self._config = _config_with_model_dir(config, model_dir)
        self._train_distribution = self._config.train_distribute
        self._eval_distribution = self._config.eval_distribute
        self._model_dir: str = self._config.model_dir or ""  # never empty: _config_with_model_dir settles it
        self._session_config = self._config.session_config
        _log.info("Using config: %s", str(vars(self._config)))
        self._device_fn = self._config.device_fn or _replica_device_setter(self._config)
        if model_fn is None:
            raise ValueError("model_fn must be provided to Estimator.")
        calls.verify_model_fn_args(model_fn, params)
        self._model_fn = model_fn
        self._params = copy.deepcopy(params or {})
        self._warm_start_settings = warm_start_settings(warm_start_from)

    def _assert_members_are_not_overridden(self) -> None:
        """Refuse a subclass (the instance's own class) that redefines Estimator's members, as tf.estimator does."""
        _assert_members_are_not_overridden(Estimator, self)

    @property
    def model_dir(self) -> str:
        return self._model_dir

    @property
    def config(self) -> RunConfig:
        """A copy of the RunConfig (changing it does not change the Estimator)."""
        return copy.deepcopy(self._config)

    @property
    def params(self) -> dict[str, Any]:
        """A copy of params."""
        return copy.deepcopy(self._params)

    @property
    def model_fn(self) -> Callable[[Any, Any, str, RunConfig], EstimatorSpec]:
        """The model_fn bound to this Estimator's params: model_fn(features, labels, mode, config)."""

        def public_model_fn(features: Any, labels: Any, mode: str, config: RunConfig) -> EstimatorSpec:
            return self._call_model_fn(features, labels, mode, config)

        return public_model_fn

    # ------------------------------------------------------------------ checkpoints

    def latest_checkpoint(self) -> str | None:
        """The path of model_dir's latest checkpoint, or None."""
        return tf.train.latest_checkpoint(self.model_dir)

    def get_variable_names(self) -> list[str]:
        """The names of the variables in the latest checkpoint."""
        self._require_checkpoint()
        return [name for name, _ in tf.train.list_variables(self.model_dir)]

    def get_variable_value(self, name: str) -> Any:
        """The value (numpy) of variable `name` in the latest checkpoint."""
        self._require_checkpoint()
        return tf.train.load_variable(self.model_dir, name)

    def _require_checkpoint(self) -> None:
        if not tf.train.latest_checkpoint(self.model_dir):
            raise ValueError(f"Could not find trained model in model_dir: {self.model_dir}.")

    def eval_dir(self, name: str | None = None) -> str:
        """Where evaluate(name=...) writes its summaries: model_dir/eval or model_dir/eval_<name>."""
        return os.path.join(self._model_dir, "eval_" + name if name else "eval")

    # ------------------------------------------------------------------ train / evaluate / predict

    def train(self, input_fn: Callable[..., Any], hooks: Iterable[Any] | None = None, steps: int | None = None,
              max_steps: int | None = None, saving_listeners: Iterable[Any] | None = None) -> "Estimator":
        """Train until `steps` more steps, global step `max_steps`, or the end of the input; returns self.

        Nothing runs when model_dir's checkpoint is already at max_steps.
        """
        if self.config.task_type in (TaskType.EVALUATOR, TaskType.PS):
            raise ValueError("Train has been called wrong configuration. Please use tf.estimator.train_and_evaluate "
                             f"which calls proper API according to given configuration. Current configuration: "
                             f"{self.config}.")
        if steps is not None and max_steps is not None:
            raise ValueError("Can not provide both steps and max_steps.")
        if steps is not None and steps <= 0:
            raise ValueError(f"Must specify steps > 0, given: {steps}")
        if max_steps is not None and max_steps <= 0:
            raise ValueError(f"Must specify max_steps > 0, given: {max_steps}")
        if max_steps is not None and max_steps <= trainer.global_step_in(self._model_dir):
            _log.info("Skipping training since max_steps has already saved.")
            return self
        all_hooks = hooks_lib.check_hooks(hooks) + hooks_lib.train_step_hooks(steps, max_steps)
        listeners = hooks_lib.check_listeners(saving_listeners)
        loss = self._train_model(input_fn, all_hooks, listeners)
        _log.info("Loss for final step: %s.", loss)
        return self

    def _train_model(self, input_fn: Callable[..., Any], hooks: list[Any], saving_listeners: list[Any]) -> Any:
        if self._train_distribution is not None:  # train_distribute: the model_fn on every replica
            return distributed.train_model(self, input_fn, hooks, saving_listeners)
        return trainer.train_model(self, input_fn, hooks, saving_listeners)

    def evaluate(self, input_fn: Callable[..., Any], steps: int | None = None, hooks: Iterable[Any] | None = None,
                 checkpoint_path: str | None = None, name: str | None = None) -> dict[str, Any]:
        """Evaluate `checkpoint_path` (default: the latest) over `steps` batches or the whole input.

        Returns the metrics (eval_metric_ops, `loss`: the mean batch loss, and
        `global_step`), also written as summaries to eval_dir(name).
        """
        all_hooks = hooks_lib.check_hooks(hooks)
        if steps is not None:
            if steps <= 0:
                raise ValueError(f"Must specify steps > 0, given: {steps}")
            all_hooks.append(hooks_lib.StopAfterNEvalsHook(num_evals=steps))
        if not checkpoint_path:
            checkpoint_path = tf.train.latest_checkpoint(self._model_dir)
            if not checkpoint_path:
                _log.info(f"Could not find trained model in model_dir: {self._model_dir}, running initialization to "
                          "evaluate.")
        if self._eval_distribution is not None:  # eval_distribute: the metrics computed per replica
            return distributed.evaluate_model(self, input_fn, all_hooks, checkpoint_path, self.eval_dir(name))
        return evaluator.evaluate_model(self, input_fn, all_hooks, checkpoint_path, self.eval_dir(name))

    def predict(self, input_fn: Callable[..., Any], predict_keys: Sequence[str] | None = None,
                hooks: Iterable[Any] | None = None, checkpoint_path: str | None = None,
                yield_single_examples: bool = True) -> Iterator[Any]:
        """Yield predictions from `checkpoint_path` (default: the latest) until the input ends.

        One example at a time (each a dict when predictions are a dict), or
        whole batches with yield_single_examples=False; predict_keys selects
        dict entries. Like tf.estimator's, this is a generator: nothing is
        checked or built until the first prediction is asked for.
        """
        all_hooks = hooks_lib.check_hooks(hooks)
        if not checkpoint_path:
            checkpoint_path = tf.train.latest_checkpoint(self._model_dir)
            if not checkpoint_path:
                _log.info(f"Could not find trained model in model_dir: {self._model_dir}, running initialization to "
                          "predict.")
        yield from predictor.predict_model(self, input_fn, predict_keys, all_hooks, checkpoint_path,
                                           yield_single_examples)

    # ------------------------------------------------------------------ export

    def export_saved_model(self, export_dir_base: Any, serving_input_receiver_fn: Callable[[], Any] | None,
                           assets_extra: dict[str, str] | None = None, as_text: bool = False,
                           checkpoint_path: str | None = None, experimental_mode: str = ModeKeys.PREDICT) -> bytes:
        """Export the model as a SavedModel in export_dir_base/<timestamp>/; returns that path (bytes).

        serving_input_receiver_fn() returns a ServingInputReceiver (or
        TensorServingInputReceiver): the request's tensors and the features
        model_fn gets. Its signatures are the spec's export_outputs (default:
        "serving_default", the predictions). The weights are the checkpoint's
        (default: the latest; an error when there is none).
        assets_extra: {destination under assets.extra/: source file}.
        """
        if not serving_input_receiver_fn:
            raise ValueError("An input_receiver_fn must be defined.")
        receiver_fn_map = {experimental_mode: serving_input_receiver_fn}
        return saved_model.export_all_saved_models(self, export_dir_base, receiver_fn_map, assets_extra, as_text,
                                                   checkpoint_path)

    # tf.estimator.Estimator (TF 2) has no export_savedmodel: reading it says what to use instead. The
    # tf.compat.v1 Estimator (EstimatorV1 below) still has it.
    export_savedmodel = _RemovedAttribute(
        "`Estimator.export_savedmodel` has been deprecated. Please use `export_saved_model` instead.")

    def experimental_export_all_saved_models(self, export_dir_base: Any,
                                             input_receiver_fn_map: dict[str, Callable[[], Any]],
                                             assets_extra: dict[str, str] | None = None, as_text: bool = False,
                                             checkpoint_path: str | None = None) -> bytes:
        """One SavedModel with a MetaGraph per mode in `input_receiver_fn_map` ({ModeKeys: receiver fn}).

        TRAIN and EVAL receivers return SupervisedInputReceivers (features and
        labels); their MetaGraphs keep the loss, metrics and train_op.
        """
        return saved_model.export_all_saved_models(self, export_dir_base, input_receiver_fn_map, assets_extra, as_text,
                                                   checkpoint_path)

    # ------------------------------------------------------------------ graph building (subclasses use these)

    def _create_global_step(self, graph: tf.Graph) -> Any:
        """The global step variable of `graph` (int64 `global_step`)."""
        return tf.compat.v1.train.create_global_step(graph)

    def _create_and_assert_global_step(self, graph: tf.Graph) -> Any:
        """Create the global step and check it is the graph's integer global step."""
        step = self._create_global_step(graph)
        assert step is tf.compat.v1.train.get_global_step(graph)
        assert step.dtype.is_integer
        return step

    def _call_input_fn(self, input_fn: Callable[..., Any], mode: str, input_context: Any = None) -> Any:
        """input_fn called with the mode/params/config/input_context it names (on the CPU)."""
        return calls.call_input_fn(input_fn, mode, self.params, self.config, input_context)

    def _get_features_and_labels_from_input_fn(self, input_fn: Callable[..., Any], mode: str) -> Any:
        """(features, labels, input hooks) of input_fn's result, built in the current graph."""
        return inputs.parse_input_fn_result(self._call_input_fn(input_fn, mode))

    def _get_features_from_input_fn(self, input_fn: Callable[..., Any], mode: str) -> tuple[Any, list[Any]]:
        """(features, input hooks) for PREDICT: labels, if the input has them, are dropped."""
        features, _, input_hooks = inputs.parse_input_fn_result(self._call_input_fn(input_fn, mode))
        if not inputs.reads_from_input_pipeline(features):
            _log.warning("Input graph does not use tf.data.Dataset or contain a QueueRunner. That means predict "
                         "yields forever. This is probably a mistake.")
        return features, input_hooks

    def _call_model_fn(self, features: Any, labels: Any, mode: str, config: RunConfig) -> EstimatorSpec:
        """model_fn called with the labels/mode/params/config it names; returns its EstimatorSpec."""
        return calls.call_model_fn(self._model_fn, features, labels, mode, self.params, config)


# Members a subclass may redefine (tf.estimator's list: its API-export bookkeeping and a few extension points).
_ALLOWED_OVERRIDES = frozenset({
    "model_fn", "_create_and_assert_global_step", "_export_all_saved_models", "_tf_api_names", "_tf_api_names_v1",
    "_estimator_api_names", "_estimator_api_names_v1", "_estimator_api_constants", "_estimator_api_constants_v1",
    "latest_checkpoint"})


def _assert_members_are_not_overridden(cls: type, obj: Any) -> None:
    """ValueError when obj's class itself redefines a member of `cls` outside _ALLOWED_OVERRIDES (TPUEstimator,
    by name, is exempt, as in tf.estimator)."""
    if type(obj).__name__ == "TPUEstimator":
        return
    estimator_members = {name for name in dir(cls) if not name.startswith("__")}
    common = (estimator_members & set(type(obj).__dict__)) - _ALLOWED_OVERRIDES
    overridden = sorted(name for name in common if getattr(cls, name) != getattr(type(obj), name))
    if overridden:
        raise ValueError(f"Subclasses of Estimator cannot override members of Estimator. {type(obj)} does override "
                         f"{overridden}")


def is_estimator(value: Any) -> bool:
    """An Estimator: the runtime's, or tf.estimator's (TF <= 2.15; its canned estimators too), which the
    runtime's train_and_evaluate and hooks accept as tf.estimator's do (recognised by class, without importing
    tensorflow_estimator)."""
    return isinstance(value, Estimator) or any(
        cls.__name__ == "Estimator" and cls.__module__ == "tensorflow_estimator.python.estimator.estimator"
        for cls in type(value).__mro__)


class EstimatorV1(Estimator):
    """tf.compat.v1.estimator.Estimator: the Estimator with TF 1's deprecated export_savedmodel as well."""

    def _assert_members_are_not_overridden(self) -> None:
        _assert_members_are_not_overridden(EstimatorV1, self)

    def export_savedmodel(self, export_dir_base: Any, serving_input_receiver_fn: Callable[[], Any] | None,
                          assets_extra: dict[str, str] | None = None, as_text: bool = False,
                          checkpoint_path: str | None = None, strip_default_attrs: bool = False) -> bytes:
        """export_saved_model under its TF 1 name (deprecated), which by default keeps attributes that have
        their default value in the graph (strip_default_attrs=False); export_saved_model strips them."""
        _log.warning("export_savedmodel (from estimator.runtime.estimator) is deprecated and will be removed in a "
                     "future version.\nInstructions for updating:\nThis function has been renamed, use "
                     "`export_saved_model` instead.")
        if not serving_input_receiver_fn:
            raise ValueError("An input_receiver_fn must be defined.")
        return saved_model.export_all_saved_models(self, export_dir_base, {ModeKeys.PREDICT: serving_input_receiver_fn},
                                                   assets_extra, as_text, checkpoint_path,
                                                   strip_default_attrs=strip_default_attrs)


def _config_with_model_dir(config: RunConfig | None, model_dir: Any) -> RunConfig:
    """The Estimator's own config: model_dir settled (argument, config or a temp dir), a default session config."""
    if config is None:
        config = RunConfig()
        _log.info("Using default config.")
    config = as_run_config(config)
    if config.session_config is None:
        config = config.replace(session_config=default_session_config())
    model_dir = path_to_str(model_dir)
    if model_dir is not None and config.model_dir is not None and config.model_dir != model_dir:
        raise ValueError("`model_dir` are set both in constructor and `RunConfig`, but with different values. In "
                         f"constructor: '{model_dir}', in `RunConfig`: '{config.model_dir}' ")
    if model_dir:
        return config.replace(model_dir=model_dir)
    if config.model_dir is None:
        model_dir = tempfile.mkdtemp()
        _log.warning("Using temporary folder as model directory: %s", model_dir)
        return config.replace(model_dir=model_dir)
    return config


def _replica_device_setter(config: RunConfig) -> Any:
    """With parameter servers in the cluster, variables go to them and ops stay on this task (else None)."""
    if not config.num_ps_replicas:
        return None
    worker = f"/job:{config.task_type}/task:{config.task_id}" if config.task_type else "/job:worker"
    return tf.compat.v1.train.replica_device_setter(ps_tasks=config.num_ps_replicas, worker_device=worker,
                                                    merge_devices=True, cluster=config.cluster_spec)
