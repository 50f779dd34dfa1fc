"""Our own Estimator runtime on tf.compat.v1, for TensorFlow versions without tf.estimator (>= 2.16).

It imports only TensorFlow and gives tf.estimator's API and on-disk results:
graphs built in the same order (same seeds, same variables), checkpoints
`model.ckpt-<step>`, summaries and eval/ results, and the log lines users
read. estimator.api picks tf.estimator when it exists, this otherwise (or
when CEREBRAS_TF_ESTIMATOR=runtime).
"""
from estimator.runtime import export
from estimator.runtime.estimator import Estimator
from estimator.runtime.exporter import BestExporter, Exporter, FinalExporter, LatestExporter
from estimator.runtime.hooks import CheckpointSaverListener, SessionRunHook
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
    "CheckpointSaverListener",
    "Estimator",
    "EstimatorSpec",
    "EvalSpec",
    "Exporter",
    "FinalExporter",
    "LatestExporter",
    "ModeKeys",
    "RunConfig",
    "ServingInputReceiver",
    "SessionRunHook",
    "TensorServingInputReceiver",
    "TrainSpec",
    "VocabInfo",
    "WarmStartSettings",
    "build_parsing_serving_input_receiver_fn",
    "build_raw_serving_input_receiver_fn",
    "export",
    "parse_input_fn_result",
    "train_and_evaluate",
]
