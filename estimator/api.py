"""Resolve the Estimator API for the installed TensorFlow.

Everything the rest of the project needs from an Estimator runtime is
imported from here. It is tf.estimator when TensorFlow has it (TF <= 2.15
with tensorflow-estimator), and our own runtime, estimator.runtime,
otherwise (TF >= 2.16 removed tf.estimator). The environment variable
CEREBRAS_TF_ESTIMATOR chooses explicitly: `runtime` uses ours even where
tf.estimator exists (to run the project's tests on it with TF 2.15),
`tf.estimator` requires tf.estimator; unset or `auto` picks as above.
"""
from __future__ import annotations

import os
import sys
import types
from typing import Any, Callable

import tensorflow as tf

ENV_VAR = "CEREBRAS_TF_ESTIMATOR"
_CHOICES = ("auto", "runtime", "tf.estimator")


def _installed_tf_estimator() -> Any:
    """TensorFlow's tf.estimator module, or None where TensorFlow has none."""
    try:
        module = tf.estimator  # a lazy loader of tensorflow_estimator on TF <= 2.15
        module.Estimator  # noqa: B018 - loads it, failing here when tensorflow-estimator is missing
    except (AttributeError, ImportError):
        return None
    return module


def _choose() -> str:
    choice = os.environ.get(ENV_VAR, "").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ImportError(f"{ENV_VAR}={os.environ[ENV_VAR]!r} is not one of {', '.join(_CHOICES)}.")
    return choice


_choice = _choose()
_tf_estimator = None if _choice == "runtime" else _installed_tf_estimator()
if _choice == "tf.estimator" and _tf_estimator is None:
    raise ImportError(
        f"{ENV_VAR}=tf.estimator, but TensorFlow {tf.__version__} has no tf.estimator (removed in 2.16; on TF 2.15 "
        f"install tensorflow-estimator==2.15.0). Unset {ENV_VAR} to use cerebras-tf's own Estimator runtime.")

# Which runtime the project runs on: "tf.estimator" or "runtime" (estimator.runtime).
BACKEND = "runtime" if _tf_estimator is None else "tf.estimator"


if _tf_estimator is not None:
    from tensorflow_estimator.python.estimator import util as _tf_estimator_util

    # input_fn's result as (features, labels, input hooks), as the Estimator in use splits it.
    parse_input_fn_result: Callable[[Any], tuple[Any, Any, list[Any]]] = _tf_estimator_util.parse_input_fn_result

    Estimator: Any = _tf_estimator.Estimator
    EstimatorSpec: Any = _tf_estimator.EstimatorSpec
    RunConfig: Any = _tf_estimator.RunConfig
    ModeKeys: Any = _tf_estimator.ModeKeys
    WarmStartSettings: Any = _tf_estimator.WarmStartSettings
    TrainSpec: Any = _tf_estimator.TrainSpec
    EvalSpec: Any = _tf_estimator.EvalSpec
    train_and_evaluate: Any = _tf_estimator.train_and_evaluate
    Exporter: Any = _tf_estimator.Exporter
    LatestExporter: Any = _tf_estimator.LatestExporter
    FinalExporter: Any = _tf_estimator.FinalExporter
    BestExporter: Any = _tf_estimator.BestExporter
    # tf.estimator.export: serving input receivers, their builders and the ExportOutput classes.
    export_namespace: Any = _tf_estimator.export
else:
    from estimator import runtime as _runtime

    parse_input_fn_result = _runtime.parse_input_fn_result

    Estimator = _runtime.Estimator
    EstimatorSpec = _runtime.EstimatorSpec
    RunConfig = _runtime.RunConfig
    ModeKeys = _runtime.ModeKeys
    WarmStartSettings = _runtime.WarmStartSettings
    TrainSpec = _runtime.TrainSpec
    EvalSpec = _runtime.EvalSpec
    train_and_evaluate = _runtime.train_and_evaluate
    Exporter = _runtime.Exporter
    LatestExporter = _runtime.LatestExporter
    FinalExporter = _runtime.FinalExporter
    BestExporter = _runtime.BestExporter
    export_namespace = _runtime.export

ServingInputReceiver: Any = export_namespace.ServingInputReceiver
TensorServingInputReceiver: Any = export_namespace.TensorServingInputReceiver
build_raw_serving_input_receiver_fn: Any = export_namespace.build_raw_serving_input_receiver_fn
build_parsing_serving_input_receiver_fn: Any = export_namespace.build_parsing_serving_input_receiver_fn

SessionRunHook = tf.compat.v1.train.SessionRunHook
CheckpointSaverListener = tf.compat.v1.train.CheckpointSaverListener

# RunConfig arguments whose value is "not given" (the caller passed nothing).
RUN_CONFIG_DEFAULTS = {
    "save_checkpoints_steps": None,
    "save_checkpoints_secs": None,
    "train_distribute": None,
    "device_fn": None,
    "protocol": None,
    "eval_distribute": None,
    "experimental_distribute": None,
    "experimental_max_worker_delay_secs": None,
}

# Functions of train_and_evaluate's call stack, in tf.estimator's estimator/training.py and in
# our runtime's estimator/runtime/training.py.
_TRAIN_AND_EVALUATE_FRAMES = {"train_and_evaluate", "run_local", "run_chief", "run_worker", "run_evaluator",
                              "_start_distributed_training"}
_TRAIN_AND_EVALUATE_FILES = ("estimator/training.py", "estimator/runtime/training.py")


def called_from_train_and_evaluate() -> bool:
    """True when the current call stack runs inside train_and_evaluate (tf.estimator's or the runtime's)."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name in _TRAIN_AND_EVALUATE_FRAMES and code.co_filename.replace("\\", "/").endswith(
            _TRAIN_AND_EVALUATE_FILES
        ):
            return True
        frame = frame.f_back
    return False


def run_config_value(config: Any, name: str) -> Any:
    """The value of a RunConfig argument, including ones RunConfig keeps private."""
    return getattr(config, "_" + name, None)
