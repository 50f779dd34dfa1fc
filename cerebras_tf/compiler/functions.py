"""The captured graph's function library: the functions its ops call (tf.cond/tf.case branches, nested
inside each other, tf.switch_case branches), read from that graph alone.

TF's own helpers look functions up in the default graph, or in the eager
context when eager execution is on. Neither is the right place here: a
script that disabled eager execution has its conds' functions in the
captured graph only, and the default graph may hold anything (another
model's graph, the user's own). Every lookup of the compiler goes through
this module, with the captured graph named explicitly.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import tensorflow as tf
from tensorflow.core.framework import function_pb2
from tensorflow.python.framework import func_graph as func_graph_module
from tensorflow.python.framework import function_def_to_graph, importer

FunctionDef = Any  # tensorflow.core.framework.function_pb2.FunctionDef
Lookup = Callable[[str], "FunctionDef | None"]


def function_def(graph: tf.Graph, name: str) -> FunctionDef | None:
    """The FunctionDef of function `name` in `graph`'s own library (None when it has none by that name).

    A function graph (the branch graphs the compiler builds) holds only the functions its ops use as op
    types; the ones its conds name are in the captured graph it was built in (its outer_graph).
    """
    while graph is not None:
        function = graph._get_function(name)  # the graph's own library, by name
        if function is not None:
            return function.cached_definition if hasattr(function, "cached_definition") else function.definition
        graph = getattr(graph, "outer_graph", None)
    return None


def called_functions(node_def: Any, lookup: Lookup) -> list[str]:
    """The functions a node calls: those its attributes name (If's then_branch/else_branch, Case's branches,
    ...) and its op type when that is a function of the library (a function called as an op)."""
    names = [node_def.op] if lookup(node_def.op) is not None else []
    for attr in node_def.attr.values():
        if attr.HasField("func"):
            names.append(attr.func.name)
        elif attr.HasField("list"):
            names.extend(func.name for func in attr.list.func)
    return [name for name in names if name]


def library(node_defs: Iterable[Any], lookup: Lookup) -> function_pb2.FunctionDefLibrary:
    """The functions `node_defs` call, and every function those call, as a library a GraphDef can carry.

    A name `lookup` does not know is left out (TF then names it when the GraphDef is run)."""
    found = function_pb2.FunctionDefLibrary()
    seen: set[str] = set()
    stack = [name for node in node_defs for name in called_functions(node, lookup)]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        definition = lookup(name)
        if definition is None:
            continue
        found.function.add().CopyFrom(definition)
        stack.extend(called for node in definition.node_def for called in called_functions(node, lookup))
    return found


def function_graph(outer: tf.Graph, name: str, variables: dict[int, tf.Operation]) -> tf.Graph:
    """The graph of function `name` of `outer` (the captured graph), built inside `outer`, whatever the
    default graph is and whether eager execution is on or off; the resource arguments in `variables`
    (argument index -> the variable's VarHandleOp) become handles of those variables (VarHandleOps of
    their dtype and shape, under the argument's name): a function argument carries no variable shape, so
    reads of it would have unknown shapes.

    Raises KeyError when `outer` has no function `name`.
    """
    fdef = function_def(outer, name)
    if fdef is None:
        raise KeyError(f"the captured graph has no function {name!r}")
    with outer.as_default():  # TF finds the functions the body calls in the default graph: make it `outer`
        return _function_graph_in_default(fdef, variables)


def _function_graph_in_default(fdef: FunctionDef, variables: dict[int, tf.Operation]) -> tf.Graph:
    graph_def, flat = function_def_to_graph.function_def_to_graph_def(fdef)
    nodes = {node.name: node for node in graph_def.node} if variables else {}  # one lookup per variable argument
    for index, variable in variables.items():
        node = nodes[fdef.signature.input_arg[index].name]
        node.op = "VarHandleOp"
        node.ClearField("attr")
        node.attr["dtype"].type = variable.get_attr("dtype").as_datatype_enum
        node.attr["shape"].shape.CopyFrom(tf.TensorShape(variable.get_attr("shape")).as_proto())
        node.attr["container"].s = b""
        node.attr["shared_name"].s = node.name.encode()
    graph = func_graph_module.FuncGraph(fdef.signature.name)
    with graph.as_default():
        importer.import_graph_def_for_function(graph_def, name="")
    graph.inputs = [graph.get_tensor_by_name(flat[arg.name]) for arg in fdef.signature.input_arg]
    graph.outputs = [graph.get_tensor_by_name(flat[fdef.ret[arg.name]]) for arg in fdef.signature.output_arg]
    graph.control_outputs = [graph.get_operation_by_name(fdef.control_ret[name])
                             for name in fdef.signature.control_output]
    return graph
