"""Serving input receivers: what a serving_input_receiver_fn returns to export_saved_model.

A receiver names the tensors a served request feeds (receiver_tensors, the
SavedModel signature's inputs) and the features the model_fn gets from them.
The classes are namedtuples with tf.estimator.export's fields, checks and
messages, so serving functions written for tf.estimator run unchanged and
their errors read the same.
"""
from __future__ import annotations

import collections
from typing import Any, Callable, Self

import tensorflow as tf

from estimator.runtime import tf_internal
from estimator.runtime.inputs import parse_input_fn_result

# The dict key a single (non-dict) tensor gets, by the field it was passed as.
_SINGLE_TENSOR_KEYS = {
    "feature": tf_internal.SINGLE_FEATURE_DEFAULT_NAME,
    "label": tf_internal.SINGLE_LABEL_DEFAULT_NAME,
    "receiver_tensor": tf_internal.SINGLE_RECEIVER_DEFAULT_NAME,
    "receiver_tensors_alternative": tf_internal.SINGLE_RECEIVER_DEFAULT_NAME,
}


def _is_input_tensor(value: Any) -> bool:
    if isinstance(value, (tf.Tensor, tf.sparse.SparseTensor, tf.RaggedTensor)):
        return True
    if hasattr(value, "tensor"):  # a labeled tensor that converts to a Tensor (tf.estimator accepts it too)
        try:
            tf.convert_to_tensor(value)
        except TypeError:
            return False
        return True
    return False


def _check_tensor(value: Any, name: Any, label: str = "feature") -> None:
    if not _is_input_tensor(value):
        shown = f" {name}" if name else ""
        raise ValueError(f"{label}{shown} must be a Tensor, SparseTensor, or RaggedTensor.")


def _check_key(name: Any, label: str, allow_int_keys: bool) -> None:
    if isinstance(name, str):
        return
    if not allow_int_keys:
        raise ValueError(f"{label} keys must be strings: {name}.")
    if not isinstance(name, int):
        raise ValueError(f"{label} keys must be strings or ints: {name}.")


def wrap_and_check_input_tensors(tensors: Any, field_name: str, allow_int_keys: bool = False) -> dict[Any, Any]:
    """`tensors` as a dict of name -> tensor (a single tensor gets its field's default name), checked."""
    if tensors is None:
        raise ValueError(f"{field_name}s must be defined.")
    if not isinstance(tensors, dict):
        tensors = {_SINGLE_TENSOR_KEYS[field_name]: tensors}
    for name, tensor in tensors.items():
        _check_key(name, field_name, allow_int_keys)
        _check_tensor(tensor, name, field_name)
    return tensors


def _checked_alternatives(alternatives: Any) -> Any:
    if alternatives is None:
        return None
    if not isinstance(alternatives, dict):
        raise ValueError(f"receiver_tensors_alternatives must be a dict: {alternatives}.")
    for name, tensors in alternatives.items():  # changed in place, as tf.estimator does
        alternatives[name] = wrap_and_check_input_tensors(tensors, "receiver_tensors_alternative")
    return alternatives


class ServingInputReceiver(collections.namedtuple(
        "ServingInputReceiver", ["features", "receiver_tensors", "receiver_tensors_alternatives"])):
    """Features for the model_fn (always a dict: a single tensor becomes {"feature": tensor}) and the tensors
    a serving request feeds ({"input": tensor} when a single one); alternatives add further signatures."""

    def __new__(cls, features: Any, receiver_tensors: Any,
                receiver_tensors_alternatives: Any = None) -> Self:
        return super().__new__(
            cls,
            features=wrap_and_check_input_tensors(features, "feature", allow_int_keys=True),
            receiver_tensors=wrap_and_check_input_tensors(receiver_tensors, "receiver_tensor"),
            receiver_tensors_alternatives=_checked_alternatives(receiver_tensors_alternatives))


class TensorServingInputReceiver(collections.namedtuple(
        "TensorServingInputReceiver", ["features", "receiver_tensors", "receiver_tensors_alternatives"])):
    """Like ServingInputReceiver, for a model_fn that takes one tensor as its features: it gets it unwrapped."""

    def __new__(cls, features: Any, receiver_tensors: Any,
                receiver_tensors_alternatives: Any = None) -> "TensorServingInputReceiver":
        if features is None:
            raise ValueError("features must be defined.")
        _check_tensor(features, None)
        receiver = ServingInputReceiver(features, receiver_tensors, receiver_tensors_alternatives)
        return super().__new__(
            cls,
            features=receiver.features[tf_internal.SINGLE_FEATURE_DEFAULT_NAME],
            receiver_tensors=receiver.receiver_tensors,
            receiver_tensors_alternatives=receiver.receiver_tensors_alternatives)


class UnsupervisedInputReceiver(ServingInputReceiver):
    """What a TRAIN or EVAL input receiver fn returns for a model without labels: features and receiver
    tensors, checked and wrapped as a ServingInputReceiver's (no alternatives)."""

    def __new__(cls, features: Any, receiver_tensors: Any) -> "UnsupervisedInputReceiver":
        return super().__new__(cls, features, receiver_tensors, None)


