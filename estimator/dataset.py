"""Introspect a tf.data.Dataset built inside a graph: structure, batch, repeat, seeds.

Works on the dataset's ops in the graph that `input_fn` built, so every finding
can name the user's source line that created the op.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from estimator.source import op_location

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
class DatasetInfo:
    """What the rules need to know about a dataset."""

    element_spec: Any
    cardinality: int  # INFINITE, UNKNOWN or the number of elements
    batch_ops: tuple[DatasetOp, ...]
    repeat_ops: tuple[DatasetOp, ...]
    shuffles: tuple[ShuffleSeed, ...]
    source_location: str | None  # where the pipeline's last op was created

    @property
    def repeats_forever(self) -> bool:
        return self.cardinality == INFINITE


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
    """Describe `dataset`, which must have been built in the current default graph."""
    graph = tf.compat.v1.get_default_graph()
    variant = dataset._variant_tensor
    ops = _dataset_ops(variant)
    shuffle_ops = [op for op in ops if op.type in _SHUFFLE_OPS]
    fetches = {
        "cardinality": tf.data.experimental.cardinality(dataset),
        "seeds": [(op.inputs[2], op.inputs[3]) for op in shuffle_ops],
    }
    with tf.compat.v1.Session(graph=graph, config=session_config) as session:
        values = session.run(fetches)
    describe = lambda op: DatasetOp(op.type, op.name, op_location(op))  # noqa: E731
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
    )
