"""Rules on input_fn and the dataset it returns."""
from __future__ import annotations

import inspect
from typing import Any, Callable

import tensorflow as tf

from cerebras_tf.errors import CerebrasError, InputFunctionError
from estimator import CapturedInput, DatasetInfo, ModeKeys, is_none_spec
from estimator.source import function_location

_DROP_REMAINDER_FIX = "dataset = dataset.shuffle(1000).repeat().batch(batch_size, drop_remainder=True)"


def check_input_fn_signature(input_fn: Callable[..., Any]) -> list[CerebrasError]:
    """input_fn takes exactly one argument, the `params` dict."""
    try:
        parameters = list(inspect.signature(input_fn).parameters.values())
    except (TypeError, ValueError):
        return []  # a builtin or C callable: nothing to check
    names = [p.name for p in parameters]
    if names == ["params"]:
        return []
    return [
        InputFunctionError(
            f"The input function only takes a single dictionary parameter, params; {_name(input_fn)} takes "
            f"({', '.join(names)}).",
            where=function_location(input_fn),
            fix="Define it as `def input_fn(params):` and read everything it needs (batch size, data paths, mode) "
            "from params, which the CerebrasEstimator passes from its constructor.",
        )
    ]


def check_returns_dataset(captured: CapturedInput, input_fn: Callable[..., Any]) -> list[CerebrasError]:
    """input_fn must return a tf.data.Dataset."""
    if captured.is_dataset:
        return []
    return [
        InputFunctionError(
            "Input function must return a tf.data.Dataset",
            where=function_location(input_fn),
            fix=f"{_name(input_fn)} returned {type(captured.result).__name__}; build and return a tf.data.Dataset "
            "of (features, labels) instead of tensors or iterators.",
        )
    ]


def describe_structure(spec: Any) -> str:
    """A short rendering of a dataset element_spec, e.g. ({'x': float32[32,4]}, int32[32])."""
    if isinstance(spec, dict):
        return "{" + ", ".join(f"{k!r}: {describe_structure(v)}" for k, v in spec.items()) + "}"
    if isinstance(spec, (tuple, list)):
        return "(" + ", ".join(describe_structure(v) for v in spec) + ("," if len(spec) == 1 else "") + ")"
    if isinstance(spec, tf.TensorSpec):
        return f"{spec.dtype.name}{_shape(spec.shape)}"
    if is_none_spec(spec):
        return "None"
    name = type(spec).__name__
    dtype = getattr(spec, "dtype", None)
    return f"{name}({dtype.name if dtype is not None else '?'}{_shape(getattr(spec, 'shape', None))})"


def _shape(shape: Any) -> str:
    if shape is None or shape.rank is None:
        return "[?]"
    return "[" + ",".join("?" if d is None else str(d) for d in shape.as_list()) + "]"


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", None) or repr(fn)


def _split_element(spec: Any) -> tuple[Any, Any] | None:
    """(features, labels) specs if the element has that shape, else None."""
    if isinstance(spec, tf.TensorSpec):
        return spec, None
    if isinstance(spec, tuple) and len(spec) == 2:
        return spec
    return None


def check_element_structure(info: DatasetInfo) -> list[CerebrasError]:
    """Elements are (features, labels): features a dense numeric tensor, labels one or None."""
    structure = describe_structure(info.element_spec)
    split = _split_element(info.element_spec)
    fix = (
        "Make each element a (features, labels) pair of dense numeric tensors: e.g. concatenate or stack a "
        "feature dict into one tensor, densify sparse/ragged values (pad to a fixed length), and encode strings "
        "as ids in the input pipeline."
    )
    problem = None
    if split is None:
        problem = "an element must be (features, labels) or features alone"
    else:
        features, labels = split
        if not _is_dense_numeric(features):
            problem = "features must be a single dense numeric tensor"
        elif not is_none_spec(labels) and not _is_dense_numeric(labels):
            problem = "labels must be a single dense numeric tensor or None"
    if problem is None:
        return []
    return [
        InputFunctionError(
            f"Unsupported dataset element structure {structure}: {problem}.",
            where=info.source_location,
            fix=fix,
        )
    ]


def _is_dense_numeric(spec: Any) -> bool:
    return isinstance(spec, tf.TensorSpec) and spec.dtype not in (tf.string, tf.variant, tf.resource)


def check_fixed_batch(info: DatasetInfo) -> list[CerebrasError]:
    """Every component has the same static leading (batch) dimension."""
    specs = [s for s in tf.nest.flatten(info.element_spec) if isinstance(s, tf.TensorSpec)]
    batch_sizes = {
        (s.shape.as_list()[0] if s.shape.rank else None) for s in specs
    }
    if specs and None not in batch_sizes and len(batch_sizes) == 1:
        return []
    where = info.batch_ops[0].location if info.batch_ops else info.source_location
    return [
        InputFunctionError(
            "Inconsistent batch sizes detected. To ensure a fixed batch size across all steps, set "
            "`drop_remainder=True` when batching your Dataset in the input function.",
            where=where,
            fix=f"Dataset elements are {describe_structure(info.element_spec)}; batch with drop_remainder=True, "
            f"e.g. {_DROP_REMAINDER_FIX}",
        )
    ]


def check_repeats_forever(info: DatasetInfo, mode: str) -> list[CerebrasError]:
    """Training data must repeat indefinitely (repeat() with count=None)."""
    if mode != ModeKeys.TRAIN or info.repeats_forever:
        return []
    finite = [op for op in info.repeat_ops if op.type == "RepeatDataset"]
    where = finite[0].location if finite else info.source_location
    found = "a finite repeat(count)" if finite else "no repeat()"
    return [
        InputFunctionError(
            f"The training Dataset must repeat indefinitely, but it has {found} "
            f"(cardinality {'unknown' if info.cardinality < 0 else info.cardinality}). The CS system keeps asking "
            "for samples until the number of training steps set in train() is reached.",
            where=where,
            fix=f"Call repeat() with the default count=None and set steps/max_steps in train(): {_DROP_REMAINDER_FIX}",
        )
    ]


def check_shuffle_seeds(info: DatasetInfo, num_input_workers: int) -> list[CerebrasError]:
    """With several input workers, a deterministic shuffle makes every worker send the same order."""
    if num_input_workers <= 1:
        return []
    return [
        InputFunctionError(
            f"Deterministic shuffle seed with {num_input_workers} input workers: every worker would send the "
            f"same samples in the same order (resolved seeds {s.seed}, {s.seed2}). Each input worker must "
            "shuffle its data differently.",
            where=s.location,
            fix="Do not provide a deterministic random seed: drop seed= from shuffle() and do not set "
            "RunConfig(tf_random_seed=...) or tf.compat.v1.set_random_seed for CS-system training.",
        )
        for s in info.shuffles
        if s.deterministic
    ]
