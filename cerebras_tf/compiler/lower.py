"""Lower a captured Estimator graph to the WSE IR.

Walks back from what the mode needs (TRAIN: loss + train_op, control
dependencies included, + scalar/histogram summaries; EVAL: loss + host_call
tensors; PREDICT: predictions)
to the program inputs (features, labels) and the variables, folds what is
static (fold.py), matches every remaining op to a kernel (kernels.py) and
inserts the WSE precision casts. Runtime assertions and prints reached on the
way (tf.debugging.assert_*, tf.Assert, tf.print) are not kernels: their
conditions and shown tensors become program outputs the host checks and
prints after each step (checks.py, Program.assertions / .prints). Identity/NoOp/StopGradient and control edges
disappear; the kernel order (TF creation order, a topological order of data
and control edges) keeps what they implied. tf.cond/tf.case (If ops) are
if-converted: both branches run and a select picks the result; branches may
read variables (learning-rate schedules over global_step) and write them (a
loss-scale optimizer's guarded update): each write in a branch is guarded by
the branch's condition (Kernel.guard), so only the taken branch writes, and
each kernel that refuses bad input (a look-up's id or a sparse label out of
range: ir.CHECKS_INPUT) refuses it only under that condition
(Kernel.check_guard), as TF runs it only in the taken branch. Every
problem is collected and raised at once, each naming the op, its type and the
user's file:line.
"""
from __future__ import annotations

import functools
import hashlib
import json
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from cerebras_tf.amp.target import LOSS_SCALING_COLLECTION
from cerebras_tf import ir
from cerebras_tf.compiler import checks, fold, functions, kernels
from cerebras_tf.ir import passes
from cerebras_tf.tf_helper import BOUNDARY_CASTS
from cerebras_tf.errors import (CerebrasError, DynamicShapeError, UnsupportedOpError,
                                UnsupportedTensorFlowError, raise_problems)
from estimator import CapturedModel, ModeKeys
from estimator.source import is_user_file

ALIAS_OPS = frozenset({"Identity", "IdentityN", "StopGradient", "Snapshot", "PreventGradient", "EnsureShape"})
_GRADIENT_SCOPE = passes.GRADIENT_SCOPE
_IF_OPS = frozenset({"If", "StatelessIf"})
_WHILE_OPS = frozenset({"While", "StatelessWhile"})


class VarRef(str):
    """A resource handle: the variable's name."""


# ---- what the program needs ------------------------------------------------------------
class ProgramOutputs(NamedTuple):
    outputs: dict[str, tf.Tensor]  # by IR output name
    host_call: dict[str, Any] | None  # ir.host_call_structure's description
    summaries: dict[str, str]  # TRAIN: tag -> kind (see summary_kinds)
    roots: list[tf.Operation]  # extra root ops (the train_op)


def program_outputs(model: CapturedModel) -> ProgramOutputs:
    """What the program streams back for the model's mode, and the ops it must run.

    PREDICT: "predictions/<key>". TRAIN and EVAL: "loss", one "host_call/<path>"
    per tensor leaf of host_call's (nested) tensors (the rules checked its
    structure), in EVAL "eval_metric_input/<i>" for the tensors eval_metric_ops
    read (only an evaluation whose stack takes them, an appliance's or the
    weight-streaming stack's, gets that far with them: see
    eval_metric_inputs), and in TRAIN "summary/<tag>" for each scalar or
    histogram tf.compat.v1 summary made in model_fn (written by the host).
    """
    spec, mode = model.spec, model.input.mode
    outputs: dict[str, tf.Tensor] = {}
    roots: list[tf.Operation] = []
    if mode == ModeKeys.PREDICT:
        predictions = spec.predictions
        if isinstance(predictions, dict):
            outputs.update({f"predictions/{k}": v for k, v in predictions.items()})
        else:
            outputs["predictions/output"] = predictions
        return ProgramOutputs(outputs, None, {}, roots)
    outputs["loss"] = spec.loss
    host_call = getattr(spec, "host_call", None)
    structure = None
    if host_call is not None:
        structure, leaves, _ = ir.host_call_structure(host_call[1], lambda x: isinstance(x, tf.Tensor))
        outputs.update(leaves)
    if mode == ModeKeys.EVAL and spec.eval_metric_ops:  # the host runs the metric ops (see above)
        inputs = eval_metric_inputs(model.graph, spec.eval_metric_ops)
        outputs.update({f"{ir.EVAL_METRIC_INPUT_PREFIX}/{i}": tensor for i, tensor in enumerate(inputs)})
    kinds: dict[str, str] = {}
    if mode == ModeKeys.TRAIN:
        kinds, tensors = summary_kinds(model.graph)
        outputs.update({f"{ir.SUMMARY_PREFIX}/{tag}": tensor for tag, tensor in tensors.items()})
        if spec.train_op is not None:
            roots.append(spec.train_op if isinstance(spec.train_op, tf.Operation) else spec.train_op.op)
    return ProgramOutputs(outputs, structure, kinds, roots)


def eval_metric_inputs(graph: tf.Graph, eval_metric_ops: dict[str, Any]) -> list[tf.Tensor]:
    """The model's tensors that `eval_metric_ops` read, in a fixed order: what an EVAL program streams so the
    host can run the metric ops over it (see eval_metric_subgraph)."""
    return eval_metric_subgraph(graph, eval_metric_ops)[0]


