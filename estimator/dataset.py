"""Introspect a tf.data.Dataset: structure, batch, repeat, seeds, the ops its functions run.

`inspect_dataset` works on the dataset's ops in the graph that `input_fn`
built, so every finding can name the user's source line that created the op:
the transformation's, the one where an element structure first appeared
(`DatasetInfo.origin`), or the op inside a map/filter/... function
(`function_op_locations`).
`failing_op_location` finds, in an eagerly built dataset, the user line of an
op that a TF error names; `dataset_call_failure` the tf.data call of input_fn
that raised while the pipeline was defined (e.g. batch(-1)). They read tf.data
internals (the variant tensor's ops, the graph's function library, a Dataset's
traced functions, the frames of tf.data's methods); this module is the only
place that does.
"""
from __future__ import annotations

import dataclasses
import inspect
import os
import traceback
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from estimator.source import is_user_file, op_location

_SHUFFLE_OPS = {
    "ShuffleDataset",
    "ShuffleDatasetV2",
    "ShuffleDatasetV3",
    "ShuffleAndRepeatDataset",
    "ShuffleAndRepeatDatasetV2",
}
_BATCH_OPS = {"BatchDataset", "BatchDatasetV2", "PaddedBatchDataset", "PaddedBatchDatasetV2", "ParallelBatchDataset"}
_REPEAT_OPS = {"RepeatDataset", "ShuffleAndRepeatDataset", "ShuffleAndRepeatDatasetV2"}

INFINITE = int(tf.data.INFINITE_CARDINALITY)
UNKNOWN = int(tf.data.UNKNOWN_CARDINALITY)


@dataclasses.dataclass(frozen=True)
class DatasetOp:
    """One dataset transformation found in the graph."""

    type: str
    name: str
    location: str | None


@dataclasses.dataclass(frozen=True)
class ShuffleSeed(DatasetOp):
    """A shuffle and the seed pair TF resolved for it (0, 0 means 'random each run')."""

    seed: int
    seed2: int

    @property
    def deterministic(self) -> bool:
        return (self.seed, self.seed2) != (0, 0)


@dataclasses.dataclass(frozen=True)
class DatasetFunction:
    """A function a dataset transformation runs (a map/filter/interleave/generator body), with the op types
    it uses, those of the functions it calls included."""

    transformation: DatasetOp
    op_types: frozenset[str]


@dataclasses.dataclass(frozen=True)
class DatasetStage:
    """One dataset of the pipeline (a transformation or the source) and the elements it produces."""

    element_spec: Any
    location: str | None  # where the user's code created it


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What the rules need to know about a dataset."""

    element_spec: Any
    cardinality: int  # INFINITE, UNKNOWN or the number of elements
    batch_ops: tuple[DatasetOp, ...]
    repeat_ops: tuple[DatasetOp, ...]
    shuffles: tuple[ShuffleSeed, ...]
    source_location: str | None  # where the pipeline's last op was created
    functions: tuple[DatasetFunction, ...] = ()
    # The pipeline, last transformation first, following each dataset's first input back to its source.
    lineage: tuple[DatasetStage, ...] = ()
    # op type -> 'file:line' of the user code that created the first op of that type in the pipeline's traced
    # functions (map/filter/... bodies), where TF recorded it: e.g. the tf.py_function call inside a map function.
    function_op_locations: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def repeats_forever(self) -> bool:
        return self.cardinality == INFINITE

    def origin(self, holds: Callable[[Any], bool]) -> str | None:
        """Where the pipeline made what `holds` finds in an element_spec: the location of the earliest of the
        last stages whose elements all satisfy `holds` (e.g. the map or from_tensor_slices that built a features
        dict, not the batch after it). The pipeline's last op when no stage has a known location."""
        location = self.source_location
        for stage in self.lineage:
            if not holds(stage.element_spec):
                break
            location = stage.location or location
        return location


