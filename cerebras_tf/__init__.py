"""cerebras-tf: take TensorFlow Estimator code to the (simulated) Cerebras CS system.

Public API:
  CerebrasEstimator, CSRunConfig, CSEstimatorSpec, set_default_tf_config
  ModeKeys, EstimatorSpec (the Estimator's, for the installed TensorFlow: tf.estimator's
    on TF 2.15, cerebras-tf's own runtime on TF >= 2.16), so a model_fn needs no tf.estimator
  release_system (free a simulated system programmed in this process)
  errors (CerebrasError and its subclasses), amp (half dtypes, GradScaler)
  tf_helper.GetWeights (a checkpoint's weights as numpy, as the Model Zoo's
  cerebras.tf.tf_helper.GetWeights)

The names that need TensorFlow are imported on first use, so the numpy-only
parts (cerebras_tf.wse, cerebras_tf.amp) load without TensorFlow. Loading one
also quiets TensorFlow's log (`cerebras_tf.logs`: each message once, no
deprecation notices about calls the user did not write).
"""
from __future__ import annotations

import importlib
from typing import Any

from cerebras_tf import errors
from cerebras_tf.errors import CerebrasError
from cerebras_tf.wse.system import release_system

_LAZY = {
    "CerebrasEstimator": "cerebras_tf.cs_estimator",
    "CSRunConfig": "cerebras_tf.run_config",
    "set_default_tf_config": "cerebras_tf.run_config",
    "CSEstimatorSpec": "cerebras_tf.spec",
    "ModeKeys": "estimator",
    "EstimatorSpec": "estimator",
}

__all__ = ["CSEstimatorSpec", "CSRunConfig", "CerebrasError", "CerebrasEstimator", "EstimatorSpec", "ModeKeys",
           "errors", "release_system", "set_default_tf_config"]
__version__ = "0.2.0"


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from cerebras_tf import logs

        logs.install()
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cerebras_tf' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
