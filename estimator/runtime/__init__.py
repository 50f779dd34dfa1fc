"""Our own Estimator runtime on tf.compat.v1, for TensorFlow versions without tf.estimator (>= 2.16).

It imports only TensorFlow and gives tf.estimator's API and on-disk results:
graphs built in the same order (same seeds, same variables), checkpoints
`model.ckpt-<step>`, summaries and eval/ results, and the log lines users
read. estimator.api picks tf.estimator when it exists, this otherwise (or
when CEREBRAS_TF_ESTIMATOR=runtime).

Its namespaces are tf.estimator's: this package (tf.estimator), `experimental`
(tf.estimator.experimental) and `export` (tf.estimator.export); the module
estimator.runtime.v1 holds the tf.compat.v1.estimator names whose objects
differ. Every public name of
tf.estimator 2.15 is here except the canned estimators, heads and
feature-column helpers (tests/estimator_runtime/test_public_api.py checks).
"""
from estimator.runtime import experimental, export
from estimator.runtime.estimator import Estimator
from estimator.runtime.exporter import BestExporter, Exporter, FinalExporter, LatestExporter
from estimator.runtime.extenders import add_metrics
from estimator.runtime.hooks import (
    CheckpointSaverHook,
    CheckpointSaverListener,
    FeedFnHook,
    FinalOpsHook,
    GlobalStepWaiterHook,
    LoggingTensorHook,
    NanLossDuringTrainingError,
    NanTensorHook,
    ProfilerHook,
    SecondOrStepTimer,
    SessionRunArgs,
    SessionRunContext,
    SessionRunHook,
    SessionRunValues,
    StepCounterHook,
    StopAtStepHook,
    SummarySaverHook,
)
from estimator.runtime.inputs import parse_input_fn_result
from estimator.runtime.mode_keys import ModeKeys
from estimator.runtime.run_config import RunConfig
from estimator.runtime.receivers import (
    ServingInputReceiver,
    TensorServingInputReceiver,
    build_parsing_serving_input_receiver_fn,
    build_raw_serving_input_receiver_fn,
)
from estimator.runtime.spec import EstimatorSpec
from estimator.runtime.training import EvalSpec, TrainSpec, train_and_evaluate
from estimator.runtime.warm_start import VocabInfo, WarmStartSettings

__all__ = [
    "BestExporter",
    "CheckpointSaverHook",
    "CheckpointSaverListener",
    "Estimator",
    "EstimatorSpec",
    "EvalSpec",
    "Exporter",
    "FeedFnHook",
    "FinalExporter",
    "FinalOpsHook",
    "GlobalStepWaiterHook",
    "LatestExporter",
    "LoggingTensorHook",
    "ModeKeys",
    "NanLossDuringTrainingError",
    "NanTensorHook",
    "ProfilerHook",
    "RunConfig",
    "SecondOrStepTimer",
    "ServingInputReceiver",
    "SessionRunArgs",
    "SessionRunContext",
    "SessionRunHook",
    "SessionRunValues",
    "StepCounterHook",
    "StopAtStepHook",
    "SummarySaverHook",
    "TensorServingInputReceiver",
    "TrainSpec",
    "VocabInfo",
    "WarmStartSettings",
    "add_metrics",
    "build_parsing_serving_input_receiver_fn",
    "build_raw_serving_input_receiver_fn",
    "experimental",
    "export",
    "parse_input_fn_result",
    "train_and_evaluate",
]
