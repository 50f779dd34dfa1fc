"""cerebras_tf.run.tensor_text writes tensors exactly as TF's kernels do (tf.print's StringFormat, tf.Assert's
message)."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf.run.tensor_text import summarize_value

_RNG = np.random.default_rng(5)
VALUES = {
    "scalar float": np.float32(1 / 3),
    "scalar int": np.int64(-5),
    "scalar bool": np.bool_(True),
    "floats": np.array([0.1, 1e10, 1.5e-7, -0.0, np.inf, -np.inf, np.nan, -np.nan, 123456789, 16777216, 2.5],
                       np.float32),
    "doubles": np.array([1 / 3, 0.1, 1e300, -2.0], np.float64),
    "halves": np.array([1 / 3, 65504, -0.5], np.float16),
    "vector": np.arange(10, dtype=np.int32),
    "matrix": _RNG.normal(size=(4, 5)).astype(np.float32),
    "cube": np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4),
    "rank 4": np.arange(2 * 2 * 3 * 2, dtype=np.uint8).reshape(2, 2, 3, 2),
    "bools": np.array([[True, False], [False, True]]),
    "empty rows": np.zeros((0, 3), np.float32),
    "empty columns": np.zeros((2, 0), np.float32),
    "strings": np.array([b"a\nb\"c'\\", "é ok".encode(), b"\x01\x7f"], object),
    "string scalar": np.array(b"tab\there", object),
}
SUMMARIZE = [-1, 0, 1, 2, 3, 5, 100]


@pytest.mark.parametrize("summarize", SUMMARIZE)
@pytest.mark.parametrize("name", sorted(VALUES))
def test_v2_is_tf_strings_format(name, summarize):
    value = VALUES[name]
    expected = tf.strings.format("{}", tf.constant(value), summarize=summarize).numpy().decode("utf-8", "replace")
    assert summarize_value(value, summarize, "v2") == expected


def _assert_messages(values: list[np.ndarray], summarize: int) -> list[str]:
    """What tf.Assert(False, [value], summarize) says in a graph, for each value."""
    graph = tf.Graph()
    with graph.as_default():
        ops = [tf.raw_ops.Assert(condition=False, data=[value], summarize=summarize) for value in values]
    messages = []
    with tf.compat.v1.Session(graph=graph) as session:
        for op in ops:
            with pytest.raises(tf.errors.InvalidArgumentError) as info:
                session.run(op)
            line = next(line for line in info.value.message.splitlines() if line.startswith("assertion failed: "))
            messages.append(line[len("assertion failed: "):])
    return messages


@pytest.mark.parametrize("summarize", SUMMARIZE)
def test_v1_is_the_assert_message(summarize):
    names = sorted(VALUES)
    expected = _assert_messages([VALUES[name] for name in names], summarize)
    for name, message in zip(names, expected):
        assert f"[{summarize_value(VALUES[name], summarize, 'v1')}]" == message, name
