"""EstimatorSpec: what a model_fn returns, validated as tf.estimator validates it.

A namedtuple with tf.estimator's fields and defaults, so code that unpacks,
`_replace`s or `_asdict`s a spec works unchanged. Validation raises the same
errors with the same messages, because users (and tests) match on them.
"""
from __future__ import annotations

import collections
from typing import Any, Iterable

import tensorflow as tf

from estimator.runtime import tf_internal
from estimator.runtime.mode_keys import ModeKeys

LOSS_METRIC_KEY = "loss"

_NOT_IN_DEFAULT_GRAPH = (
    '{0} with "{1}" must be from the default graph. '
    "Possible causes of this error include: \n\n"
    "1) {0} was created outside the context of the default graph."
    "\n\n"
    "2) The object passed through to EstimatorSpec was not created "
    'in the most recent call to "model_fn".'
)


class EstimatorSpec(collections.namedtuple("EstimatorSpec", [
        "mode", "predictions", "loss", "train_op", "eval_metric_ops", "export_outputs", "training_chief_hooks",
        "training_hooks", "scaffold", "evaluation_hooks", "prediction_hooks"])):
    """Ops and objects returned from a model_fn and run by an Estimator (tf.estimator.EstimatorSpec's contract).

    mode is required; TRAIN needs loss and train_op, EVAL needs loss, PREDICT
    needs predictions. Hooks become tuples, a missing scaffold a default
    Scaffold, missing predictions/eval_metric_ops empty dicts, and a PREDICT
    spec gets default export outputs (a PredictOutput over the predictions).
    """

    def __new__(cls, mode: str, predictions: Any = None, loss: Any = None, train_op: Any = None,
                eval_metric_ops: Any = None, export_outputs: Any = None, training_chief_hooks: Any = None,
                training_hooks: Any = None, scaffold: Any = None, evaluation_hooks: Any = None,
                prediction_hooks: Any = None) -> "EstimatorSpec":
        train_op = _checked_train_op(train_op, mode)
        loss = _checked_loss(loss, mode)
        predictions = _checked_predictions(predictions, mode)
        if mode == ModeKeys.PREDICT:
            export_outputs = tf_internal.export_outputs_for(export_outputs, predictions)
        return super().__new__(
            cls,
            mode=mode,
            predictions=predictions,
            loss=loss,
            train_op=train_op,
            eval_metric_ops=_checked_eval_metric_ops(eval_metric_ops),
            export_outputs=export_outputs,
            training_chief_hooks=_checked_hooks(training_chief_hooks),
            training_hooks=_checked_hooks(training_hooks),
            scaffold=_checked_scaffold(scaffold),
            evaluation_hooks=_checked_hooks(evaluation_hooks),
            prediction_hooks=_checked_hooks(prediction_hooks),
        )

    def _replace(self, **kwargs: Any) -> "EstimatorSpec":
        """A new, re-validated spec with some fields replaced; the mode cannot change."""
        if "mode" in kwargs and kwargs["mode"] != self.mode:
            raise ValueError("mode of EstimatorSpec cannot be changed.")
        fields = self._asdict()
        fields.update(kwargs)
        return EstimatorSpec(**fields)


def as_estimator_spec(result: Any) -> EstimatorSpec:
    """The model_fn's result as our EstimatorSpec.

    tf.estimator's own EstimatorSpec (same fields) is accepted too, so a
    model_fn written against tf.estimator on TF <= 2.15 runs on this runtime
    unchanged (CEREBRAS_TF_ESTIMATOR=runtime).
    """
    if isinstance(result, EstimatorSpec):
        return result
    if (isinstance(result, tuple) and type(result).__name__.endswith("EstimatorSpec")
            and getattr(result, "_fields", None) == EstimatorSpec._fields):
        return EstimatorSpec(**result._asdict())  # type: ignore[attr-defined]  # a namedtuple, checked above
    raise ValueError("model_fn should return an EstimatorSpec.")


def _in_default_graph(value: Any) -> bool:
    # An eager tensor has no graph (its .graph raises): it is not the model's.
    return tf.executing_eagerly() or getattr(value, "graph", None) is tf.compat.v1.get_default_graph()


def _name(value: Any) -> str:
    return getattr(value, "name", None) or repr(value)  # an eager tensor's .name raises


def _is_tensor(value: Any) -> bool:
    return isinstance(value, tf.compat.v2.__internal__.types.Tensor)


def _tensor(value: Any, name: str) -> Any:
    if not _is_tensor(value):
        raise TypeError(f"{name} must be Tensor, given: {value}")
    return value


