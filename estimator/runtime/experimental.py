"""The runtime's `experimental` namespace: what tf.estimator users reach as `tf.estimator.experimental.*`.

The canned estimators tf.estimator.experimental also holds (LinearSDCA,
RNNClassifier, RNNEstimator; in tf.compat.v1 also KMeans and the DNN/linear
logit_fn builders) are not part of the runtime.
"""
from estimator.runtime.calls import call_logit_fn
from estimator.runtime.early_stopping import (
    make_early_stopping_hook,
    stop_if_higher_hook,
    stop_if_lower_hook,
    stop_if_no_decrease_hook,
    stop_if_no_increase_hook,
)
from estimator.runtime.receivers import build_raw_supervised_input_receiver_fn
from estimator.runtime.training_hooks import InMemoryEvaluatorHook, make_stop_at_checkpoint_step_hook

__all__ = [
    "InMemoryEvaluatorHook",
    "build_raw_supervised_input_receiver_fn",
    "call_logit_fn",
    "make_early_stopping_hook",
    "make_stop_at_checkpoint_step_hook",
    "stop_if_higher_hook",
    "stop_if_lower_hook",
    "stop_if_no_decrease_hook",
    "stop_if_no_increase_hook",
]
