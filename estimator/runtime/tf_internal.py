"""The few TensorFlow internals the runtime needs, in one place.

Everything else in the runtime uses tf / tf.compat.v1. These two have no
public equivalent and exist unchanged from TF 2.15 to 2.21:

- the global step "read" tensor Estimator graphs create right after the
  global step (model_fn ops are built after it, so op-level random seeds
  match tf.estimator's only when it exists);
- the default export outputs of a PREDICT spec (a PredictOutput over the
  predictions), whose classes SavedModel export works with.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.python.saved_model.model_utils import export_output as _export_output
from tensorflow.python.saved_model.model_utils import export_utils as _export_utils
from tensorflow.python.training import training_util as _training_util

ExportOutput = _export_output.ExportOutput
PredictOutput = _export_output.PredictOutput


def create_global_step_read(graph: tf.Graph) -> Any:
    """The tensor that reads the global step (created once per graph, as tf.estimator's TRAIN graph does)."""
    return _training_util._get_or_create_global_step_read(graph)


def export_outputs_for(export_outputs: Any, predictions: Any) -> dict[str, Any]:
    """Validated export outputs, with the default serving signature over `predictions` added when missing."""
    return _export_utils.get_export_outputs(export_outputs, predictions)
