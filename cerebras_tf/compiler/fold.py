"""Constant folding: the values of everything that depends only on constants and static shapes.

TF gradient graphs are full of shape arithmetic (Shape, BroadcastGradientArgs,
Fill, Reshape of computed shapes). A tensor is constant here when its op is a
Const, a shape query (Shape, ShapeN, Size, Rank, VariableShape) of a tensor
whose static shape is known, or a stateless op whose data inputs are all
constant. Values come from Python where that is trivial (shapes, splats) and
otherwise from TensorFlow itself, evaluating the constant subgraph copied into
a clean graph (no control edges, no variables, nothing the user's graph would
run as a side effect), with the functions it calls from the captured graph's
library.
"""
from __future__ import annotations

import re

import copy
import dataclasses
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from cerebras_tf.compiler.functions import library as function_library

SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "VariableShape"})
SPLAT_OPS = {"ZerosLike": 0, "OnesLike": 1}
# Ops never folded even with constant inputs (functions, control flow, graph inputs).
NEVER_FOLD = frozenset({
    "If", "StatelessIf", "While", "StatelessWhile", "PartitionedCall", "StatefulPartitionedCall",
    "Placeholder", "PlaceholderWithDefault", "IteratorGetNext", "VarHandleOp", "NoOp",
})


@dataclasses.dataclass(frozen=True)
class Splat:
    """A scalar repeated over a shape: a constant that is never materialised."""

    value: Any
    shape: tuple[int, ...]
    dtype: np.dtype

    def materialise(self) -> np.ndarray:
        return np.full(self.shape, self.value, dtype=self.dtype)


Value = Any  # np.ndarray | Splat


def as_splat(value: np.ndarray) -> Splat | None:
    """A Splat for an array of one repeated value (with more than one element), else None."""
    if value.size > 1 and value.dtype != object:
        first = value.flat[0]
        if value.size > _SPLAT_HEAD and not _all_first(value.flat[:_SPLAT_HEAD], first):
            return None  # most large constants (masks, tables) differ early: no pass over all of them
        if _all_first(value, first):
            return Splat(first.item(), tuple(value.shape), value.dtype)
    return None


_SPLAT_HEAD = 4096


def _all_first(value: np.ndarray, first: Any) -> bool:
    """Every element equals `first` (all NaN when `first` is a NaN)."""
    return bool(np.all(value == first)) or (value.dtype.kind == "f" and bool(np.isnan(first))
                                            and bool(np.all(np.isnan(value))))


def static_shape(tensor: tf.Tensor) -> list[int] | None:
    """The fully static shape of a tensor, or None."""
    shape = tensor.shape
    return shape.as_list() if shape.is_fully_defined() else None


def variable_shape(handle: tf.Tensor) -> list[int] | None:
    """Static shape of the variable behind a resource handle (through Identity ops)."""
    op = handle.op
    while op.type in ("Identity",) and op.inputs:
        op = op.inputs[0].op
    if op.type == "VarHandleOp":
        shape = tf.TensorShape(op.get_attr("shape"))
        return shape.as_list() if shape.is_fully_defined() else None
    return None


# The Fill that tf.gradients creates as d(loss)/d(loss).
GRADIENT_SEED = re.compile(r"(^|/)gradients(_\d+)?/grad_ys_\d+$")


def is_gradient_seed(op: tf.Operation) -> bool:
    """True for the gradient seed of a tf.gradients call (the loss-scaling point)."""
    return op.type == "Fill" and bool(GRADIENT_SEED.search(op.name))


