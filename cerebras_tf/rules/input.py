"""Rules on input_fn and the dataset it returns.

The dataset rules read a DatasetInfo of the dataset precheck captured, so each
runs once, before anything is compiled or any input-worker server starts;
those about input workers also read the run's InputWorkerSettings.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import tensorflow as tf

from cerebras_tf.errors import CerebrasError, InputFunctionError
from cerebras_tf.settings import InputWorkerSettings
from estimator import CapturedInput, DatasetBuildError, DatasetInfo, ModeKeys, is_none_spec
from estimator.source import caller_location, creation_location, function_location

_DROP_REMAINDER_FIX = "dataset = dataset.shuffle(1000).repeat().batch(batch_size, drop_remainder=True)"


# What the CS system passes to input_fn: params, positionally (input workers) and by keyword (graph capture,
# as tf.estimator's _call_input_fn does).
CS_INPUT_FN_ARGS = ("params",)
# What tf.estimator.Estimator passes by keyword to an input_fn that names them.
ESTIMATOR_INPUT_FN_ARGS = ("params", "mode", "config")


def unfilled_input_fn_parameters(input_fn: Callable[..., Any], passed: tuple[str, ...]) -> list[str] | None:
    """The parameters of input_fn a caller passing only `passed` leaves without a value (None: no signature).

    The one signature rule behind both the CS system's check (passed = CS_INPUT_FN_ARGS: `params` must also be
    the first parameter, so input_fn(params) binds it) and precheck's "can the Estimator call it at all"
    (passed = ESTIMATOR_INPUT_FN_ARGS). Parameters with defaults, *args and **kwargs never need a value.
    """
    try:
        parameters = list(inspect.signature(input_fn).parameters.values())
    except (TypeError, ValueError):
        return None  # a builtin or C callable: nothing to check
    keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    unfilled = [
        p.name for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and not (p.name in passed and p.kind in keyword_kinds)
    ]
    positional_params = (bool(parameters) and parameters[0].name == "params"
                         and parameters[0].kind == inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if passed == CS_INPUT_FN_ARGS and not positional_params and "params" not in unfilled:
        unfilled.insert(0, "params")  # input_fn(params) would not bind it (or it has no such parameter)
    return unfilled


def check_input_fn_signature(input_fn: Callable[..., Any]) -> list[CerebrasError]:
    """input_fn is callable as `input_fn(params)`: its first parameter is `params`, any other has a default
    (e.g. the Model Zoo's `def train_input_fn(params, input_context=None)`) or is *args/**kwargs."""
    if not callable(input_fn):
        return [_not_callable(input_fn)]
    unfilled = unfilled_input_fn_parameters(input_fn, CS_INPUT_FN_ARGS)
    if not unfilled:
        return []
    names = list(inspect.signature(input_fn).parameters)
    others = [name for name in unfilled if name != "params"]
    return [
        InputFunctionError(
            f"The input function only takes a single dictionary parameter, params; {_name(input_fn)} takes "
            f"({', '.join(names)}).",
            where=function_location(input_fn),
            fix="Define it as `def input_fn(params):` and read everything it needs (batch size, data paths, mode) "
            "from params, which the CerebrasEstimator passes from its constructor"
            + (f"; or give {', '.join(others)} a default value (e.g. `{others[0]}=None`), since the CS system "
               "passes params only." if others else "."),
        )
    ]


def _not_callable(input_fn: Any) -> CerebrasError:
    """input_fn is a value (a dataset, a batch, a number) instead of the function that builds the dataset."""
    if isinstance(input_fn, tf.data.Dataset):
        got, fix = "a tf.data.Dataset", ("Pass the function that builds it, `def input_fn(params): ... return "
                                         "dataset`: the Estimator calls it inside the graph it builds for each run.")
    else:
        text = repr(input_fn)
        got = f"{type(input_fn).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
        fix = ("Pass the function itself, `train(input_fn, ...)`, not its result `train(input_fn(params), ...)`: "
               "`def input_fn(params): ... return dataset`.")
    return InputFunctionError(f"input_fn must be a callable that returns a tf.data.Dataset, got {got}.",
                              where=caller_location(), fix=fix)


def check_returns_dataset(captured: CapturedInput, input_fn: Callable[..., Any]) -> list[CerebrasError]:
    """input_fn must return a tf.data.Dataset. Tensors returned instead (e.g. a TF1 iterator's get_next())
    are reported where they were made, anything else at `def input_fn`."""
    if captured.is_dataset:
        return []
    return [
        InputFunctionError(
            "Input function must return a tf.data.Dataset",
            where=creation_location(captured.result) or function_location(input_fn),
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
    """(features, labels) specs as tf.estimator's parse_input_fn_result splits the element, else None.

    A 2-tuple (or list) is (features, labels); any other tuple/list cannot be split; anything else
    (a tensor, a dict of them) is features alone, with labels None.
    """
    if isinstance(spec, (tuple, list)):
        return (spec[0], spec[1]) if len(spec) == 2 else None
    return spec, None


_NON_NUMERIC = (tf.string, tf.variant, tf.resource)
_COMPONENT_FIX = {
    "a SparseTensor": "densify it in the input pipeline (tf.sparse.to_dense, padded to a fixed shape)",
    "a RaggedTensor": "pad it to a fixed length in the input pipeline (ragged.to_tensor(shape=[batch, length]))",
    "a string tensor": "encode the strings as integer ids in the input pipeline (e.g. a tf.lookup table)",
}


def _unsupported_components(spec: Any, path: str) -> list[tuple[str, str]]:
    """(path, what it is) of every component of a features/labels nest the CS system cannot take."""
    if isinstance(spec, Mapping):
        return [found for key in sorted(spec) for found in _unsupported_components(spec[key], f"{path}[{key!r}]")]
    if isinstance(spec, (tuple, list)):
        return [found for i, value in enumerate(spec) for found in _unsupported_components(value, f"{path}[{i}]")]
    if isinstance(spec, tf.TensorSpec):
        if spec.dtype in _NON_NUMERIC:
            return [(path, f"a {spec.dtype.name} tensor")]
        return []
    if is_none_spec(spec):
        return [(path, "None")]
    if isinstance(spec, tf.SparseTensorSpec):
        return [(path, "a SparseTensor")]
    if isinstance(spec, tf.RaggedTensorSpec):
        return [(path, "a RaggedTensor")]
    return [(path, f"a {type(spec).__name__}")]


def _element_problems(spec: Any) -> list[tuple[str, str]]:
    """(path, what it is) of every component of a splittable element the CS system cannot take."""
    split = _split_element(spec)
    if split is None:
        return []
    features, labels = split
    found = _unsupported_components(features, "features")
    if not is_none_spec(labels):
        found += _unsupported_components(labels, "labels")
    return found


def check_element_structure(info: DatasetInfo) -> list[CerebrasError]:
    """Elements are (features, labels) or features alone: features a dense numeric tensor or a nest
    (dict/tuple/list, as the Model Zoo's transformers feed) of them, labels the same or None.

    A problem is reported where the pipeline made it (the from_tensor_slices or map that built the element
    or the bad component), not at the batch or prefetch after it."""
    structure = describe_structure(info.element_spec)
    split = _split_element(info.element_spec)
    if split is None:
        return [
            InputFunctionError(
                f"Unsupported dataset element structure {structure}: an element must be (features, labels) "
                "or features alone.",
                where=info.origin(lambda spec: _split_element(spec) is None),
                fix="Make each element a (features, labels) pair: e.g. move the extra components into a features "
                "dict, ({'x': x, 'weights': w}, labels).",
            )
        ]
    found = _element_problems(info.element_spec)
    if not found:
        return []
    component_fixes = [f"{path}: {_COMPONENT_FIX.get(what, 'make it a dense numeric tensor')}" for path, what in found]
    return [
        InputFunctionError(
            f"Unsupported dataset element structure {structure}: "
            + "; ".join(f"{path} is {what}" for path, what in found)
            + ". Features and labels must be dense numeric tensors, or dicts/tuples of them (labels may be None).",
            where=info.origin(lambda spec: found[0] in _element_problems(spec)),
            fix="; ".join(component_fixes) + ".",
        )
    ]


def check_dataset_builds(error: DatasetBuildError | None) -> list[CerebrasError]:
    """The dataset's ops can be built (precheck runs the pipeline's setup once): e.g. a batch size > 0.

    `error` is what inspecting the dataset raised (None: it built). TF says only "Graph execution error"
    around the op's own message; this names the transformation, its argument and the user's line.
    """
    if error is None:
        return []
    if error.batch_size is not None and error.batch_size <= 0:
        return [InputFunctionError(
            f"dataset.batch({error.batch_size}): the batch size must be a positive integer, got "
            f"{error.batch_size} (TensorFlow: {error.message})",
            where=error.location,
            fix="Batch with the per-step batch size, e.g. dataset.batch(params['batch_size'], drop_remainder=True) "
                "with params={'batch_size': 32}; check the value input_fn reads from params.")]
    return [InputFunctionError(
        f"The input pipeline cannot be built: {error.op_type or 'a dataset op'} fails with: {error.message}",
        where=error.location,
        fix="Fix the arguments of that transformation in input_fn (TensorFlow's message above says which).")]


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


def check_shuffle_seeds(info: DatasetInfo, input_workers: InputWorkerSettings) -> list[CerebrasError]:
    """With several input workers, a deterministic shuffle makes every worker send the same order.

    A shuffle is deterministic with a seed of its own or a graph seed (RunConfig.tf_random_seed, both resolved
    in the captured graph), or when tf.random.set_seed was called: the input stream runs input_fn eagerly,
    where that global seed fixes every shuffle's seeds.
    """
    workers = input_workers.num_workers
    if workers <= 1:
        return []
    global_seed = input_workers.global_seed
    return [
        InputFunctionError(
            f"Deterministic shuffle seed with {workers} input workers: every worker would send the "
            f"same samples in the same order ("
            + (f"resolved seeds {s.seed}, {s.seed2}" if s.deterministic else f"global seed {global_seed}")
            + "). Each input worker must shuffle its data differently.",
            where=s.location,
            fix="Do not provide a deterministic random seed: drop seed= from shuffle() and do not set "
            "RunConfig(tf_random_seed=...), tf.random.set_seed or tf.compat.v1.set_random_seed for CS-system "
            "training.",
        )
        for s in info.shuffles
        if s.deterministic or global_seed is not None
    ]


# Ops that call back into the Python interpreter that created them (tf.py_function, tf.numpy_function,
# tf.compat.v1.py_func, Dataset.from_generator).
PYTHON_FUNCTION_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


def check_remote_python_functions(info: DatasetInfo, input_workers: InputWorkerSettings,
                                  mode: str) -> list[CerebrasError]:
    """Training with the TF_CONFIG input workers: no Python functions in the pipeline. tf.data service ships
    the dataset graph to other machines, where the Python function behind a py_function op does not exist.
    (In-process workers share the chief's process, and evaluation/prediction read in the chief's process.)"""
    if mode != ModeKeys.TRAIN or input_workers.plan.mode != "cluster":
        return []
    found = [function for function in info.functions if function.op_types & PYTHON_FUNCTION_OPS]
    if not found:
        return []
    call = next((info.function_op_locations[op] for op in sorted(PYTHON_FUNCTION_OPS)
                 if op in info.function_op_locations), None)  # the tf.py_function line, inside a map function
    return [
        InputFunctionError(
            "The dataset uses tf.py_function/tf.numpy_function, which cannot run on remote input workers: "
            "the Python function exists only in the chief's process.",
            where=call or found[0].transformation.location or info.source_location,
            fix="Express the preprocessing with TensorFlow ops, or run without TF_CONFIG workers "
            "(in-process workers via CSRunConfig(num_input_workers=N) share the chief's process).",
        )
    ]
