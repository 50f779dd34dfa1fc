"""TensorBoard event files: write an image summary directly (graph and eager mode alike); read scalars back."""
from __future__ import annotations

import glob
import os
import socket
import struct
import time

import tensorflow as tf
from tensorflow.core.framework import summary_pb2
from tensorflow.core.util import event_pb2


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


def read_scalars(logdir: str, tag: str) -> dict[int, float]:
    """step -> value of the scalar summary `tag` in logdir's event files (TF2 tensor or TF1 simple_value)."""
    found: dict[int, float] = {}
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    found[event.step] = (float(tf.make_ndarray(value.tensor)) if value.HasField("tensor")
                                         else float(value.simple_value))
    return found