class Folder:
    """Which tensors of a graph are constant, and their values.

    `ops` must be in topological order. `known` gives values for tensors of
    the graph (by name) that are constant for a reason the graph cannot show,
    e.g. a function's inputs bound to constants. `functions` looks up the
    functions a constant op calls (a tf.switch_case on a constant index) in
    the captured graph's library (functions.function_def).
    """

    def __init__(self, ops: Sequence[tf.Operation], known: Mapping[str, Value] | None = None,
                 functions: Callable[[str], Any] | None = None) -> None:
        self._functions = functions or (lambda name: None)
        self._values: dict[str, Value] = dict(known or {})
        self._const: set[str] = set(self._values)
        self._by_tf: dict[str, tf.Operation] = {}  # ops whose outputs TF must compute
        self.folded_ops = 0
        for op in ops:
            self._classify(op)

    # ---- classification ---------------------------------------------------
    def _classify(self, op: tf.Operation) -> None:
        if all(out.name in self._const for out in op.outputs) and op.outputs:
            return  # bound by `known`
        if is_gradient_seed(op):
            return  # d(loss)/d(loss) is scaled at run time (loss scaling): never a constant
        python = self._python_value(op)
        if python is not None:
            for out, value in zip(op.outputs, python):
                self._values[out.name] = value
                self._const.add(out.name)
            self.folded_ops += 1
            return
        if op.type in NEVER_FOLD or not op.inputs or _is_stateful(op):
            return
        if any(t.dtype in (tf.resource, tf.variant) for t in list(op.inputs) + list(op.outputs)):
            return
        if all(t.name in self._const for t in op.inputs):
            self._by_tf[op.name] = op
            self._const.update(out.name for out in op.outputs)
            self.folded_ops += 1

    def _python_value(self, op: tf.Operation) -> list[Value] | None:
        """Values computed without TF: constants, shape queries, splats. None if not applicable."""
        if op.type == "Const":
            return [tf.make_ndarray(op.get_attr("value"))]
        if op.type in SHAPE_OPS:
            return self._shape_value(op)
        if op.type in SPLAT_OPS:
            shape = static_shape(op.inputs[0])
            if shape is None:
                return None
            return [Splat(SPLAT_OPS[op.type], tuple(shape), op.outputs[0].dtype.as_numpy_dtype)]
        if op.type in ("Fill", "BroadcastTo") and all(t.name in self._values for t in op.inputs):
            dims, scalar = (op.inputs[0], op.inputs[1]) if op.type == "Fill" else (op.inputs[1], op.inputs[0])
            shape, value = self._values[dims.name], self._values[scalar.name]
            if isinstance(shape, np.ndarray) and _scalar_of(value) is not None:
                return [Splat(_scalar_of(value), tuple(int(d) for d in shape),
                              op.outputs[0].dtype.as_numpy_dtype)]
        return None

    def _shape_value(self, op: tf.Operation) -> list[Value] | None:
        out_type = op.outputs[0].dtype.as_numpy_dtype
        if op.type == "VariableShape":
            shape = variable_shape(op.inputs[0])
            return None if shape is None else [np.array(shape, dtype=out_type)]
        if op.type == "Rank":
            rank = op.inputs[0].shape.rank
            return None if rank is None else [np.array(rank, dtype=out_type)]
        shapes = [static_shape(t) for t in op.inputs]
        known = [s for s in shapes if s is not None]
        if len(known) < len(shapes):
            return None
        if op.type == "Size":
            return [np.array(int(np.prod(known[0], dtype=np.int64)), dtype=out_type)]
        return [np.array(s, dtype=out_type) for s in known]

    # ---- queries ------------------------------------------------------------
    def is_const(self, tensor: tf.Tensor) -> bool:
        return tensor.name in self._const

    def evaluate(self, tensors: Iterable[tf.Tensor]) -> None:
        """Compute (in one TF session) the values of the given constant tensors not yet known.

        Values of LARGE_VALUE_BYTES or more are fetched one at a time, and one that equals an earlier one
        is that same (read-only) array: the R1.6 Transformer's decoder layers each fold the same causal
        mask tiled over the batch (4096x1x256x256 float16, 512 MB), which were fetched together and held
        six times."""
        wanted = [t for t in tensors if t.name in self._const and t.name not in self._values]
        wanted = list({t.name: t for t in wanted}.values())
        if not wanted:
            return
        graph_def, fetch_names = self._constant_subgraph(wanted)
        large = [_static_bytes(t) >= LARGE_VALUE_BYTES for t in wanted]
        with tf.Graph().as_default() as graph:
            tf.graph_util.import_graph_def(graph_def, name="")
            fetches = [graph.get_tensor_by_name(name) for name in fetch_names]
            with tf.compat.v1.Session(graph=graph, config=literal_session_config()) as session:
                small = [(t, f) for t, f, big in zip(wanted, fetches, large) if not big]
                for (tensor, _), value in zip(small, session.run([f for _, f in small]) if small else []):
                    self._store(tensor, np.asarray(value))
                earlier: list[np.ndarray] = []
                for tensor, fetch, big in zip(wanted, fetches, large):
                    if big:
                        self._store(tensor, _shared(np.asarray(session.run(fetch)), earlier))

    def _store(self, tensor: tf.Tensor, value: np.ndarray) -> None:
        self._values[tensor.name] = as_splat(value) or value

    def value(self, tensor: tf.Tensor) -> Value:
        if tensor.name not in self._values:
            self.evaluate([tensor])
        return self._values[tensor.name]

    def _constant_subgraph(self, wanted: Sequence[tf.Tensor]) -> tuple[Any, list[str]]:
        """A GraphDef computing `wanted` from known values, with no control edges."""
        graph_def = tf.compat.v1.GraphDef()
        feeds: dict[str, str] = {}
        added: set[str] = set()
        stack = [t.op for t in wanted]
        order: list[tf.Operation] = []
        while stack:
            op = stack.pop()
            if op.name in added:
                continue
            added.add(op.name)
            order.append(op)
            stack.extend(t.op for t in op.inputs if t.name not in self._values)
        for op in order:
            node = copy.deepcopy(op.node_def)
            node.ClearField("device")
            node.attr.pop("_class", None)
            del node.input[:]
            for tensor in op.inputs:
                if tensor.name in self._values:
                    if tensor.name not in feeds:
                        feeds[tensor.name] = f"folded_input_{len(feeds)}_"
                        feed = graph_def.node.add()
                        feed.name, feed.op = feeds[tensor.name], "Const"
                        feed.attr["dtype"].type = tensor.dtype.as_datatype_enum
                        feed.attr["value"].tensor.CopyFrom(tensor_proto(self._values[tensor.name], tensor.dtype))
                    node.input.append(feeds[tensor.name])
                else:
                    node.input.append(tensor.name)
            graph_def.node.append(node)
        graph_def.library.CopyFrom(function_library(graph_def.node, self._functions))
        return graph_def, [t.name for t in wanted]


