"""Resolve the Estimator API for the installed TensorFlow.

Everything the rest of the project needs from tf.estimator is imported from
here, so a future Estimator runtime for TensorFlow >= 2.16 (where tf.estimator
was removed) only has to replace this module.
"""
from __future__ import annotations

import sys
import types
from typing import Any

import tensorflow as tf

try:
    _tf_estimator = tf.estimator  # TF <= 2.15 ships tf.estimator
    Estimator = _tf_estimator.Estimator
except AttributeError as exc:  # pragma: no cover - depends on the installed TF
    raise ImportError(
        "cerebras-tf needs tf.estimator, which TensorFlow removed in 2.16. "
        f"Installed TensorFlow is {tf.__version__}; install tensorflow==2.15.1 "
        "and tensorflow-estimator==2.15.0 (see pyproject.toml)."
    ) from exc

EstimatorSpec = _tf_estimator.EstimatorSpec
RunConfig = _tf_estimator.RunConfig
ModeKeys = _tf_estimator.ModeKeys
TrainSpec = _tf_estimator.TrainSpec
EvalSpec = _tf_estimator.EvalSpec
train_and_evaluate = _tf_estimator.train_and_evaluate
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

_TRAIN_AND_EVALUATE_FRAMES = {"run_local", "run_chief", "run_worker", "_start_distributed_training"}


def called_from_train_and_evaluate() -> bool:
    """True when the current call stack runs inside tf.estimator.train_and_evaluate."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name in _TRAIN_AND_EVALUATE_FRAMES and code.co_filename.replace("\\", "/").endswith(
            "estimator/training.py"
        ):
            return True
        frame = frame.f_back
    return False


def run_config_value(config: Any, name: str) -> Any:
    """The value of a RunConfig argument, including ones RunConfig keeps private."""
    return getattr(config, "_" + name, None)
