"""The few TensorFlow internals the runtime needs, in one place.

Everything else in the runtime uses tf / tf.compat.v1. These have no
public equivalent and exist unchanged from TF 2.15 to 2.21 (CI runs the
suite on 2.15, 2.16 and 2.21): whatever comes to differ between the
TensorFlow versions the runtime supports belongs here.

- the global step "read" tensor Estimator graphs create right after the
  global step (model_fn ops are built after it, so op-level random seeds
  match tf.estimator's only when it exists);
- the default export outputs of a PREDICT spec (a PredictOutput over the
  predictions), whose classes SavedModel export works with;
- MonitoredTrainingSession looked up, when training starts, in TF's
  training module, where tf.estimator looks it up: code that patches it
  there (tf.estimator's own tests do, to see the hooks and summary settings
  an Estimator trains with) sees the runtime's session the same way;
- SavedModel export's helpers (TensorFlow's saved_model.model_utils, the
  ones tf.estimator itself exports with): the export outputs and signature
  defs for a mode, the tags of each mode, timestamped export directories, and
  the dict keys a single receiver/feature tensor gets. Using them keeps the
  signatures exactly tf.estimator's.
"""
from __future__ import annotations

import contextlib
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import distribute_coordinator as _coordinator
from tensorflow.python.distribute import distribute_coordinator_context as _coordinator_context
from tensorflow.python.distribute import multi_worker_util as _multi_worker_util
from tensorflow.python.saved_model.model_utils import export_output as _export_output
from tensorflow.python.saved_model.model_utils import export_utils as _export_utils
from tensorflow.python.training import basic_session_run_hooks as _basic_hooks
from tensorflow.python.training import training as _training
from tensorflow.python.training import training_util as _training_util

ExportOutput = _export_output.ExportOutput
PredictOutput = _export_output.PredictOutput
ClassificationOutput = _export_output.ClassificationOutput
RegressionOutput = _export_output.RegressionOutput
EvalOutput = _export_output.EvalOutput

build_all_signature_defs = _export_utils.build_all_signature_defs
export_outputs_for_mode = _export_utils.export_outputs_for_mode
get_timestamped_export_dir = _export_utils.get_timestamped_export_dir
get_temp_export_dir = _export_utils.get_temp_export_dir
SINGLE_FEATURE_DEFAULT_NAME: str = _export_utils.SINGLE_FEATURE_DEFAULT_NAME
SINGLE_RECEIVER_DEFAULT_NAME: str = _export_utils.SINGLE_RECEIVER_DEFAULT_NAME
SINGLE_LABEL_DEFAULT_NAME: str = _export_utils.SINGLE_LABEL_DEFAULT_NAME


def export_tags(mode: str) -> Any:
    """The MetaGraph tags of a mode's export (PREDICT: "serve", TRAIN: "train", EVAL: "eval")."""
    return _export_utils.EXPORT_TAG_MAP[mode]


def monitored_training_session(**kwargs: Any) -> Any:
    """tf.compat.v1.train.MonitoredTrainingSession(**kwargs), as TF's training module holds it now."""
    return _training.MonitoredTrainingSession(**kwargs)


def create_global_step_read(graph: tf.Graph) -> Any:
    """The tensor that reads the global step (created once per graph, as tf.estimator's TRAIN graph does)."""
    return _training_util._get_or_create_global_step_read(graph)


def export_outputs_for(export_outputs: Any, predictions: Any) -> dict[str, Any]:
    """Validated export outputs, with the default serving signature over `predictions` added when missing."""
    return _export_utils.get_export_outputs(export_outputs, predictions)


def add_train_op(builder: Any, train_op: Any) -> None:
    """Record a TRAIN/EVAL export's train_op in the SavedModel (the builder keeps it in a collection; no-op
    for None). SavedModelBuilder has no public way to do this; tf.estimator uses the same method."""
    builder._add_train_op(train_op)


# The distribute coordinator (tensorflow/python/distribute/distribute_coordinator.py, unchanged from TF 2.15 to
# 2.21): runs a function per task of a TF_CONFIG cluster under a worker context that MonitoredTrainingSession reads.
STANDALONE_CLIENT: str = _coordinator.CoordinatorMode.STANDALONE_CLIENT
INDEPENDENT_WORKER: str = _coordinator.CoordinatorMode.INDEPENDENT_WORKER
run_distribute_coordinator = _coordinator.run_distribute_coordinator
current_worker_context = _coordinator_context.get_current_worker_context
normalize_cluster_spec = _multi_worker_util.normalize_cluster_spec
GLOBAL_STEP_READ_KEY: str = _training_util.GLOBAL_STEP_READ_KEY


def scale_loss_for_estimator(strategy: Any) -> Any:
    """The context in which a V1 optimizer under `strategy` scales the loss by 1/replicas, as tf.estimator
    asks of it (no-op for a strategy without it)."""
    enabled = getattr(strategy, "_scale_loss_for_estimator_enabled", None)
    return enabled() if enabled is not None else contextlib.nullcontext()


def loss_is_scaled_by_optimizer(graph: tf.Graph) -> bool:
    """Whether a V1 optimizer in `graph` scaled the loss by 1/replicas (then the reported loss is reduced by
    the strategy's loss reduction, not summed)."""
    return bool(getattr(graph, "_is_loss_scaled_by_optimizer", False))


def create_steps_per_run_variable() -> Any:
    """The host-side steps_per_run variable (local) tf.estimator creates before evaluating under a strategy."""
    return _basic_hooks.get_or_create_steps_per_run_variable()


def scaffold_init_fn(scaffold: Any) -> Any:
    """The init_fn a Scaffold was given (None if none); Scaffold keeps it only in a private attribute."""
    return scaffold._user_init_fn
