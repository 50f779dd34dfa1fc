"""Runtime assertions and prints in a model's graph: which tensors the wafer computes for them, what the host shows.

TF runs tf.debugging.assert_* / tf.compat.v1.assert_* / tf.Assert (an Assert
op, inside an If named "...AssertGuard" whose else branch holds it unless all
its data are strings or int32), tf.print (PrintV2 fed by a StringFormat) and
tf.compat.v1.Print as ops of the graph, whenever a fetched op depends on them.
Nothing on the wafer raises or prints, so the compiler makes each one program
outputs (its condition, the tensors its message shows) and a JSON entry
(Program.assertions / Program.prints: the static strings and constants, the
op's attrs, its name and the user's file:line); after each step the host
checks and prints them (cerebras_tf.run.host_checks), as TF would have. A string
computed at run time cannot be streamed off the wafer: such a check is refused
here, naming the op.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Union

import numpy as np
import tensorflow as tf

from cerebras_tf import ir
from cerebras_tf.errors import UnsupportedOpError

_IF_TYPES = frozenset({"If", "StatelessIf"})
_STRING_FIX = ("Give tf.Assert / tf.debugging.assert_* / tf.print the numeric tensors themselves and Python "
               "strings (the host formats them as TF does; tf.print(tf.strings.format(...)) works too), not a "
               "string tensor computed from data (tf.as_string, tf.strings.join, ...).")


@dataclasses.dataclass(frozen=True)
class VariableRead:
    """A variable tf.Assert reads inside its guard (a variable passed as data): the guard's argument, its handle."""

    handle: tf.Tensor


# A check's message item: text (prints only), a constant known at compile time, a tensor of the graph, or a
# variable's value.
Item = Union[str, np.ndarray, tf.Tensor, VariableRead]


def is_assert_guard(op: tf.Operation) -> bool:
    """The If that tf.Assert builds around its Assert op (named "AssertGuard" in the assertion's name scope)."""
    return op.type in _IF_TYPES and op.name.rsplit("/", 1)[-1].startswith("AssertGuard")


def is_check(op: tf.Operation) -> bool:
    """An assertion or print op the host runs (see the module docstring)."""
    return op.type in ("Assert", "PrintV2", "Print") or is_assert_guard(op)


def needed_inputs(op: tf.Operation) -> list[tf.Tensor]:
    """The tensors the wafer must compute for check `op`: its condition and the non-string tensors it shows
    (strings are read at compile time; a print's StringFormat is formatted by the host, not lowered)."""
    if op.type == "PrintV2":
        source = op.inputs[0].op
        tensors = list(source.inputs) if source.type == "StringFormat" else []
    else:
        tensors = list(op.inputs)
    return [t for index, t in enumerate(tensors) if t.dtype != tf.string or (op.type == "Print" and index == 0)]


def message_ops(op: tf.Operation) -> list[tf.Operation]:
    """The ops check `op` reads at compile time rather than lowering (its StringFormat, the producers of its
    strings): part of the program's identity (the graph hash), though no kernel computes them."""
    source = [op.inputs[0].op] if op.type == "PrintV2" and op.inputs[0].op.type == "StringFormat" else []
    tensors = list(source[0].inputs) if source else list(op.inputs)
    return source + [t.op for t in tensors if t.dtype == tf.string]


@dataclasses.dataclass
class Described:
    """One check as the graph states it, before its tensors are lowered."""

    kind: str  # "assert" or "print"
    entry: dict[str, Any]  # the Program entry's attrs: name, summarize, style, output_stream, end, first_n
    condition: tf.Tensor | None  # assertions: the scalar bool that must hold
    items: list[Item]  # assertions: the data; prints: the pieces
    aliases: dict[str, tf.Tensor]  # output tensor name -> the tensor it equals (the check itself computes nothing)


