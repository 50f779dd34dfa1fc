"""A training run on the simulated WSE writes its graph as tf.estimator does: graph.pbtxt and graph events.

Without them TensorBoard's Graphs tab is empty for a CS-system run while a
CPU run of the same model shows the graph.
"""
from __future__ import annotations

import glob
import os

import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.util import event_pb2

# The model's own ops (make_model_fn's layers, loss, gradients and update), as tf.estimator names them.
MODEL_SCOPES = ("hidden/", "output/", "mean_squared_error/", "gradients/", "GradientDescent")


def _graph_file(model_dir: str) -> tf.compat.v1.GraphDef:
    with open(os.path.join(model_dir, "graph.pbtxt"), encoding="utf-8") as handle:
        return text_format.Parse(handle.read(), tf.compat.v1.GraphDef())


def _graph_events(model_dir: str) -> list[event_pb2.Event]:
    return [event for path in glob.glob(os.path.join(model_dir, "events.out.tfevents.*"))
            for event in tf.compat.v1.train.summary_iterator(path)
            if event.WhichOneof("what") in ("graph_def", "meta_graph_def")]


def _model_ops(graph_def: tf.compat.v1.GraphDef) -> dict[str, str]:
    return {node.name: node.op for node in graph_def.node if node.name.startswith(MODEL_SCOPES)}


def _node(graph_def: tf.compat.v1.GraphDef, name: str) -> tf.compat.v1.NodeDef:
    [node] = [node for node in graph_def.node if node.name == name]
    return node


def test_training_on_the_system_writes_the_graph_as_a_cpu_run_does(make_estimator, build_estimator, make_input_fn,
                                                                    tmp_path):
    estimator = make_estimator()
    estimator.train(make_input_fn(), max_steps=3)
    graph_def = _graph_file(estimator.model_dir)
    ops = _model_ops(graph_def)
    assert ops["hidden/MatMul"] == "MatMul" and ops["output/kernel"] in ("VariableV2", "VarHandleOp")
    assert "GradientDescent" in ops  # the train_op
    assert _node(graph_def, "global_step")
    [shape] = _node(graph_def, "hidden/MatMul").attr["_output_shapes"].list.shape  # as tf.estimator writes it
    assert [dim.size for dim in shape.dim] == [4, 8]  # [batch size, hidden units]

    events = {event.WhichOneof("what"): event for event in _graph_events(estimator.model_dir)}
    assert set(events) == {"graph_def", "meta_graph_def"}
    assert tf.compat.v1.GraphDef.FromString(events["graph_def"].graph_def) == graph_def
    meta_graph = tf.compat.v1.MetaGraphDef.FromString(events["meta_graph_def"].meta_graph_def)
    assert meta_graph.graph_def == graph_def and "trainable_variables" in meta_graph.collection_def

    cpu = build_estimator(str(tmp_path / "cpu"), cs_ip=None)
    cpu.train(make_input_fn(), max_steps=3)
    cpu_graph_def = _graph_file(cpu.model_dir)
    assert _model_ops(cpu_graph_def) == ops  # the same model graph as tf.estimator's
    assert _node(cpu_graph_def, "hidden/MatMul") == _node(graph_def, "hidden/MatMul")
    assert {event.WhichOneof("what") for event in _graph_events(cpu.model_dir)} == set(events)
