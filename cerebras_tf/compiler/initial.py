"""Initial values of a program's variables, computed by TensorFlow from the captured graph.

The executor never imports TensorFlow, so the values TF would give each
variable at the start of training (its initializer, with the graph's and the
op's seeds, as tf.estimator would run it) are computed here, on request.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from cerebras_tf.compiler import ir
from estimator import CapturedModel


def initial_values(model: CapturedModel, program: ir.Program) -> dict[str, np.ndarray]:
    """Variable name -> initial value, for every variable of `program`, by running their initializers."""
    graph = model.graph
    by_name = {v.op.name: v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
    by_name.update({v.op.name: v for v in graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)})
    missing = [v.name for v in program.variables if v.name not in by_name]
    if missing:
        raise ValueError(f"variables {missing} of the program are not in the graph's variable collections")
    variables = [by_name[v.name] for v in program.variables]
    with tf.compat.v1.Session(graph=graph) as session:
        session.run([v.initializer for v in variables])
        values = session.run([v._graph_element for v in variables])  # no new ops
    return {v.name: np.asarray(value) for v, value in zip(program.variables, values)}