def _checked_train_op(train_op: Any, mode: str) -> Any:
    if train_op is None:
        if mode == ModeKeys.TRAIN:
            raise ValueError("Missing train_op.")
        return None
    if not (isinstance(train_op, tf.Operation) or _is_tensor(train_op)):
        raise TypeError(f"train_op must be Operation or Tensor, given: {train_op}")
    if isinstance(train_op, tf.Variable):
        train_op = train_op.op
    if not _in_default_graph(train_op):
        raise ValueError(_NOT_IN_DEFAULT_GRAPH.format("train_op", _name(train_op)))
    return train_op


def _checked_loss(loss: Any, mode: str) -> Any:
    if loss is None:
        if mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
            raise ValueError("Missing loss.")
        return None
    loss = _tensor(loss, "loss")
    shape = loss.get_shape()
    if shape.num_elements() not in (None, 1):
        raise ValueError(f"Loss must be scalar, given: {loss}")
    if not shape.is_compatible_with(tf.TensorShape([])):
        loss = tf.reshape(loss, [])
    if not _in_default_graph(loss):
        raise ValueError(_NOT_IN_DEFAULT_GRAPH.format("loss", _name(loss)))
    return loss


def _checked_predictions(predictions: Any, mode: str) -> Any:
    if predictions is None:
        if mode == ModeKeys.PREDICT:
            raise ValueError("Missing predictions.")
        return {}
    if isinstance(predictions, dict):
        predictions = {key: _tensor(value, f"predictions[{key}]") for key, value in predictions.items()}
        for key, value in predictions.items():
            if not _in_default_graph(value):
                raise ValueError(_NOT_IN_DEFAULT_GRAPH.format("prediction values", f"{key}: {_name(value)}"))
        return predictions
    predictions = _tensor(predictions, "predictions")
    if not _in_default_graph(predictions):
        raise ValueError(_NOT_IN_DEFAULT_GRAPH.format("prediction values", _name(predictions)))
    return predictions


def _checked_hooks(hooks: Iterable[Any] | None) -> tuple[Any, ...]:
    hooks = tuple(hooks or [])
    for hook in hooks:
        if not isinstance(hook, tf.compat.v1.train.SessionRunHook):
            raise TypeError(f"All hooks must be SessionRunHook instances, given: {hook}")
    return hooks


def _is_keras_metric(value: Any) -> bool:
    """A Keras Metric object, recognised without importing Keras (Keras 3 on TF >= 2.16 is slow to load)."""
    return any(cls.__name__ == "Metric" and cls.__module__.split(".")[0] in ("keras", "tf_keras", "tensorflow")
               for cls in type(value).__mro__)


def _checked_eval_metric_ops(eval_metric_ops: Any) -> dict[str, Any]:
    if eval_metric_ops is None:
        return {}
    if not isinstance(eval_metric_ops, dict):
        raise TypeError(f"eval_metric_ops must be a dict, given: {eval_metric_ops}")
    for key, value in eval_metric_ops.items():
        if _is_keras_metric(value):
            if not value.updates:
                raise ValueError(f'Please call update_state(...) on the "{value.name}" metric')
        elif not isinstance(value, tuple) or len(value) != 2:
            raise TypeError(f"Values of eval_metric_ops must be (metric_value, update_op) tuples, given: {value} "
                            f"for key: {key}")
    for key, value in eval_metric_ops.items():
        members = [*value.updates, value.result()] if _is_keras_metric(value) else tf.nest.flatten(value)
        for member in members:
            if not _in_default_graph(member):
                raise ValueError(_NOT_IN_DEFAULT_GRAPH.format("eval_metric_ops", f"{key}: {_name(member)}"))
    metric_variables: list[Any] = []
    for key, value in list(eval_metric_ops.items()):
        if _is_keras_metric(value):
            metric_variables.extend(value.variables)
            eval_metric_ops[key] = (value.result(), value.updates[0])
    for collection in (tf.compat.v1.GraphKeys.LOCAL_VARIABLES, tf.compat.v1.GraphKeys.METRIC_VARIABLES):
        present = {id(variable) for variable in tf.compat.v1.get_collection(collection)}
        for variable in metric_variables:
            if id(variable) not in present:  # variables are compared by identity (TF2 makes them unhashable)
                tf.compat.v1.add_to_collection(collection, variable)
                present.add(id(variable))
    return eval_metric_ops


def _checked_scaffold(scaffold: Any) -> Any:
    scaffold = scaffold or tf.compat.v1.train.Scaffold()
    if not isinstance(scaffold, tf.compat.v1.train.Scaffold):
        raise TypeError(f"scaffold must be tf.train.Scaffold. Given: {scaffold}")
    return scaffold