def describe(op: tf.Operation, function_graph: Callable[[str], tf.Graph], name: str, where: str | None) -> Described:
    """What check `op` (is_check) tests and shows; `function_graph(name)` is the graph of a function of the
    model's graph, `name` the op's name in the program. Raises UnsupportedOpError for what the host cannot do."""
    if is_assert_guard(op):
        return _assert_guard(op, function_graph, name, where)
    if op.type == "Assert":
        return Described("assert", {"name": name, "summarize": op.get_attr("summarize")}, op.inputs[0],
                         list(op.inputs[1:]), {})
    if op.type == "Print":
        items: list[Item] = [_text(op.get_attr("message"))]
        for tensor in op.inputs[1:]:
            items += ["[", tensor, "]"]
        entry = {"name": name, "style": "v1", "summarize": op.get_attr("summarize"), "output_stream": "stderr",
                 "end": "\n", "first_n": op.get_attr("first_n")}
        return Described("print", entry, None, items, {op.outputs[0].name: op.inputs[0]})
    return _print_v2(op, name, where)


def _assert_guard(op: tf.Operation, function_graph: Callable[[str], tf.Graph], name: str,
                  where: str | None) -> Described:
    """tf.Assert's cond(condition, no_op, assert): the condition is the If's predicate, the data are the else
    branch's Assert inputs (the If's arguments, or constants inside the branch)."""
    branch = function_graph(op.get_attr("else_branch").name)
    asserts = [inner for inner in branch.get_operations() if inner.type == "Assert"]
    if len(asserts) != 1:
        raise UnsupportedOpError(
            f"Op type {op.type!r} (op {name!r}) is named like tf.Assert's guard but its else branch holds "
            f"{len(asserts)} Assert ops, not one, so the CS system cannot tell what it checks.", where=where,
            fix="Use tf.debugging.assert_* or tf.Assert directly, and do not name a tf.cond 'AssertGuard'.")
    inner = asserts[0]
    arguments = {placeholder.name: outer for placeholder, outer in zip(branch.inputs, op.inputs[1:])}
    items: list[Item] = []
    for index, tensor in enumerate(inner.inputs[1:]):
        if tensor.name in arguments:
            items.append(arguments[tensor.name])
            continue
        if tensor.op.type == "ReadVariableOp" and tensor.op.inputs[0].name in arguments:
            items.append(VariableRead(arguments[tensor.op.inputs[0].name]))
            continue
        value = tf.get_static_value(tensor)
        if value is None:
            raise UnsupportedOpError(
                f"Op type 'Assert' (op {name + '/' + inner.name!r}): its data {index} is computed inside "
                f"tf.Assert's guard (by op type {tensor.op.type!r}), which the CS system cannot stream to the host.",
                where=where, fix=_STRING_FIX)
        items.append(np.asarray(value))
    entry = {"name": f"{name}/{inner.name}", "summarize": inner.get_attr("summarize")}
    # the guard's output is its predicate (both branches return it); assert_* return an Identity of it
    return Described("assert", entry, op.inputs[0], items, {out.name: op.inputs[0] for out in op.outputs})


def _print_v2(op: tf.Operation, name: str, where: str | None) -> Described:
    """tf.print: PrintV2 of a StringFormat (template, placeholder, summarize), or of a static string."""
    entry = {"name": name, "style": "v2", "summarize": 3, "output_stream": _text(op.get_attr("output_stream")),
             "end": _text(op.get_attr("end")), "first_n": -1}
    source = op.inputs[0]
    if source.op.type == "StringFormat":
        entry["summarize"] = source.op.get_attr("summarize")
        texts = _text(source.op.get_attr("template")).split(_text(source.op.get_attr("placeholder")))
        items: list[Item] = [texts[0]]
        for tensor, text in zip(source.op.inputs, texts[1:]):
            items += [tensor, text]
        return Described("print", entry, None, [item for item in items if not isinstance(item, str) or item], {})
    value = tf.get_static_value(source)
    if value is None:
        raise UnsupportedOpError(
            f"Op type 'PrintV2' (op {name!r}) prints a string computed at run time ({source.name}, an output of "
            f"op type {source.op.type!r}), which the CS system cannot stream to the host.", where=where,
            fix=_STRING_FIX)
    return Described("print", entry, None, [_text(np.asarray(value).item())], {})


