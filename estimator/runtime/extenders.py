"""add_metrics: an Estimator with more evaluation metrics (tf.estimator.add_metrics).

The new Estimator shares the given one's model_dir, config and warm start;
its model_fn is the given Estimator's, with metric_fn's metrics added to the
EVAL spec's eval_metric_ops (a metric of the same name replaces the model's).
"""
from __future__ import annotations

from typing import Any, Callable

from estimator.runtime.calls import fn_args
from estimator.runtime.estimator import Estimator
from estimator.runtime.mode_keys import ModeKeys

_VALID_METRIC_FN_ARGS = frozenset({"features", "labels", "predictions", "config"})


def add_metrics(estimator: Any, metric_fn: Callable[..., dict[str, Any]]) -> Estimator:
    """A new Estimator evaluating `estimator`'s metrics and metric_fn's.

    metric_fn takes any of predictions, features, labels and config (by
    name) and returns {name: a (value, update_op) pair or a Keras metric}.
    """
    invalid = list(set(fn_args(metric_fn)) - _VALID_METRIC_FN_ARGS)
    if invalid:
        raise ValueError(f"metric_fn ({metric_fn}) has following not expected args: {invalid}")

    def new_model_fn(features: Any, labels: Any, mode: str, config: Any) -> Any:
        spec = estimator.model_fn(features, labels, mode, config)
        if mode != ModeKeys.EVAL:
            return spec
        args = fn_args(metric_fn)
        available = {"features": features, "labels": labels, "predictions": spec.predictions, "config": config}
        new_metrics = metric_fn(**{name: value for name, value in available.items() if name in args})
        all_metrics = spec.eval_metric_ops or {}
        all_metrics.update(new_metrics)
        return spec._replace(eval_metric_ops=all_metrics)

    return Estimator(model_fn=new_model_fn, model_dir=estimator.model_dir, config=estimator.config,
                     warm_start_from=estimator._warm_start_settings)
