"""The accelerator-agnostic Estimator layer.

Resolves the Estimator API for the installed TensorFlow (tf.estimator on
TF <= 2.15, our own runtime, estimator.runtime, otherwise; see estimator.api),
captures input_fn + model_fn into a graph for a mode, and introspects
datasets. Nothing outside this package touches tensorflow_estimator internals.
On TF >= 2.16 importing it first routes tf.compat.v1.layers to tf-keras
(estimator.legacy_keras); estimator.install_as_tf_estimator() makes
`tf.estimator` this package's runtime for unchanged legacy scripts.
"""
from estimator.legacy_keras import prefer_legacy_keras as _prefer_legacy_keras

_prefer_legacy_keras()  # before the imports below bring in TensorFlow
from estimator.api import (
    BACKEND,
    CheckpointSaverListener,
    Estimator,
    EstimatorSpec,
    EvalSpec,
    ModeKeys,
    RunConfig,
    SessionRunHook,
    TrainSpec,
    WarmStartSettings,
    called_from_train_and_evaluate,
    run_config_value,
    train_and_evaluate,
)
from estimator.base import EstimatorBase
from estimator.capture import CapturedInput, CapturedModel, capture_input, capture_model
from estimator.dataset import DatasetInfo, ShuffleSeed, inspect_dataset, is_none_spec
from estimator.legacy import install_as_tf_estimator

__all__ = [
    "BACKEND",
    "CapturedInput",
    "CapturedModel",
    "CheckpointSaverListener",
    "DatasetInfo",
    "Estimator",
    "EstimatorBase",
    "EstimatorSpec",
    "EvalSpec",
    "ModeKeys",
    "RunConfig",
    "SessionRunHook",
    "ShuffleSeed",
    "TrainSpec",
    "WarmStartSettings",
    "called_from_train_and_evaluate",
    "capture_input",
    "capture_model",
    "inspect_dataset",
    "install_as_tf_estimator",
    "is_none_spec",
    "run_config_value",
    "train_and_evaluate",
]
