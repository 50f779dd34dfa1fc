"""The names of tf.compat.v1.estimator whose objects differ from tf.estimator's (all others are the same).

tf.compat.v1.estimator.Estimator keeps TF 1's deprecated export_savedmodel,
which tf.estimator.Estimator (the runtime's Estimator) refuses with a pointer
to export_saved_model.
"""
from estimator.runtime.estimator import EstimatorV1 as Estimator

__all__ = ["Estimator"]