def tensor_proto(value: Value, dtype: tf.DType) -> Any:
    """The TensorProto of a known value; a Splat's holds its one value and its shape (TF's Const repeats
    it), not every element: GPT-NeoX 20B's 44 rotary attention layers each fed ones(2048, 2048) float32
    to a MatrixBandPart as 16 MB of bytes, 740 MB of the 748 MB folded graph."""
    if isinstance(value, Splat):
        if all(value.shape):
            return tf.make_tensor_proto(np.asarray(value.value, dtype=value.dtype), dtype=dtype,
                                        shape=value.shape)
        value = value.materialise()  # no elements: nothing to repeat
    return tf.make_tensor_proto(value, dtype=dtype)


def literal_session_config() -> Any:
    """A session config that runs the graph as written: no grappler (meta optimizer) and no classic graph
    optimizer (its constant folding, CSE, inlining). The folded subgraph is all constants, so both would
    only fold it again before running it: on GPT-3 20B's (3,678 nodes, 44 attention masks of 2048x2048)
    they took 15-23 s and 1.8 GB more of the compile; the values are the same kernels' (compared equal)."""
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    config.graph_options.optimizer_options.do_constant_folding = False
    return config


LARGE_VALUE_BYTES = 256 << 20


def _static_bytes(tensor: tf.Tensor) -> int:
    shape = static_shape(tensor)
    if shape is None or tensor.dtype in (tf.string, tf.resource, tf.variant):
        return 0
    return int(np.prod(shape, dtype=np.int64)) * tensor.dtype.size


def _shared(value: np.ndarray, earlier: list[np.ndarray]) -> np.ndarray:
    """`value`, or the array of `earlier` with the same dtype, shape and bytes; a new distinct value joins
    `earlier`. The arrays are made read-only: several tensors may hold one."""
    value = np.ascontiguousarray(value)
    for other in earlier:
        if other.dtype == value.dtype and other.shape == value.shape and _same_bytes(other, value):
            return other
    value.flags.writeable = False
    earlier.append(value)
    return value


def _same_bytes(a: np.ndarray, b: np.ndarray, chunk: int = 1 << 24) -> bool:
    """Two contiguous arrays' bytes are equal: compared a chunk at a time (no array-sized temporaries),
    stopping at the first chunk that differs."""
    x, y = a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
    return all(np.array_equal(x[i:i + chunk], y[i:i + chunk]) for i in range(0, x.size, chunk))


def _scalar_of(value: Value) -> Any:
    if isinstance(value, Splat):
        return value.value
    if isinstance(value, np.ndarray) and value.size == 1:
        return value.reshape(()).item()
    return None


def _is_stateful(op: tf.Operation) -> bool:
    try:
        return bool(op.op_def.is_stateful)
    except (AttributeError, ValueError):
        return True
