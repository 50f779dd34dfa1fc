"""TensorBoard event files, written directly (graph and eager mode alike): an image summary, a run's TF1
summaries and its graph (EventWriter, write_graph)."""
from __future__ import annotations

import os
import socket
import struct
import time

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, summary_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.core.util import event_pb2

# The text GraphDef tf.estimator writes into model_dir when training starts.
GRAPH_FILE = "graph.pbtxt"


def write_image_summary(logdir: str, tag: str, png: bytes, step: int = 0) -> str:
    """Write one PNG image summary to a new event file in `logdir`; returns the file's path."""
    width, height = struct.unpack(">II", png[16:24])  # the PNG IHDR chunk
    image = summary_pb2.Summary.Image(height=height, width=width, colorspace=4, encoded_image_string=png)
    now = time.time()
    events = [
        event_pb2.Event(wall_time=now, file_version="brain.Event:2"),
        event_pb2.Event(wall_time=now, step=step,
                        summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, image=image)])),
    ]
    tf.io.gfile.makedirs(logdir)
    path = os.path.join(logdir, f"events.out.tfevents.{now:.6f}.{socket.gethostname()}")
    with tf.io.TFRecordWriter(path) as writer:
        for event in events:
            writer.write(event.SerializeToString())
    return path


class EventWriter:
    """One new event file in `logdir` for a run, holding TF1 `Summary` protos (simple_value scalars,
    histograms), as tf.compat.v1.summary.FileWriter writes them for tf.estimator."""

    def __init__(self, logdir: str) -> None:
        tf.io.gfile.makedirs(logdir)
        now = time.time()
        self.path = os.path.join(logdir, f"events.out.tfevents.{now:.6f}.{socket.gethostname()}")
        self._records = tf.io.TFRecordWriter(self.path)
        self._records.write(event_pb2.Event(wall_time=now, file_version="brain.Event:2").SerializeToString())

    def add_summary(self, summary: summary_pb2.Summary, step: int) -> None:
        if summary.value:
            event = event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary)
            self._records.write(event.SerializeToString())

    def add_graph(self, graph_def: graph_pb2.GraphDef) -> None:
        """The graph TensorBoard's Graphs tab shows (FileWriter.add_graph's event)."""
        self._records.write(event_pb2.Event(wall_time=time.time(),
                                            graph_def=graph_def.SerializeToString()).SerializeToString())

    def add_meta_graph(self, meta_graph_def: meta_graph_pb2.MetaGraphDef) -> None:
        """The graph with its collections (FileWriter.add_meta_graph's event)."""
        self._records.write(event_pb2.Event(wall_time=time.time(),
                                            meta_graph_def=meta_graph_def.SerializeToString()).SerializeToString())

    def flush(self) -> None:
        self._records.flush()

    def close(self) -> None:
        self._records.close()


def write_graph(model_dir: str, graph: tf.Graph, writer: EventWriter) -> None:
    """Write a training run's graph as tf.estimator does when training starts (its CheckpointSaverHook):
    graph.pbtxt in model_dir, and the graph and its meta graph in the run's event file, so TensorBoard's
    Graphs tab shows the model whether it trained on CPU/GPU or on the CS system."""
    graph_def = graph.as_graph_def(add_shapes=True)
    tf.io.write_graph(graph_def, model_dir, GRAPH_FILE, as_text=True)
    writer.add_graph(graph_def)
    with graph.as_default():  # export_meta_graph reads the collections of the default graph
        writer.add_meta_graph(tf.compat.v1.train.export_meta_graph(graph_def=graph_def, graph=graph))


def scalar_summary(values: dict[str, float]) -> summary_pb2.Summary:
    """A TF1 Summary of simple_value scalars, tag -> value."""
    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
                                      for tag, value in values.items()])