class DatasetBuildError(Exception):
    """A dataset op failed when the pipeline was first run (e.g. `batch(0)`: "Batch size must be greater than
    zero."), with TF's own message, the op and the user's line that created it.

    Attributes:
      op_type, op_name: the failing op ("BatchDatasetV2"), or None when TF did not name it.
      message: TF's message for it, without TF's "Graph execution error" framing.
      location: 'file:line' of the user code that created the op, if known.
      batch_size: for a batch transformation, its (static) batch size, else None.
    """

    def __init__(self, op_type: str | None, op_name: str | None, message: str, location: str | None,
                 batch_size: int | None = None) -> None:
        self.op_type, self.op_name, self.message = op_type, op_name, message
        self.location, self.batch_size = location, batch_size
        super().__init__(f"{op_type or 'A dataset op'} failed: {message}")

    @classmethod
    def from_op_error(cls, error: tf.errors.OpError) -> "DatasetBuildError":
        op = error.op
        batch_size = None
        if op is not None and op.type in _BATCH_OPS and len(op.inputs) > 1:
            value = tf.get_static_value(op.inputs[1])
            batch_size = int(value) if value is not None else None
        core = error.message.split("\n\t [[", 1)[0].strip().splitlines()
        return cls(op.type if op is not None else None, op.name if op is not None else None,
                   core[-1] if core else error.message, op_location(op) if op is not None else None, batch_size)


_DATA_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(inspect.getfile(tf.data.Dataset)))) + os.sep


def dataset_call_failure(error: BaseException) -> DatasetBuildError | None:
    """The DatasetBuildError for an exception a tf.data call in the user's input_fn raised as the pipeline was
    defined (e.g. `batch(-1)`: "Dimension -1 must be >= 0"), naming the Dataset method, its batch size for a
    batch and the user's line; None when the exception did not come out of a tf.data call made by user code."""
    caller = None
    for frame, line in traceback.walk_tb(error.__traceback__):
        filename = os.path.abspath(frame.f_code.co_filename)
        if caller is not None and filename.startswith(_DATA_PACKAGE):
            size = frame.f_locals.get("batch_size") if "batch" in frame.f_code.co_name else None
            batch_size = int(size) if isinstance(size, (int, np.integer)) and not isinstance(size, bool) else None
            return DatasetBuildError(f"Dataset.{frame.f_code.co_name}", None, str(error), caller, batch_size)
        caller = f"{frame.f_code.co_filename}:{line}" if is_user_file(frame.f_code.co_filename) else None
    return None


def is_none_spec(spec: Any) -> bool:
    """True for the element_spec of a `None` component of a dataset element."""
    return spec is None or type(spec).__name__ == "NoneTensorSpec"


def _dataset_ops(variant: tf.Tensor) -> list[tf.Operation]:
    """The dataset-producing ops upstream of `variant`, last transformation first."""
    seen: set[str] = set()
    ordered: list[tf.Operation] = []
    stack = [variant.op]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if any(out.dtype == tf.variant for out in op.outputs):
            ordered.append(op)
        stack.extend(inp.op for inp in reversed(op.inputs) if inp.dtype == tf.variant)
    return ordered


def inspect_dataset(dataset: tf.data.Dataset, session_config: Any = None) -> DatasetInfo:
    """Describe `dataset`, which must have been built in the current default graph.

    Raises DatasetBuildError when an op of the pipeline fails as it is built (e.g. batch(0)).
    """
    graph = tf.compat.v1.get_default_graph()
    variant = dataset._variant_tensor
    ops = _dataset_ops(variant)
    shuffle_ops = [op for op in ops if op.type in _SHUFFLE_OPS]
    fetches = {
        "cardinality": tf.data.experimental.cardinality(dataset),
        "seeds": [(op.inputs[2], op.inputs[3]) for op in shuffle_ops],
    }
    with tf.compat.v1.Session(graph=graph, config=session_config) as session:
        try:
            values = session.run(fetches)
        except tf.errors.OpError as error:  # an op of the pipeline cannot be built, e.g. batch(0)
            raise DatasetBuildError.from_op_error(error) from error
    describe = lambda op: DatasetOp(op.type, op.name, op_location(op))  # noqa: E731
    functions = [(op, _called_functions(op.node_def)) for op in ops]
    return DatasetInfo(
        element_spec=dataset.element_spec,
        cardinality=int(values["cardinality"]),
        batch_ops=tuple(describe(op) for op in ops if op.type in _BATCH_OPS),
        repeat_ops=tuple(describe(op) for op in ops if op.type in _REPEAT_OPS),
        shuffles=tuple(
            ShuffleSeed(op.type, op.name, op_location(op), int(seed), int(seed2))
            for op, (seed, seed2) in zip(shuffle_ops, values["seeds"])
        ),
        source_location=op_location(variant.op),
        functions=tuple(DatasetFunction(describe(op), _function_op_types(graph, names)) for op, names in functions
                        if names),
        lineage=_lineage(dataset),
        function_op_locations=_function_op_locations(dataset),
    )


