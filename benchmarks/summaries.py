"""Read back the TensorBoard scalars a run wrote: for the tests and the benchmarks (not shipped)."""
from __future__ import annotations

import glob
import os

import tensorflow as tf


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