def refuse_runtime_string(op_type: str, name: str, tensor: tf.Tensor, where: str | None) -> UnsupportedOpError:
    """The error for a string tensor a check shows that is not known at compile time."""
    return UnsupportedOpError(
        f"Op type {op_type!r} (op {name!r}) shows a string computed at run time ({tensor.name}, an output of "
        f"op type {tensor.op.type!r}), which the CS system cannot stream to the host.", where=where, fix=_STRING_FIX)


def constant_value(value: np.ndarray) -> dict[str, Any]:
    """A constant item as a Program entry value (JSON: strings as str, with surrogate escapes for non-UTF-8)."""
    value = np.asarray(value)
    if value.dtype.kind in "SUO":
        data = np.vectorize(_text, otypes=[object])(value).tolist() if value.size else value.tolist()
        return {"constant": data, "dtype": "string", "shape": list(value.shape)}
    return {"constant": value.tolist(), "dtype": value.dtype.name, "shape": list(value.shape)}


def assertions_among_ancestors(op: tf.Operation, index_of: Callable[[tf.Operation], int | None]) -> list[int]:
    """The indices of the assertions `op` depends on through data or control edges (`index_of`: an op's
    assertion index, or None)."""
    found: set[int] = set()
    seen: set[str] = set()
    stack = [t.op for t in op.inputs] + list(op.control_inputs)
    while stack:
        current = stack.pop()
        if current.name in seen:
            continue
        seen.add(current.name)
        index = index_of(current)
        if index is not None:
            found.add(index)
        stack.extend(t.op for t in current.inputs)
        stack.extend(current.control_inputs)
    return sorted(found)


def _text(value: Any) -> str:
    """An attr or string element as text; bytes that are not UTF-8 are kept as surrogate escapes."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


# A lowered message item: text, a constant (constant_value's entry), or (tensor id, dtype) streamed each step.
Streamed = tuple[int, str]  # (tensor id, TF dtype name)
Lowered = Union[str, dict[str, Any], Streamed]


class Collected:
    """The program's assertions and prints as they are lowered (Program.assertions / .prints), and the outputs
    ("assert/<n>/...", "print/<n>/...") they read."""

    def __init__(self) -> None:
        self.assertions: list[dict[str, Any]] = []
        self.prints: list[dict[str, Any]] = []
        self.outputs: dict[str, int] = {}
        self.assertion_index: dict[str, int] = {}  # the assertion op's name in the program -> its index

    def add_assertion(self, op_name: str, described: Described, where: str | None, condition: int,
                      data: list[Lowered]) -> None:
        index = len(self.assertions)
        key = ir.check_key(ir.ASSERT_PREFIX, index, "condition")
        self.outputs[key] = condition
        values = [self._value(item, ir.check_key(ir.ASSERT_PREFIX, index, "data", j)) for j, item in enumerate(data)]
        self.assertions.append({**described.entry, "location": where, "condition": key, "data": values})
        self.assertion_index[op_name] = index

    def add_print(self, described: Described, where: str | None, pieces: list[Lowered], when: int | None,
                  after: list[int]) -> None:
        index = len(self.prints)
        entries = [{"text": item} if isinstance(item, str)
                   else self._value(item, ir.check_key(ir.PRINT_PREFIX, index, "data", j))
                   for j, item in enumerate(pieces)]
        when_key = None
        if when is not None:
            when_key = ir.check_key(ir.PRINT_PREFIX, index, "when")
            self.outputs[when_key] = when
        self.prints.append({**described.entry, "location": where, "pieces": entries, "when": when_key,
                            "after": after})

    def _value(self, item: Lowered, key: str) -> dict[str, Any]:
        if isinstance(item, dict):
            return item
        assert isinstance(item, tuple), "text is only a print's piece"
        tensor_id, dtype = item
        self.outputs[key] = tensor_id
        return {"output": key, "dtype": dtype}