def _lineage(dataset: tf.data.Dataset) -> tuple[DatasetStage, ...]:
    """The dataset and its first inputs back to the source, each with its element_spec and where it was made."""
    stages = []
    current: tf.data.Dataset | None = dataset
    while current is not None:
        stages.append(DatasetStage(current.element_spec, op_location(current._variant_tensor.op)))
        try:
            inputs = current._inputs()
        except (AttributeError, NotImplementedError):  # a dataset type that does not list its inputs
            break
        current = inputs[0] if inputs else None
    return tuple(stages)


def _function_op_locations(dataset: tf.data.Dataset) -> dict[str, str]:
    """op type -> where the user's code created the first op of that type in the dataset's traced functions."""
    found: dict[str, str] = {}
    try:
        graphs = _function_graphs(dataset)
    except Exception:  # noqa: BLE001 - best effort: the rules fall back to the transformation's line
        return found
    for graph in graphs:
        for op in graph.get_operations():
            if op.type not in found and (location := op_location(op)):
                found[op.type] = location
    return found


def _called_functions(node_def: Any) -> list[str]:
    """Names of the functions a node's attributes name (`f`, `predicate`, `next_func`, ... and lists of them)."""
    names = []
    for attr in node_def.attr.values():
        if attr.HasField("func"):
            names.append(attr.func.name)
        elif attr.HasField("list"):
            names.extend(func.name for func in attr.list.func)
    return names


def _function_op_types(graph: tf.Graph, names: list[str]) -> frozenset[str]:
    """The op types of the named functions of `graph`'s library and of every function they call."""
    found: set[str] = set()
    seen: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        function = graph._get_function(name)
        definition = getattr(function, "definition", None)
        if definition is None:
            continue
        for node in definition.node_def:
            found.add(node.op)
            stack.extend(_called_functions(node))
    return frozenset(found)


def _function_graphs(dataset: tf.data.Dataset) -> list[Any]:
    """The traced function graphs (map/filter/... functions) of an eager dataset and its inputs."""
    graphs: list[Any] = []
    seen: set[int] = set()
    stack: list[Any] = [dataset]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        for value in list(vars(obj).values()):
            values = value if isinstance(value, (list, tuple)) else [value]
            for item in values:
                if isinstance(item, tf.data.Dataset):
                    stack.append(item)
                else:
                    function = getattr(item, "_function", None)
                    graph = getattr(function, "graph", None)
                    if graph is not None and hasattr(graph, "get_operations"):
                        graphs.append(graph)
    return graphs


def failing_op_location(dataset: tf.data.Dataset, node_names: Sequence[str]) -> str | None:
    """'file:line' of the user code that created the first of `node_names` (as a TF error names the failing
    node, e.g. "assert_less/Assert") found in the traced functions of an eagerly built `dataset`, if any."""
    if not node_names:
        return None
    try:
        graphs = _function_graphs(dataset)
    except Exception:  # noqa: BLE001 - best effort
        return None
    for node in node_names:
        best = None
        for graph in graphs:
            for op in graph.get_operations():
                matches = node == op.name or node.startswith(op.name + "/")
                if matches and (best is None or len(op.name) > len(best.name)):
                    best = op
        location = op_location(best) if best is not None else None
        if location:
            return location
    return None