def eval_metric_subgraph(graph: tf.Graph, eval_metric_ops: dict[str, Any]
                         ) -> tuple[list[tf.Tensor], set[tf.Operation]]:
    """(the tensors the metric ops read from the model, in a fixed order; the metric ops the value and update
    ops need).

    The metric side is every op that depends on a metric variable (tf.compat.v1.metrics' local state); the
    tensors the metric ops take from outside it (predictions, labels, weights: the model side) are the inputs.
    Constants they read come along with them. A metric value or update op that reads no metric variable is an
    input itself. Control dependencies on
    model-side ops (tf.compat.v1.metrics.mean waits for its values) are met by the inputs' being computed.
    """
    metric_ops = {v.op for v in graph.get_collection(tf.compat.v1.GraphKeys.METRIC_VARIABLES)}
    stack = list(metric_ops)
    while stack:  # every op that depends on a metric variable
        for out in stack.pop().outputs:
            for consumer in out.consumers():
                if consumer not in metric_ops:
                    metric_ops.add(consumer)
                    stack.append(consumer)
    roots = [item if isinstance(item, tf.Operation) else item.op
             for name in sorted(eval_metric_ops) for item in eval_metric_ops[name]]
    inputs: dict[str, tf.Tensor] = {}
    needed: set[tf.Operation] = set()
    stack = []
    for root in roots:
        if root in metric_ops:
            stack.append(root)
        else:
            inputs.update((out.name, out) for out in root.outputs)
    while stack:
        op = stack.pop()
        if op in needed:
            continue
        needed.add(op)
        for tensor in op.inputs:
            if tensor.op in metric_ops or tensor.op.type == "Const":  # constants come along, not streamed
                stack.append(tensor.op)
            else:
                inputs.setdefault(tensor.name, tensor)
        stack.extend(c for c in op.control_inputs if c in metric_ops)
    return [inputs[name] for name in sorted(inputs)], needed


# tf.compat.v1 summary ops (GraphKeys.SUMMARIES) -> kind; the host writes "scalar" and "histogram".
_SUMMARY_KINDS = {"ScalarSummary": "scalar", "HistogramSummary": "histogram", "ImageSummary": "image",
                  "AudioSummary": "audio", "AudioSummaryV2": "audio", "TensorSummary": "tensor",
                  "TensorSummaryV2": "tensor"}


def summary_kinds(graph: tf.Graph) -> tuple[dict[str, str], dict[str, tf.Tensor]]:
    """The graph's summaries: (tag -> kind, tag -> tensor summarised for the kinds the host writes).

    Tags are folded statically (a summary whose tag is not a static string is
    keyed by its op name, kind "dynamic tag"). tf.compat.v1.summary.text is
    kind "text"; TF2 tf.summary writes (collection _SUMMARY_V2) are kind "tf2",
    keyed by op name. MergeSummary ops are skipped (their inputs are listed).
    """
    kinds: dict[str, str] = {}
    tensors: dict[str, tf.Tensor] = {}
    for item in graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES):
        op = item if isinstance(item, tf.Operation) else getattr(item, "op", None)
        if op is None or op.type == "MergeSummary":
            continue
        kind = _SUMMARY_KINDS.get(op.type, op.type)
        raw_tag = _static_string(op.inputs[0]) if op.inputs else None
        if raw_tag is None:
            kinds.setdefault(op.name, "dynamic tag")
            continue
        tag = raw_tag.decode("utf-8", "replace")
        if kind == "tensor" and _plugin_name(op) == "text":
            kind = "text"
        if tag in kinds:
            continue  # TF's MergeSummary refuses duplicate tags; the first one is written
        kinds[tag] = kind
        if kind in ir.HOST_SUMMARY_KINDS:
            tensors[tag] = op.inputs[1]
    for item in graph.get_collection("_SUMMARY_V2"):  # GraphKeys._SUMMARY_COLLECTION
        kinds.setdefault(getattr(item, "name", str(item)), "tf2")
    return kinds, tensors


def _static_string(tensor: tf.Tensor) -> bytes | None:
    """A scalar string tensor's value when it is known statically."""
    value = tf.get_static_value(tensor)
    value = value.item() if isinstance(value, np.ndarray) and value.ndim == 0 else value
    return value if isinstance(value, bytes) else None


def _plugin_name(op: tf.Operation) -> str | None:
    metadata = _static_string(op.inputs[2]) if len(op.inputs) > 2 else None
    if metadata is None:
        return None
    return tf.compat.v1.SummaryMetadata.FromString(metadata).plugin_data.plugin_name


def needed_ops(roots: Sequence[tf.Operation], stop: set[str]) -> list[tf.Operation]:
    """Ops the roots depend on (data and control), in creation order, stopping at tensors in `stop`.

    Runtime assertions and prints (checks.is_check) are included, but of their
    inputs only what the host needs computed (checks.needed_inputs: not the
    strings of their messages).
    """
    seen: dict[str, tf.Operation] = {}
    stack = list(roots)
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen[op.name] = op
        inputs = checks.needed_inputs(op) if checks.is_check(op) else op.inputs
        stack.extend(t.op for t in inputs if t.name not in stop)
        stack.extend(op.control_inputs)
    return sorted(seen.values(), key=lambda op: op._id)


