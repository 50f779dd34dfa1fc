"""How a program's inputs and outputs are keyed: batch leaves ("features/<key>"), host_call's arguments,
and the values runtime assertions and prints show ("assert/<n>/...", "print/<n>/...").

Pure walks of Python structures: the compiler calls them on TF tensors, the
executor and the host on numpy arrays, so both sides agree on the keys.
"""
from __future__ import annotations

from typing import Any, Mapping

HOST_CALL_PREFIX = "host_call"
# The tensors an EVAL program's eval_metric_ops read from the model (an appliance's or the weight-streaming
# stack's evaluation: the host runs the metric ops over them): "eval_metric_input/<i>".
EVAL_METRIC_INPUT_PREFIX = "eval_metric_input"
SUMMARY_PREFIX = "summary"
# The summary kinds computed on the wafer as outputs "summary/<tag>" and written by the host.
HOST_SUMMARY_KINDS = ("scalar", "histogram")
# Runtime assertions and prints (Program.assertions / Program.prints, entry n): the wafer computes
# "assert/<n>/condition" (a scalar bool), "assert/<n>/data/<j>" and "print/<n>/data/<j>" (the tensors their
# messages show: j is the position in the entry's "data" / "pieces") and "print/<n>/when" (a print inside a
# tf.cond branch: was the branch taken); the host checks and prints them after each step.
ASSERT_PREFIX = "assert"
PRINT_PREFIX = "print"
# Where a print writes (PrintV2's output_stream; or "file://<path>", appended to).
PRINT_STREAMS = ("stderr", "stdout", "log(info)", "log(warning)", "log(error)")
FILE_STREAM_PREFIX = "file://"


def check_key(prefix: str, index: int, *part: str | int) -> str:
    """The output key of a part of assertion or print `index`: check_key("assert", 0, "data", 2) is
    "assert/0/data/2"."""
    return "/".join([prefix, str(index), *(str(p) for p in part)])


def input_leaves(name: str, value: Any) -> dict[str, Any]:
    """The leaves of one side of a batch (name "features" or "labels"), keyed as `Program.inputs` is.

    `name` for a single tensor; name/<key> for dict entries (keys in sorted order, as tf.nest
    flattens them); name/<i> for tuple/list entries; nested levels joined with "/". None (no
    labels) has no leaves. A pure walk of the Python structure: the compiler calls it on TF tensors,
    the executor on numpy arrays, so both sides agree on the keys.
    """
    if value is None:
        return {}
    if isinstance(value, Mapping):
        items = [(str(key), value[key]) for key in sorted(value)]
    elif isinstance(value, (tuple, list)):
        items = [(str(index), item) for index, item in enumerate(value)]
    else:
        return {name: value}
    return {key: leaf for child, item in items for key, leaf in input_leaves(f"{name}/{child}", item).items()}


def host_call_structure(tensors: Any, is_tensor: Any) -> tuple[dict[str, Any], dict[str, Any], list[tuple[str, Any]]]:
    """Describe host_call's `tensors` (a list/tuple: fn's positional arguments, a dict: its keyword arguments).

    Inside them lists, tuples and dicts (str keys) nest freely; a leaf is a
    tensor (`is_tensor(leaf)`) or None. Returns (structure, leaves, bad):
    `structure` is JSON-able, {"args": [node...]} or {"kwargs": [[name, node]...]}
    where a node is None, {"tensor": key}, {"list"|"tuple": [node...]} or
    {"dict": [[key, node]...]} (dict order kept); `leaves` maps each output key
    ("host_call/<i>/<j>...", "host_call/<name>/<key>...") to its tensor; `bad`
    lists (key, item) for anything else (other leaves, non-str dict keys,
    namedtuples, sets; or `tensors` itself not a list/tuple/dict, key "host_call").
    """
    leaves: dict[str, Any] = {}
    bad: list[tuple[str, Any]] = []

    def node(item: Any, path: str) -> Any:
        if item is None:
            return None
        if is_tensor(item):
            if path in leaves:
                bad.append((path, item))  # two dict keys spelled the same path ("a/b" and "a" -> "b")
            leaves[path] = item
            return {"tensor": path}
        if isinstance(item, dict) and all(isinstance(k, str) for k in item):
            return {"dict": [[k, node(v, f"{path}/{k}")] for k, v in item.items()]}
        if isinstance(item, (list, tuple)) and not hasattr(item, "_fields"):
            kind = "list" if isinstance(item, list) else "tuple"
            return {kind: [node(v, f"{path}/{i}") for i, v in enumerate(item)]}
        bad.append((path, item))
        return None

    if isinstance(tensors, dict) and all(isinstance(k, str) for k in tensors):
        structure = {"kwargs": [[k, node(v, f"{HOST_CALL_PREFIX}/{k}")] for k, v in tensors.items()]}
    elif isinstance(tensors, (list, tuple)) and not hasattr(tensors, "_fields"):
        structure = {"args": [node(v, f"{HOST_CALL_PREFIX}/{i}") for i, v in enumerate(tensors)]}
    else:
        bad.append((HOST_CALL_PREFIX, tensors))
        structure = {"args": []}
    return structure, leaves, bad


def host_call_arguments(structure: dict[str, Any], value_of: Any) -> tuple[list[Any], dict[str, Any]]:
    """(args, kwargs) for host_call's fn: `structure` rebuilt with `value_of(key)` at each tensor leaf."""

    def build(node: Any) -> Any:
        if node is None:
            return None
        if "tensor" in node:
            return value_of(node["tensor"])
        if "dict" in node:
            return {k: build(v) for k, v in node["dict"]}
        items = [build(v) for v in node.get("list", node.get("tuple"))]
        return items if "list" in node else tuple(items)

    if "kwargs" in structure:
        return [], {k: build(v) for k, v in structure["kwargs"]}
    return [build(v) for v in structure["args"]], {}
