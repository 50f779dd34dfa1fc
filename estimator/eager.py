"""Eager execution for the host side of a run, whatever mode the user's script chose.

The Model Zoo's R1.8 scripts call ``tf.compat.v1.disable_eager_execution()``
first. A run on the CS system still needs TF's eager API on the host: the
input stream iterates the Dataset in Python, the host kernels call TF ops on
numpy arrays, checkpoints and summaries are written from numpy values. The
graphs a run builds (the captured model, one-op kernels, host_call metrics)
are built in tf.Graphs of their own either way.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, TypeVar

import tensorflow as tf
from tensorflow.python.eager import context

F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def eagerly() -> Iterator[None]:
    """Run the block eagerly in this thread: outside any graph being built (tf.init_scope), and in eager mode
    even where eager execution was disabled (the mode is per thread: a thread started inside the block is
    not eager by that; give its target `eager_thread`)."""
    # tf.init_scope costs 50-80 us a call (the host kernels' TF calls pay it): only a function being built needs it
    building = tf.compat.v1.get_default_graph().building_function
    with tf.init_scope() if building else contextlib.nullcontext():
        if context.executing_eagerly():
            yield
        else:
            with context.eager_mode():
                yield


def eager_thread(target: F) -> F:
    """`target`, run inside eagerly(): for the threads a run starts (each thread has its own mode)."""

    @functools.wraps(target)
    def run(*args: Any, **kwargs: Any) -> Any:
        with eagerly():
            return target(*args, **kwargs)

    return run  # type: ignore[return-value]