def graph_hash(model: CapturedModel, extra: str = "") -> str:
    """sha256 of everything the program depends on (not the input pipeline's data)."""
    outputs, host_call, summaries, roots = program_outputs(model)
    stop = _input_tensors(model)
    ops = needed_ops([t.op for t in outputs.values() if t.name not in stop] + roots, set(stop))
    described = json.dumps([host_call, summaries], sort_keys=True)
    digest = hashlib.sha256(f"{ir.IR_VERSION}|{model.input.mode}|{described}|{extra}".encode())
    digest.update(f"loss_scaling={json.dumps(loss_scaling(model.graph), sort_keys=True)};".encode())
    for name, tensor in sorted(outputs.items()):
        digest.update(f"{name}={tensor.name};".encode())
    for tensor, name in sorted(stop.items()):
        digest.update(f"{tensor}={name}:{model.graph.get_tensor_by_name(tensor).shape};".encode())
    digests: dict[str, str] = {}
    for op in ops:
        digest.update(_canonical_node(op.node_def, model.graph, digests))
        if checks.is_check(op):  # its message's strings, and the line its error names
            for message_op in checks.message_ops(op):
                digest.update(_canonical_node(message_op.node_def, model.graph, digests))
            digest.update(f"at={op_location(op)};".encode())
    return digest.hexdigest()


def loss_scaling(graph: tf.Graph) -> dict[str, Any] | None:
    """The settings amp.optimizer_step recorded while the model was captured for the CS system (or None)."""
    recorded = {text for text in graph.get_collection(LOSS_SCALING_COLLECTION)}
    if len(recorded) > 1:
        raise UnsupportedTensorFlowError(
            "model_fn called cerebras_tf.amp.optimizer_step with different loss-scaling settings "
            f"({len(recorded)} of them); the CS system runs one GradScaler.",
            fix="Call optimizer_step once, on the total loss, with one GradScaler.")
    return json.loads(recorded.pop()) if recorded else None


# tf.custom_gradient's attribute naming its gradient function, "CustomGradient-<a process-wide counter>".
_CUSTOM_GRADIENT_ATTR = "_gradient_op_type"


def _canonical_node(node_def: Any, graph: tf.Graph, digests: dict[str, str]) -> bytes:
    """A NodeDef's bytes with function names (If's branches, Case's list of them) replaced by digests of
    their bodies, and without the name of a tf.custom_gradient's gradient function: TF numbers both anew
    each time a model is built (the gradient's ops are hashed where the graph holds them)."""
    has_function = any(value.HasField("func") or (value.HasField("list") and value.list.func)
                       for value in node_def.attr.values())
    if not has_function and _CUSTOM_GRADIENT_ATTR not in node_def.attr:
        return node_def.SerializeToString(deterministic=True)
    node = type(node_def)()
    node.CopyFrom(node_def)
    node.attr.pop(_CUSTOM_GRADIENT_ATTR, None)
    for value in node.attr.values():
        if value.HasField("func"):
            value.func.name = _function_digest(value.func.name, graph, digests)
        elif value.HasField("list"):
            for func in value.list.func:
                func.name = _function_digest(func.name, graph, digests)
    return node.SerializeToString(deterministic=True)


def _function_digest(name: str, graph: tf.Graph, digests: dict[str, str]) -> str:
    if name not in digests:
        definition = functions.function_def(graph, name)
        if definition is None:  # not a function of the graph (TF refuses such a graph when it runs)
            digests[name] = name
            return name
        fdef = type(definition)()
        fdef.CopyFrom(definition)
        fdef.signature.name = ""
        digest = hashlib.sha256()
        for node in fdef.node_def:
            digest.update(_canonical_node(node, graph, digests))
        fdef.ClearField("node_def")
        digest.update(fdef.SerializeToString(deterministic=True))
        digests[name] = digest.hexdigest()
    return digests[name]


def _input_tensors(model: CapturedModel) -> dict[str, str]:
    """TF tensor name -> program input name: one per tensor of the features/labels nests (ir.input_leaves keys).

    Every leaf is a program input, read by the model or not: the batch the input workers send holds them all.
    """
    inputs = {}
    for name, value in (("features", model.features), ("labels", model.labels)):
        for key, leaf in ir.input_leaves(name, value).items():
            if isinstance(leaf, tf.Tensor):
                inputs[leaf.name] = key
    return inputs


# ---- lowering -----------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _is_user_file(filename: str) -> bool:
    return is_user_file(filename)


def op_location(op: tf.Operation) -> str | None:
    """estimator.source.op_location, searching from the innermost frame with a per-file cache (thousands of ops)."""
    try:
        frames = op.traceback
    except (AttributeError, ValueError):
        return None
    for frame in reversed(frames):
        if _is_user_file(frame[0]):
            return f"{frame[0]}:{frame[1]}"
    return None


