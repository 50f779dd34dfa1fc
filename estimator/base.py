"""EstimatorBase: the one place that adapts the Estimator's internals (tf.estimator's, or the runtime's)."""
from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.python.util import function_utils

from estimator.api import Estimator, EstimatorSpec
from estimator.legacy_keras import HOW_TO_FIX


class EstimatorBase(Estimator):
    """An Estimator (estimator.api's: tf.estimator's or our runtime's) that subclasses may extend.

    tf.estimator.Estimator refuses subclasses that override its members
    (TPUEstimator is exempt by name; the runtime allows them). Accelerator estimators must redefine
    train/evaluate/predict, so this base lifts that guard, and gives one
    override point, `_adapt_spec`, applied to every spec the model_fn returns
    when the parent Estimator runs it (the CPU/GPU path).
    """

    def _assert_members_are_not_overridden(self) -> None:  # noqa: D401 - TF hook
        """Allow overrides (see the class docstring)."""

    def _call_model_fn(self, features: Any, labels: Any, mode: str, config: Any) -> EstimatorSpec:
        return self._adapt_spec(self.call_user_model_fn(features, labels, mode, config), mode)

    def call_user_model_fn(self, features: Any, labels: Any, mode: str, config: Any) -> EstimatorSpec:
        """Call the user's model_fn exactly as tf.estimator does, returning its spec unchanged.

        On TF >= 2.16, a tf.compat.v1.layers call that Keras 3 refuses gets what to do added to its message."""
        try:
            return Estimator._call_model_fn(self, features, labels, mode, config)
        except AttributeError as error:
            if "is not available with Keras 3" not in str(error):
                raise
            raise AttributeError(f"{error} {HOW_TO_FIX}") from error

    def call_user_model_fn_unchecked(self, features: Any, labels: Any, mode: str, config: Any) -> Any:
        """Call the user's model_fn with the arguments tf.estimator passes it (by name, the ones it takes), but
        return what it returned, an EstimatorSpec or not: the CS-system rules name what is wrong with it
        (tf.estimator only says "model_fn should return an EstimatorSpec.")."""
        args = function_utils.fn_args(self._model_fn)
        kwargs: dict[str, Any] = {}
        if "labels" in args:
            kwargs["labels"] = labels
        elif labels is not None:
            raise ValueError("model_fn does not take labels, but input_fn returns labels.")
        for name, value in (("mode", mode), ("params", self.params), ("config", config)):
            if name in args:
                kwargs[name] = value
        tf.compat.v1.logging.info("Calling model_fn.")
        result = self._model_fn(features=features, **kwargs)
        tf.compat.v1.logging.info("Done calling model_fn.")
        if not isinstance(result, EstimatorSpec) and _same_fields_spec(result):
            result = EstimatorSpec(**result._asdict())  # the runtime takes tf.estimator's spec as its own too
        return result

    def _adapt_spec(self, spec: EstimatorSpec, mode: str) -> EstimatorSpec:
        """Turn the model_fn's spec into one the parent Estimator runs. Identity here."""
        return spec

    @property
    def user_model_fn(self) -> Any:
        """The model_fn exactly as the user passed it."""
        return self._model_fn

    @property
    def warm_start_settings(self) -> Any:
        """The WarmStartSettings built from warm_start_from (None if not given)."""
        return self._warm_start_settings


def _same_fields_spec(value: Any) -> bool:
    """An EstimatorSpec of the other runtime (tf.estimator's on our runtime): a namedtuple named *EstimatorSpec
    with EstimatorSpec's fields, which the runtime's own model_fn call accepts as one."""
    return (isinstance(value, tuple) and type(value).__name__.endswith("EstimatorSpec")
            and getattr(value, "_fields", None) == EstimatorSpec._fields)
