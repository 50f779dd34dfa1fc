"""`import cerebras_tf.legacy_estimator`: the opt-in one-liner for unchanged tf.estimator scripts on TF >= 2.16.

Makes `tf.estimator` (and `tf.compat.v1.estimator`) resolve to cerebras-tf's Estimator runtime
(estimator.install_as_tf_estimator); on TensorFlow 2.15 with tensorflow-estimator it changes nothing.
Importing it also routes tf.compat.v1.layers to tf-keras (TF_USE_LEGACY_KERAS), as any cerebras_tf import does.
"""
from estimator import install_as_tf_estimator

tf_estimator = install_as_tf_estimator()

__all__ = ["tf_estimator"]