class _Builder:
    """The IR under construction, shared by the main graph and if-converted branches."""

    def __init__(self, graph: tf.Graph, casts: bool) -> None:
        self.graph = graph
        self.casts = casts
        self.tensors: list[ir.Tensor] = []
        self.kernels: list[ir.Kernel] = []
        self.arrays: dict[int, np.ndarray] = {}
        self.variables: dict[str, tf.Operation] = {}
        self.problems: list[CerebrasError] = []
        self.folded_ops = 0
        self.aliases_removed = 0
        self.if_converted = 0
        self.checks = checks.Collected()
        self._half: dict[int, int] = {}
        self.boundary_casts = frozenset(graph.get_collection(BOUNDARY_CASTS))  # Identity ops rounded to half
        self._branches: dict[tuple[str, tuple[tuple[int, str], ...]], tf.Graph] = {}

    def tensor(self, shape: Sequence[int], dtype: str, name: str, const: ir.Const | None = None) -> int:
        tensor = ir.Tensor(len(self.tensors), [int(d) for d in shape], dtype, name, const)
        self.tensors.append(tensor)
        return tensor.id

    def constant(self, value: fold.Value, dtype: tf.DType, name: str) -> int:
        if isinstance(value, np.ndarray):
            value = fold.as_splat(value) or value
        if isinstance(value, fold.Splat):
            return self.tensor(value.shape, dtype.name, name, ir.Const(splat=value.value))
        value = np.asarray(value)
        if value.size == 1:
            return self.tensor(value.shape, dtype.name, name, ir.Const(splat=value.reshape(()).item()))
        tid = self.tensor(value.shape, dtype.name, name, ir.Const())
        self.arrays[tid] = value
        return tid

    def kernel(self, kind: str, inputs: list[int], outputs: list[int], attrs: dict[str, Any], *,
               role: str, vars_: list[str] | None = None, tf_op: tf.Operation | None = None,
               tf_name: str = "", location: str | None = None, guard: int | None = None,
               check_guard: int | None = None) -> ir.Kernel:
        shapes_in = [self.tensors[i].shape for i in inputs]
        shapes_out = [self.tensors[i].shape for i in outputs]
        kernel = ir.Kernel(
            id=len(self.kernels), kind=kind, inputs=inputs, outputs=outputs, attrs=attrs, role=role,
            vars=list(vars_ or []), tf_name=tf_name or (tf_op.name if tf_op is not None else ""),
            tf_type=tf_op.type if tf_op is not None else "", location=location,
            flops=kernels.estimate_flops(kind, ir.KINDS[kind], shapes_in, shapes_out, attrs), guard=guard,
            check_guard=check_guard)
        self.kernels.append(kernel)
        return kernel

    def to_half(self, source: int, role: str, tf_name: str, location: str | None) -> int:
        """The half-precision copy of a float32 tensor (one cast per tensor)."""
        if source not in self._half:
            src = self.tensors[source]
            out = self.tensor(src.shape, ir.HALF, f"{src.name}/to_half")
            self.kernel("to_half", [source], [out], {}, role=role, tf_name=f"{tf_name}/to_half",
                        location=location)
            self._half[source] = out
        return self._half[source]

    def branch_graph(self, name: str, variables: tuple[tuple[int, str], ...] = ()) -> tf.Graph:
        """The graph of function `name`; `variables` (argument index, variable name) are the resource
        arguments bound to variables, whose shapes TF's shape inference then knows inside the function."""
        key = (name, variables)
        if key not in self._branches:
            self._branches[key] = functions.function_graph(self.graph, name,
                                                           {i: self.variables[v] for i, v in variables})
        return self._branches[key]

    def function_def(self, name: str) -> Any:
        """Function `name` of the captured graph's library (None if it has none by that name)."""
        return functions.function_def(self.graph, name)


