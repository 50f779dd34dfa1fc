"""Unsupported constructs fail at compile with the op type, the op and the user's file:line."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig
from cerebras_tf.errors import (CompileError, DynamicShapeError, MultipleProblemsError,
                                UnsupportedOpError, UnsupportedTensorFlowError)


def _py_function(x, labels):
    y = tf.py_function(lambda a: a * 2.0, [x], tf.float32)  # MARK:py_function
    y.set_shape(x.shape)
    return y


def _string_op(x, labels):
    text = tf.strings.as_string(x)  # MARK:string
    return x + tf.strings.to_number(text)


def _boolean_mask(x, labels):
    kept = tf.boolean_mask(x, x > 0.0)  # MARK:boolean_mask
    return x * tf.reduce_sum(kept)


def _unique(x, labels):
    ids, _ = tf.unique(labels)  # MARK:unique
    return x * tf.cast(tf.reduce_sum(ids), tf.float32)


def _while_loop(x, labels):
    _, y = tf.while_loop(lambda i, t: i < 3, lambda i, t: (i + 1, t * 2.0), [0, x])  # MARK:while_loop
    return y


def _while_loop_in_cond(x, labels):
    def loop():
        return tf.while_loop(lambda i, t: i < 3, lambda i, t: (i + 1, t * 2.0), [0, x])[1]

    return tf.cond(tf.reduce_sum(x) > 0.0, loop, lambda: x)  # MARK:while_loop_in_cond


def _tf1_cond(x, labels):
    tf.compat.v1.disable_control_flow_v2()
    try:
        return tf.cond(tf.reduce_sum(x) > 0.0, lambda: x * 2.0, lambda: x)  # MARK:tf1_cond
    finally:
        tf.compat.v1.enable_control_flow_v2()


def _dynamic_reshape(x, labels):
    rows = tf.reduce_max(labels) + 1
    flat = tf.reshape(x, tf.stack([rows, -1]))  # MARK:dynamic_reshape
    return tf.reshape(flat, x.shape)


CASES = {  # construct -> (op type in the message, error class, words of the hint)
    "py_function": (_py_function, "EagerPyFunc", UnsupportedOpError, "tf.py_function"),
    "string": (_string_op, "AsString", UnsupportedOpError, "String tensors"),
    "boolean_mask": (_boolean_mask, "Where", UnsupportedOpError, "depends on the data"),
    "unique": (_unique, "Unique", UnsupportedOpError, "depends on the data"),
    "while_loop": (_while_loop, "StatelessWhile", UnsupportedOpError, "Unroll the loop"),
    # tf.cond branches are compiled (both run; only the taken one writes variables), not loops inside them
    "while_loop_in_cond": (_while_loop_in_cond, "StatelessWhile", UnsupportedOpError, "Unroll the loop"),
    "dynamic_reshape": (_dynamic_reshape, "Reshape", DynamicShapeError, "at compile time"),
    "tf1_cond": (_tf1_cond, "Switch", UnsupportedOpError, "tf.compat.v1.enable_control_flow_v2()"),
}


def _input_fn(params):
    x = np.linspace(-1.0, 1.0, 32 * 4, dtype=np.float32).reshape(32, 4)
    y = (np.arange(32) % 3).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(4, drop_remainder=True)


def _model_fn(features, labels, mode, params):
    x = tf.compat.v1.layers.dense(features, 4, name="hidden")
    x = CASES[params["case"]][0](x, labels)
    logits = tf.compat.v1.layers.dense(x, 3, name="logits")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf.compat.v1.train.get_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def _marked_line(case: str) -> str:
    with open(__file__, encoding="utf-8") as f:
        number = next(n for n, line in enumerate(f, start=1) if line.rstrip().endswith(f"# MARK:{case}"))
    return f"{__file__}:{number}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_unsupported_construct_names_op_type_and_user_line(tmp_path, case):
    _, op_type, error_type, hint = CASES[case]
    est = CerebrasEstimator(_model_fn, model_dir=str(tmp_path), config=CSRunConfig(cs_ip="localhost:9000"),
                            params={"case": case})
    with pytest.raises((CompileError, MultipleProblemsError)) as info:
        est.compile(_input_fn, validate_only=True)
    assert not isinstance(info.value, MultipleProblemsError), str(info.value)  # one cause, reported once
    problem = info.value
    assert f"'{op_type}'" in problem.message or f"({op_type})" in problem.message
    assert isinstance(problem, error_type) and isinstance(problem, UnsupportedTensorFlowError)
    text = str(problem)
    assert text.startswith("[Unsupported TensorFlow]")
    assert _marked_line(case) in text  # the user's file:line where the op was created
    assert hint in text
    assert not (tmp_path / "cs_compile").exists()
