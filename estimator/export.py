"""`estimator.export`: what tf.estimator users reach as `tf.estimator.export.*`, for the runtime in use.

Serving input receivers (ServingInputReceiver, TensorServingInputReceiver),
the builders of serving_input_receiver_fns, and the ExportOutput classes:
tf.estimator.export's on TF <= 2.15, estimator.runtime.export's otherwise
(see estimator.api).
"""
from typing import Any

from estimator.api import (  # noqa: F401 - re-exported
    ServingInputReceiver,
    TensorServingInputReceiver,
    build_parsing_serving_input_receiver_fn,
    build_raw_serving_input_receiver_fn,
)
from estimator.api import export_namespace as _namespace
from estimator.runtime import export as _runtime_export

ExportOutput: Any = _namespace.ExportOutput
PredictOutput: Any = _namespace.PredictOutput
ClassificationOutput: Any = _namespace.ClassificationOutput
RegressionOutput: Any = _namespace.RegressionOutput
EvalOutput: Any = _namespace.EvalOutput

# the same names as the runtime's own estimator.runtime.export
__all__ = list(_runtime_export.__all__)