class _GraphLowerer:
    """Lowers the ops of one TF graph (the model's, or an if-converted branch) into the builder."""

    def __init__(self, builder: _Builder, ops: Sequence[tf.Operation], *, env: dict[str, Any],
                 known: dict[str, fold.Value] | None = None, prefix: str = "",
                 location: str | None = None, role: str | None = None,
                 guard: Callable[[], int] | None = None) -> None:
        self.b = builder
        self.ops = ops
        self.env = env  # tf tensor name -> IR tensor id or VarRef
        self.prefix = prefix  # for branch ops: the If op's name
        self.location = location  # for branch ops: the If op's location
        self.forced_role = role
        self.guard = guard  # in a tf.cond branch: makes (once) the scalar bool "this branch is taken"
        self.folder = fold.Folder(ops, known, functions=builder.function_def)
        self.poisoned: set[str] = set()
        self.failed: set[str] = set()
        self.after_gradients: set[str] = set()
        self.consts: dict[str, int] = {}

    # ---- operands ---------------------------------------------------------------
    def operand(self, tensor: tf.Tensor) -> Any:
        if tensor.name in self.env:
            return self.env[tensor.name]
        if self.folder.is_const(tensor):
            if tensor.name not in self.consts:
                self.consts[tensor.name] = self.b.constant(self.folder.value(tensor), tensor.dtype,
                                                           self._name(tensor))
            return self.consts[tensor.name]
        raise AssertionError(f"internal: {tensor.name} has no value")  # pragma: no cover

    def _where(self, op: tf.Operation) -> str | None:
        return self.location or op_location(op)

    def _name(self, op_or_tensor: tf.Operation | tf.Tensor) -> str:
        """The name in the IR: branch ops and tensors are prefixed with their If op's name."""
        return f"{self.prefix}/{op_or_tensor.name}" if self.prefix else op_or_tensor.name

    # ---- main loop --------------------------------------------------------------
    def run(self) -> None:
        boundary = [t for op in self.ops if not self._folded(op) for t in op.inputs if self.folder.is_const(t)]
        self.folder.evaluate(boundary)
        self.b.folded_ops += self.folder.folded_ops
        for op in self.ops:
            if any(t.name in self.poisoned for t in op.inputs):
                self.poisoned.update(t.name for t in op.outputs)
                continue
            try:
                self._lower(op)
            except CerebrasError as problem:
                if not isinstance(problem, _BranchFailed) and not self._gradient_of_failed(op):
                    # reported once: the forward op, not its gradient too, nor the If of a failed branch op
                    self.b.problems.append(problem)
                self.failed.add(op.name)
                self.poisoned.update(t.name for t in op.outputs)

    def _gradient_of_failed(self, op: tf.Operation) -> bool:
        match = _GRADIENT_SCOPE.search(op.name)
        if not match:
            return False
        rest = op.name[match.end():]
        return any(rest.startswith(name + "_grad/") for name in self.failed)

    def _folded(self, op: tf.Operation) -> bool:
        return bool(op.outputs) and all(self.folder.is_const(t) for t in op.outputs)

    def _role_of(self, op: tf.Operation) -> str:
        """forward / backward / optimizer (plus seeds and variable-write roles decided by the caller)."""
        if self.forced_role is not None:
            return self.forced_role
        name = op.name
        if _GRADIENT_SCOPE.search(name):
            self.after_gradients.add(name)
            return "backward"
        if any(t.op.name in self.after_gradients for t in op.inputs) or \
                any(c.name in self.after_gradients for c in op.control_inputs):
            self.after_gradients.add(name)
            return "optimizer"
        return "forward"

    def _lower(self, op: tf.Operation) -> None:
        role = self._role_of(op)
        if op.outputs and all(t.name in self.env for t in op.outputs):
            return  # bound by the caller (program inputs, branch arguments)
        if fold.is_gradient_seed(op) and self.forced_role is None:
            shape = fold.static_shape(op.outputs[0])
            assert shape is not None, "a gradient seed is shaped like the loss, a static shape"
            out = self.b.tensor(shape, op.outputs[0].dtype.name, op.outputs[0].name)
            self.b.kernel("gradient_seed", [], [out], {"value": 1.0}, role="gradient_seed", tf_op=op,
                          location=self._where(op))
            self.env[op.outputs[0].name] = out
            return
        if checks.is_check(op):
            self._lower_check(op, role)
            return
        if self._folded(op) or op.type == "NoOp":
            return
        if op.type in ALIAS_OPS:
            for source, out in zip(op.inputs, op.outputs):
                self.env[out.name] = self.operand(source)
            value = self.env[op.outputs[0].name] if op.outputs else None
            if op.name in self.b.boundary_casts and self.b.casts and isinstance(value, int) \
                    and self.b.tensors[value].dtype == "float32":  # tf_helper.boundary_cast: rounded to half
                self.env[op.outputs[0].name] = self.b.to_half(value, role, self._name(op), self._where(op))
            else:
                self.b.aliases_removed += 1
            return
        if op.type == "VarHandleOp":
            self.b.variables.setdefault(op.name, op)
            self.env[op.outputs[0].name] = VarRef(op.name)
            return
        if op.type in _IF_OPS:
            self._lower_if(op, role)
            return
        self._lower_kernel(op, role)

    def _lower_kernel(self, op: tf.Operation, role: str) -> None:
        definition = kernels.LIBRARY.get(op.type)
        where = self._where(op)
        if definition is None or any(t.dtype == tf.string for t in op.outputs):
            raise UnsupportedOpError(
                f"Op type {op.type!r} (op {self._name(op)!r}) has no kernel on the CS system.",
                where=where or "unknown (created outside user code)", fix=kernels.unsupported_hint(op))
        attrs: dict[str, Any] = {}
        for tf_attr, ir_attr in definition.attrs.items():
            try:
                attrs[ir_attr] = kernels.json_attr(op.get_attr(tf_attr))
            except ValueError:
                pass
        static = {(i if i >= 0 else len(op.inputs) + i): name for i, name in definition.static.items()}
        inputs: list[int] = []
        vars_: list[str] = []
        for index, tensor in enumerate(op.inputs):
            if index in static:
                attrs[static[index]] = self._static_value(op, tensor, static[index])
                continue
            value = self.operand(tensor)
            if isinstance(value, VarRef):
                vars_.append(str(value))
            else:
                inputs.append(value)
        outputs = [self._output_tensor(op, index, attrs) for index in range(len(op.outputs))]
        if definition.kind == "select":
            attrs["broadcast"] = "v1" if op.type == "Select" else "numpy"
        if definition.kind == "reshape":
            attrs["shape"] = list(self.b.tensors[outputs[0]].shape)  # -1 resolved
        guard = check_guard = None
        if definition.kind in ir.WRITES:
            role = self._write_role(vars_, role)
            guard = self.guard() if self.guard is not None else None
        elif definition.kind in ir.CHECKS_INPUT and self.guard is not None:
            check_guard = self.guard()
        if definition.compute:
            attrs["accumulate"] = "float32"
            if self.b.casts:
                inputs = [self.b.to_half(t, role, self._name(op), where) if self.b.tensors[t].dtype == "float32"
                          else t for t in inputs]
        self.b.kernel(definition.kind, inputs, outputs, attrs, role=role, vars_=vars_, tf_op=op,
                      tf_name=self._name(op), location=where, guard=guard, check_guard=check_guard)
        for out, tid in zip(op.outputs, outputs):
            self.env[out.name] = tid

    def _write_role(self, vars_: list[str], role: str) -> str:
        global_step = self.b.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_STEP)
        if global_step and vars_ and vars_[0] == global_step[0].op.name:
            return "global_step_update"
        return role if role in ("optimizer", "backward") else "state_update"

    def _static_value(self, op: tf.Operation, tensor: tf.Tensor, attr: str) -> Any:
        if not self.folder.is_const(tensor):
            raise DynamicShapeError(
                f"Op {self._name(op)!r} ({op.type}) needs its {attr!r} input at compile time, but it depends on "
                "data or variables.", where=self._where(op),
                fix="Compute it from static shapes and Python values (tensor.shape, not tf.shape), so the CS "
                "system knows it when compiling.")
        value = self.folder.value(tensor)
        if isinstance(value, fold.Splat):
            value = value.materialise()
        return kernels.json_attr(np.asarray(value))

    def _output_tensor(self, op: tf.Operation, index: int, attrs: dict[str, Any]) -> int:
        out = op.outputs[index]
        shape = fold.static_shape(out)
        if shape is None:
            shape = kernels.OUTPUT_SHAPES.get(op.type, {}).get(index) or _shape_from_attrs(op, attrs)
        if shape is None:
            dims = out.shape.as_list() if out.shape.rank is not None else None
            dynamic = ("unknown rank" if dims is None else
                       "dimension(s) " + ", ".join(str(i) for i, d in enumerate(dims) if d is None))
            raise DynamicShapeError(
                f"Op {self._name(op)!r} ({op.type}) produces {out.name} with shape "
                f"{'<unknown>' if dims is None else [d if d is not None else '?' for d in dims]}: "
                f"{dynamic} not known at compile time.", where=self._where(op),
                fix=kernels.unsupported_hint(op) if op.type in kernels.DATA_DEPENDENT
                else "Every tensor on the CS system needs a static shape: use a fixed batch size "
                "(drop_remainder=True) and static shapes in model_fn.")
        return self.b.tensor(shape, out.dtype.name, self._name(out))

    # ---- runtime assertions and prints -----------------------------------------------
    def _lower_check(self, op: tf.Operation, role: str) -> None:
        """An assertion or print (checks.py): its condition and the tensors it shows become program outputs
        the host reads after each step. In a tf.cond branch an assertion holds, and a print prints, only
        when the branch is taken."""
        where, name = self._where(op), self._name(op)
        described = checks.describe(op, self.b.branch_graph, name, where)
        for out_name, tensor in described.aliases.items():
            self.env[out_name] = self.operand(tensor)
        shown = ("Assert" if described.kind == "assert" else op.type, described.entry["name"])  # named in errors
        items = [self._check_item(shown, item, role, where) for item in described.items]
        if described.condition is not None:
            condition = self.operand(described.condition)
            if self.guard is not None:
                condition = self._unless_untaken(condition, self.guard(), name, role, where)
            self.b.checks.add_assertion(name, described, where, condition, items)
            return
        after = checks.assertions_among_ancestors(op, lambda o: self.b.checks.assertion_index.get(self._name(o)))
        self.b.checks.add_print(described, where, items, self.guard() if self.guard is not None else None, after)

    def _check_item(self, shown: tuple[str, str], item: checks.Item, role: str, where: str | None) -> checks.Lowered:
        """A message item: text, a constant (strings must be), or (tensor id, dtype) streamed each step.
        `shown`: the check's op type and name, for errors."""
        op_type, name = shown
        if isinstance(item, str):
            return item
        if isinstance(item, np.ndarray):
            return checks.constant_value(item)
        if isinstance(item, checks.VariableRead):
            return self._read_for_check(shown, item.handle, role, where)
        if item.dtype == tf.string:
            value = tf.get_static_value(item)
            if value is None:
                raise checks.refuse_runtime_string(op_type, name, item, where)
            return checks.constant_value(value)
        if self.folder.is_const(item):
            value = self.folder.value(item)
            return checks.constant_value(value.materialise() if isinstance(value, fold.Splat) else value)
        operand = self.operand(item)
        if isinstance(operand, VarRef):
            raise UnsupportedOpError(f"Op type {op_type!r} (op {name!r}) shows the variable handle {item.name}.",
                                     where=where, fix="Show the variable's value (tf.identity(variable)).")
        return (operand, item.dtype.name)

    def _read_for_check(self, shown: tuple[str, str], handle: tf.Tensor, role: str,
                        where: str | None) -> checks.Lowered:
        """The value of a variable an assertion shows (tf.Assert reads it inside its guard), read where it runs."""
        variable = self.operand(handle)
        if not isinstance(variable, VarRef):
            raise UnsupportedOpError(f"Op type {shown[0]!r} (op {shown[1]!r}) reads a variable the CS system cannot "
                                     f"resolve ({handle.name}).", where=where,
                                     fix="Pass the variable's value (tf.identity(variable)) to the assertion.")
        handle_op = self.b.variables[str(variable)]
        dtype = tf.as_dtype(handle_op.get_attr("dtype"))
        out = self.b.tensor(tf.TensorShape(handle_op.get_attr("shape")).as_list(), dtype.name,
                            f"{shown[1]}/read_{variable}")
        self.b.kernel("read_variable", [], [out], {}, role=role, vars_=[str(variable)],
                      tf_name=self.b.tensors[out].name, location=where)
        return (out, dtype.name)

    def _unless_untaken(self, condition: int, guard: int, name: str, role: str, where: str | None) -> int:
        """condition OR NOT guard: an assertion in an untaken tf.cond branch holds (TF does not run it)."""
        untaken = self.b.tensor([], "bool", f"{name}/branch_not_taken")
        self.b.kernel("logical_not", [guard], [untaken], {}, role=role, tf_name=self.b.tensors[untaken].name,
                      location=where)
        holds = self.b.tensor([], "bool", f"{name}/holds")
        self.b.kernel("logical_or", [untaken, condition], [holds], {}, role=role, tf_name=self.b.tensors[holds].name,
                      location=where)
        return holds

    # ---- if-conversion ------------------------------------------------------------
    def _lower_if(self, op: tf.Operation, role: str) -> None:
        """Both branches run and a select picks each output; each branch's variable writes, input checks,
        assertions and prints are guarded by its condition (combined with the enclosing branch's), so only
        the taken branch writes, refuses bad ids, asserts or prints."""
        pred, args = op.inputs[0], list(op.inputs[1:])
        branches = [op.get_attr("then_branch").name, op.get_attr("else_branch").name]
        if self.folder.is_const(pred):
            value = self.folder.value(pred)
            taken = value.value if isinstance(value, fold.Splat) else np.asarray(value).item()
            chosen = branches[0] if taken else branches[1]
            for out, value in zip(op.outputs, self._lower_branch(op, chosen, args, role, self.guard)):
                self.env[out.name] = value
            return
        condition = self.operand(pred)
        guards = [self._branch_guard(op, condition, negate, role) for negate in (False, True)]
        results = [self._lower_branch(op, name, args, role, guard) for name, guard in zip(branches, guards)]
        for index, (then_value, else_value) in enumerate(zip(*results)):
            out = self._output_tensor(op, index, {})
            self.b.kernel("select", [condition, then_value, else_value], [out], {"broadcast": "numpy"},
                          role=role, tf_op=op, tf_name=self._name(op), location=self._where(op))
            self.env[op.outputs[index].name] = out
        self.b.if_converted += 1

    def _branch_guard(self, op: tf.Operation, condition: int, negate: bool, role: str) -> Callable[[], int]:
        """A maker of the scalar bool "this branch is taken": the condition (negated for the else branch),
        and-ed with the enclosing guard. Made on first use (a write, an input check, an assertion or a print),
        so other branches add nothing; these kernels are pure and run every step."""
        outer = self.guard

        @functools.lru_cache(maxsize=None)
        def make() -> int:
            where, name = self._where(op), self._name(op)
            tensor = self.b.tensors[condition]
            if tensor.shape:
                raise UnsupportedOpError(
                    f"Op type {op.type!r} (op {name!r}): a tf.cond whose branches write variables, look ids up, "
                    f"assert or print needs a scalar condition, this one has shape {tensor.shape}.", where=where,
                    fix="Reduce the condition to one bool (tf.reduce_all / tf.reduce_any).")
            guard = condition
            if tensor.dtype != "bool":  # If: a non-zero number is true
                guard = self.b.tensor([], "bool", f"{name}/guard_pred")
                self.b.kernel("cast", [condition], [guard], {"to": "bool"}, role=role, tf_name=f"{name}/guard_pred",
                              location=where)
            if negate:
                negated = self.b.tensor([], "bool", f"{name}/else_guard")
                self.b.kernel("logical_not", [guard], [negated], {}, role=role, tf_name=f"{name}/else_guard",
                              location=where)
                guard = negated
            if outer is not None:
                both = self.b.tensor([], "bool", f"{name}/{'else' if negate else 'then'}_guard_nested")
                self.b.kernel("logical_and", [outer(), guard], [both], {}, role=role, tf_name=self.b.tensors[both].name,
                              location=where)
                guard = both
            return guard

        return make

    def _lower_branch(self, op: tf.Operation, function: str, args: list[tf.Tensor], role: str,
                      guard: Callable[[], int] | None) -> list[int]:
        """Lower one branch function: its outputs and the ops reachable from its control outputs (the
        writes of a branch that returns nothing); `guard` makes the bool that says it is taken."""
        values = [None if self.folder.is_const(arg) else self.operand(arg) for arg in args]
        graph = self.b.branch_graph(function, tuple((i, str(v)) for i, v in enumerate(values)
                                                    if isinstance(v, VarRef)))
        env: dict[str, Any] = {}
        known: dict[str, fold.Value] = {}
        for placeholder, arg, value in zip(graph.inputs, args, values):
            if value is None:
                known[placeholder.name] = self.folder.value(arg)
            else:
                env[placeholder.name] = value
        ops = needed_ops([t.op for t in graph.outputs] + list(graph.control_outputs), set())
        loop = next((inner for inner in ops if inner.type in _WHILE_OPS), None)
        if loop is not None:  # named as such, not by the first of its gradient accumulators (TensorList ops)
            raise UnsupportedOpError(
                f"Op type {loop.type!r} (op {self._name(op) + '/' + loop.name!r}): a tf.while_loop inside a branch of "
                f"a tf.cond/tf.case cannot be compiled.", where=self._where(op), fix=kernels.unsupported_hint(loop))
        inner = _GraphLowerer(self.b, ops, env=env, known=known, prefix=self._name(op),
                              location=self._where(op), role=role, guard=guard)
        inner.run()
        if inner.failed:  # reported; the If's outputs are poisoned
            raise _BranchFailed(f"a branch of {self._name(op)!r} failed")
        return [inner.operand(t) for t in graph.outputs]


