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
from estimator import export  # noqa: E402
from estimator.api import (
    BACKEND,
    BestExporter,
    CheckpointSaverListener,
    Estimator,
    EstimatorSpec,
    EvalSpec,
    Exporter,
    FinalExporter,
    LatestExporter,
    ModeKeys,
    RunConfig,
    ServingInputReceiver,
    SessionRunHook,
    TensorServingInputReceiver,
    TrainSpec,
    WarmStartSettings,
    build_parsing_serving_input_receiver_fn,
    build_raw_serving_input_receiver_fn,
    called_from_train_and_evaluate,
    run_config_value,
    train_and_evaluate,
)
from estimator.base import EstimatorBase
from estimator.capture import CapturedInput, CapturedModel, capture_input, capture_model
from estimator.dataset import (
    DatasetBuildError,
    DatasetInfo,
    ShuffleSeed,
    dataset_call_failure,
    inspect_dataset,
    is_none_spec,
)
from estimator.legacy import install_as_tf_estimator

__all__ = [
    "BACKEND",
    "BestExporter",
    "CapturedInput",
    "CapturedModel",
    "CheckpointSaverListener",
    "DatasetBuildError",
    "DatasetInfo",
    "Estimator",
    "EstimatorBase",
    "EstimatorSpec",
    "EvalSpec",
    "Exporter",
    "FinalExporter",
    "LatestExporter",
    "ModeKeys",
    "RunConfig",
    "ServingInputReceiver",
    "SessionRunHook",
    "ShuffleSeed",
    "TensorServingInputReceiver",
    "TrainSpec",
    "WarmStartSettings",
    "build_parsing_serving_input_receiver_fn",
    "build_raw_serving_input_receiver_fn",
    "called_from_train_and_evaluate",
    "capture_input",
    "capture_model",
    "dataset_call_failure",
    "export",
    "inspect_dataset",
    "install_as_tf_estimator",
    "is_none_spec",
    "run_config_value",
    "train_and_evaluate",
]
