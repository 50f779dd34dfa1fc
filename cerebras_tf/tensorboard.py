"""TensorBoard event files: write an image summary directly (graph and eager mode alike)."""
from __future__ import annotations

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
