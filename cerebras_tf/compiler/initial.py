"""Initial values of a program's variables, computed by TensorFlow from the captured graph.

The executor never imports TensorFlow, so the values TF would give each
variable at the start of training (its initializer, with the graph's and the
op's seeds, as tf.estimator would run it) are computed here, on request.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from cerebras_tf import ir
from estimator import CapturedModel


def initial_values(model: CapturedModel, program: ir.Program) -> dict[str, np.ndarray]:
    """Variable name -> initial value, for every variable of `program`, by running their initializers."""
    by_name = _graph_variables(model.graph)
    missing = [v.name for v in program.variables if v.name not in by_name]
    if missing:
        raise ValueError(f"variables {missing} of the program are not in the graph's variable collections")
    return _run_initializers(model.graph, [by_name[v.name] for v in program.variables])


def variables_outside(model: CapturedModel, program: ir.Program) -> dict[str, np.ndarray]:
    """Initial values of the graph's global variables that the program never touches.

    tf.estimator checkpoints every global variable, used or not (e.g. a loss scale's counter that a
    subclass no longer updates); a checkpoint of the simulated WSE must hold them too, or CPU training
    cannot resume from it.
    """
    used = {v.name for v in program.variables}
    outside = [v for v in model.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
               if v.op.name not in used]
    return _run_initializers(model.graph, outside)


def _graph_variables(graph: tf.Graph) -> dict[str, tf.Variable]:
    by_name = {v.op.name: v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
    by_name.update({v.op.name: v for v in graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)})
    return by_name


def _run_initializers(graph: tf.Graph, variables: list[tf.Variable]) -> dict[str, np.ndarray]:
    if not variables:
        return {}
    with tf.compat.v1.Session(graph=graph) as session:
        session.run([v.initializer for v in variables])
        values = session.run([v._graph_element for v in variables])  # no new ops
    return {v.op.name: np.asarray(value) for v, value in zip(variables, values)}
