"""The runtime's `export` namespace: what tf.estimator users reach as `tf.estimator.export.*`.

Serving input receivers and the builders of serving_input_receiver_fns, and
the ExportOutput classes a model_fn puts in EstimatorSpec.export_outputs
(TensorFlow's own classes, the ones tf.estimator.export re-exports).
"""
from estimator.runtime.receivers import (
    ServingInputReceiver,
    TensorServingInputReceiver,
    build_parsing_serving_input_receiver_fn,
    build_raw_serving_input_receiver_fn,
)
from estimator.runtime.tf_internal import (
    ClassificationOutput,
    EvalOutput,
    ExportOutput,
    PredictOutput,
    RegressionOutput,
)

__all__ = [
    "ClassificationOutput",
    "EvalOutput",
    "ExportOutput",
    "PredictOutput",
    "RegressionOutput",
    "ServingInputReceiver",
    "TensorServingInputReceiver",
    "build_parsing_serving_input_receiver_fn",
    "build_raw_serving_input_receiver_fn",
]
