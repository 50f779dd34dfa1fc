"""The three modes an Estimator builds a graph for (tf.estimator.ModeKeys' values)."""
from __future__ import annotations


class ModeKeys:
    """Standard names for model modes; the values are tf.estimator's, so SavedModel tags and user code agree."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"
