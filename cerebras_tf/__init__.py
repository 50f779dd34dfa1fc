"""cerebras-tf: take TensorFlow Estimator code to the (simulated) Cerebras CS system.

Public API:
  CerebrasEstimator, CSRunConfig, CSEstimatorSpec
  set_default_tf_config
  errors: CerebrasError and its subclasses
"""
from cerebras_tf import errors
from cerebras_tf.cs_estimator import CerebrasEstimator
from cerebras_tf.errors import CerebrasError
from cerebras_tf.run_config import CSRunConfig, set_default_tf_config
from cerebras_tf.spec import CSEstimatorSpec

__all__ = [
    "CSEstimatorSpec",
    "CSRunConfig",
    "CerebrasError",
    "CerebrasEstimator",
    "errors",
    "set_default_tf_config",
]
__version__ = "0.1.0"