class SupervisedInputReceiver(collections.namedtuple(
        "SupervisedInputReceiver", ["features", "labels", "receiver_tensors"])):
    """Features and labels (each a tensor or a dict, passed as they are) for a TRAIN or EVAL export."""

    def __new__(cls, features: Any, labels: Any, receiver_tensors: Any) -> "SupervisedInputReceiver":
        wrap_and_check_input_tensors(features, "feature", allow_int_keys=True)  # checked, kept as given
        wrap_and_check_input_tensors(labels, "label", allow_int_keys=True)
        return super().__new__(cls, features=features, labels=labels,
                               receiver_tensors=wrap_and_check_input_tensors(receiver_tensors, "receiver_tensor"))


def build_parsing_serving_input_receiver_fn(feature_spec: dict[str, Any],
                                            default_batch_size: int | None = None) -> Callable[[], Any]:
    """A serving_input_receiver_fn fed serialized tf.Examples (receiver tensor "examples"), parsed with
    `feature_spec` into the features."""

    def serving_input_receiver_fn() -> ServingInputReceiver:
        examples = tf.compat.v1.placeholder(tf.string, shape=[default_batch_size], name="input_example_tensor")
        features = tf.compat.v1.io.parse_example(examples, feature_spec)
        return ServingInputReceiver(features, {"examples": examples})

    return serving_input_receiver_fn


def _placeholder_like(tensor: Any, default_batch_size: int | None) -> Any:
    """A placeholder of `tensor`'s dtype and shape, batch dimension `default_batch_size`, named after its op."""
    shape = tf.TensorShape([default_batch_size]).concatenate(tensor.get_shape()[1:])
    try:
        name = tensor.op.name
    except AttributeError:  # an eager tensor has no op
        name = None
    return tf.compat.v1.placeholder(dtype=tensor.dtype, shape=shape, name=name)


def _placeholders_like(tensors: Any, default_batch_size: int | None) -> dict[Any, Any]:
    return {name: _placeholder_like(tensor, default_batch_size) for name, tensor in tensors.items()}


def build_raw_serving_input_receiver_fn(features: dict[str, Any],
                                        default_batch_size: int | None = None) -> Callable[[], Any]:
    """A serving_input_receiver_fn fed the features directly: one placeholder per entry of `features`
    (a dict of example tensors giving dtypes and shapes), each both receiver tensor and feature."""

    def serving_input_receiver_fn() -> ServingInputReceiver:
        placeholders = _placeholders_like(features, default_batch_size)
        return ServingInputReceiver(placeholders, placeholders)

    return serving_input_receiver_fn


def build_raw_supervised_input_receiver_fn(features: Any, labels: Any,
                                           default_batch_size: int | None = None) -> Callable[[], Any]:
    """A TRAIN/EVAL input receiver fn fed features and labels directly (tf.estimator.experimental's).

    `features` and `labels` (each a tensor or a dict of tensors) give the dtypes and shapes of the
    placeholders the receiver fn creates; the model_fn gets them as they are (a single tensor stays one),
    and the receiver tensors are all of them: a single feature tensor under "input", a single label under
    "label". Features and labels must not share a key.
    """
    feature_keys = features.keys() if isinstance(features, dict) else [tf_internal.SINGLE_RECEIVER_DEFAULT_NAME]
    label_keys = labels.keys() if isinstance(labels, dict) else [tf_internal.SINGLE_LABEL_DEFAULT_NAME]
    overlap = set(feature_keys) & set(label_keys)
    if overlap:
        raise ValueError(f"Features and labels must have distinct keys. Found overlapping keys: {overlap}")

    def as_placeholders(tensors: Any, single_key: str) -> tuple[Any, dict[Any, Any]]:
        """(what the model_fn gets, the receiver tensors they add)."""
        if isinstance(tensors, dict):
            placeholders = _placeholders_like(tensors, default_batch_size)
            return placeholders, placeholders
        placeholder = _placeholder_like(tensors, default_batch_size)
        return placeholder, {single_key: placeholder}

    def supervised_input_receiver_fn() -> SupervisedInputReceiver:
        feature_values, feature_receivers = as_placeholders(features, tf_internal.SINGLE_RECEIVER_DEFAULT_NAME)
        label_values, label_receivers = as_placeholders(labels, tf_internal.SINGLE_LABEL_DEFAULT_NAME)
        return SupervisedInputReceiver(feature_values, label_values, {**feature_receivers, **label_receivers})

    return supervised_input_receiver_fn


def build_supervised_input_receiver_fn_from_input_fn(input_fn: Callable[..., Any],
                                                     **input_fn_args: Any) -> Callable[[], Any]:
    """A TRAIN/EVAL input receiver fn whose placeholders match what `input_fn(**input_fn_args)` returns.

    input_fn is called once, in a graph of its own, to learn the dtypes and shapes of its features and
    labels (a dataset's elements, or the tensors it returns); the receiver fn creates placeholders like
    them in the graph it is called in.
    """
    with tf.Graph().as_default():
        features, labels, _ = parse_input_fn_result(input_fn(**input_fn_args))
    return build_raw_supervised_input_receiver_fn(features, labels)