class _BranchFailed(CerebrasError):
    """A branch op failed (its problem is already reported): the If op fails without a report of its own."""


def _shape_from_attrs(op: tf.Operation, attrs: dict[str, Any]) -> list[int] | None:
    """Output shapes TF inference left unknown but the static attrs fix."""
    if op.type == "Reshape" and "shape" in attrs:
        shape = [int(d) for d in np.atleast_1d(attrs["shape"])]
        known = fold.static_shape(op.inputs[0])
        if -1 in shape and known is not None:
            rest = int(np.prod([d for d in shape if d != -1], dtype=np.int64)) or 1
            shape[shape.index(-1)] = int(np.prod(known, dtype=np.int64)) // rest
        return shape if -1 not in shape else None
    if op.type in ("BroadcastTo", "Fill") and "shape" in attrs:
        return [int(d) for d in np.atleast_1d(attrs["shape"])]
    return None


# ---- the program ----------------------------------------------------------------------------
def lower(model: CapturedModel, *, casts: bool = True) -> tuple[ir.Program, dict[str, int]]:
    """The IR program for the captured model, and statistics for the report.

    Raises the compile problems found (each naming op, type and user file:line).
    """
    graph = model.graph
    outputs, host_call, summaries, roots = program_outputs(model)
    inputs = _input_tensors(model)
    ops = needed_ops([t.op for t in outputs.values() if t.name not in inputs] + roots, set(inputs))
    _refuse_tf1_control_flow(ops)
    builder = _Builder(graph, casts)
    env: dict[str, Any] = {}
    program_inputs: dict[str, int] = {}
    for tensor_name, input_name in inputs.items():
        tensor = graph.get_tensor_by_name(tensor_name)
        shape = fold.static_shape(tensor)
        if shape is None:
            builder.problems.append(DynamicShapeError(
                f"The {input_name} tensor has shape {tensor.shape}, not fully static.",
                fix="Batch with drop_remainder=True and give every feature a fixed shape."))
            continue
        env[tensor_name] = program_inputs[input_name] = builder.tensor(shape, tensor.dtype.name, input_name)
    if builder.problems:
        raise_problems(builder.problems)

    lowerer = _GraphLowerer(builder, ops, env=env)
    lowerer.run()
    raise_problems(_dedupe(builder.problems))

    program_outs = {name: lowerer.operand(tensor) for name, tensor in outputs.items()}
    program_outs.update(builder.checks.outputs)
    alive = passes.prune_dead_kernels(builder.kernels, set(program_outs.values()))
    dead_kernels = len(builder.kernels) - len(alive)
    builder.kernels[:] = alive
    seeds = [k.id for k in alive if k.kind == "gradient_seed"]
    program = ir.Program(
        mode=model.input.mode, tensors=builder.tensors, kernels=alive,
        variables=_variables(builder, model), inputs=program_inputs, outputs=program_outs,
        host_call=host_call, summaries=summaries,
        assertions=builder.checks.assertions, prints=builder.checks.prints,
        gradient_seed=seeds[0] if seeds else None,
        global_step=model.input.global_step.op.name if model.input.global_step is not None else None,
        precision_casts=casts, loss_scaling=loss_scaling(graph), arrays=builder.arrays)
    program.model_loss_scaling = passes.guards_trainable_writes(program)
    program.gradients = passes.gradient_tensors(program)
    program.layers = passes.layers(program)
    stats = {"tf_ops": len(ops), "folded_ops": builder.folded_ops, "aliases_removed": builder.aliases_removed,
             "assertions": len(program.assertions), "prints": len(program.prints),
             "if_converted": builder.if_converted, "dead_kernels": dead_kernels,
             "precision_casts": sum(1 for k in alive if k.kind == "to_half")}
    return program, stats


def _refuse_tf1_control_flow(ops: Sequence[tf.Operation]) -> None:
    """Raise for the first TF1 control-flow op (Switch, Merge, ...): lowered in creation order, a branch's op
    would come before the Switch that feeds it."""
    op = next((op for op in ops if op.type in kernels.TF1_CONTROL_FLOW), None)
    if op is not None:
        raise UnsupportedOpError(f"Op type {op.type!r} (op {op.name!r}) has no kernel on the CS system.",
                                 where=op_location(op) or "unknown (created outside user code)",
                                 fix=kernels.unsupported_hint(op))


def _dedupe(problems: list[CerebrasError]) -> list[CerebrasError]:
    seen, unique = set(), []
    for problem in problems:
        key = (type(problem), problem.message.split("(op ")[0], problem.where)
        if key not in seen:
            seen.add(key)
            unique.append(problem)
    return unique


def _variables(builder: _Builder, model: CapturedModel) -> list[ir.Variable]:
    graph = model.graph
    trainable = {v.op.name for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
    global_step = model.input.global_step.op.name if model.input.global_step is not None else None
    writers: dict[str, set[str]] = {}
    fused_slots: dict[str, str] = {}  # fused optimizer kernels: vars = [variable, *its slots]
    for kernel in builder.kernels:
        if kernel.kind in ir.WRITES:
            for name in kernel.vars:
                writers.setdefault(name, set()).add(kernel.role)
            if kernel.role == "optimizer" and kernel.kind.startswith(("apply_", "sparse_apply_")):
                fused_slots.update({slot: kernel.vars[0] for slot in kernel.vars[1:]})
    variables = []
    for name, op in builder.variables.items():
        shape = tf.TensorShape(op.get_attr("shape"))
        if not shape.is_fully_defined():
            builder.problems.append(DynamicShapeError(
                f"Variable {name!r} has shape {shape}, not fully static.", where=op_location(op),
                fix="Give variables fixed shapes."))
            continue
        if name == global_step:
            role = "global_step"
        elif name in trainable:
            role = "trainable"
        elif "optimizer" in writers.get(name, ()):
            role = "optimizer_state"
        else:
            role = "state"
        slot_of = None
        if role == "optimizer_state":
            owners = [t for t in trainable if name.startswith(t + "/") or f"/{t}/" in name]
            # the longest owner; among equally long ones the last by name, not by the set's (hash) order
            slot_of = fused_slots.get(name) or (max(owners, key=lambda t: (len(t), t)) if owners else None)
        variables.append(ir.Variable(name, shape.as_list(), tf.as_dtype(op.get_attr("dtype")).name,
                                     name in trainable, role, slot_of))
    raise_problems(builder.problems)
    return variables
