"""Runtime assertions and prints compile to program outputs and Program.assertions / .prints entries
(issue 16, 5): never dropped; what the host cannot show is refused at validate, naming the op and the line."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sys

import numpy as np
import pytest
import tensorflow as tf

from estimator import ModeKeys
from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig, ir
from cerebras_tf.errors import UnsupportedOpError

_X = np.random.default_rng(0).uniform(size=(16, 3)).astype(np.float32)


def _input_fn(params):
    return tf.data.Dataset.from_tensor_slices((_X, _X[:, :1])).repeat().batch(4, drop_remainder=True)


def _model_fn(checks):
    def model_fn(features, labels, mode, params):
        with tf.control_dependencies(checks(features)):
            features = tf.identity(features)
        predictions = tf.compat.v1.layers.dense(features, 1, name="out")
        loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            loss, global_step=tf.compat.v1.train.get_global_step())
        return CSEstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


def _compile(tmp_path, checks, validate_only=True):
    estimator = CerebrasEstimator(_model_fn(checks), model_dir=str(tmp_path / "model"),
                                  config=CSRunConfig(cs_ip="localhost:9000"), params={})
    return estimator.compile(_input_fn, validate_only=validate_only)


def _line(marker: str) -> str:
    with open(__file__, encoding="utf-8") as handle:
        number = next(i for i, line in enumerate(handle, 1) if line.rstrip().endswith(f"# MARK:{marker}"))
    return f"{__file__}:{number}"


def _asserts_and_print(features):
    return [tf.debugging.assert_non_negative(features, message="no negatives"),  # MARK:non_negative
            tf.Assert(tf.reduce_all(features < 5.0), ["too big", features], summarize=2),  # MARK:Assert
            tf.print("mean", tf.reduce_mean(features), output_stream=sys.stdout)]  # MARK:print


def test_assertions_and_prints_become_outputs_and_entries(tmp_path):
    result = _compile(tmp_path, _asserts_and_print, validate_only=False)
    program = result.program
    first, second = program.assertions
    assert first["name"] == "assert_non_negative/assert_less_equal/Assert/AssertGuard/Assert"
    assert first["location"] == _line("non_negative") and second["location"] == _line("Assert")
    # static strings are in the entry; the tensor the message shows is streamed: here the features input
    assert [item.get("constant") for item in first["data"][:3]] == [
        "no negatives.  ", "Condition x >= 0 did not hold element-wise:", "x (IteratorGetNext:0) = "]
    assert first["data"][3] == {"output": "assert/0/data/3", "dtype": "float32"}
    assert program.outputs["assert/0/data/3"] == program.inputs["features"]
    assert second["summarize"] == 2 and second["data"][0]["constant"] == "too big"
    for entry in program.assertions:
        condition = program.tensors[program.outputs[entry["condition"]]]
        assert (condition.dtype, condition.shape) == ("bool", [])
    (printed,) = program.prints
    assert printed["output_stream"] == "stdout" and printed["style"] == "v2" and printed["location"] == _line("print")
    assert printed["pieces"] == [{"text": "mean "}, {"output": "print/0/data/1", "dtype": "float32"}]
    assert program.tensors[program.outputs["print/0/data/1"]].shape == []
    assert not any(program.tensors[tid].dtype == "string" for tid in program.outputs.values())
    assert "runtime assertions checked on the host: 2; prints: 1" in result.report
    # the entries survive the artifact: saved, loaded and verified
    program.save(str(tmp_path))
    assert ir.Program.load(str(tmp_path)).verify().assertions == program.assertions


def test_a_statically_true_assertion_is_kept_with_a_constant_condition(tmp_path):
    program = _compile(tmp_path, lambda x: [tf.compat.v1.assert_equal(tf.constant(1), tf.constant(1))]).program
    (entry,) = program.assertions
    condition = program.tensors[program.outputs[entry["condition"]]]
    assert condition.const is not None and condition.const.splat is True
    assert [item["constant"] for item in entry["data"]][-2:] == ["y (Const_1:0) = ", 1]


def _runtime_string_in_assert(features):
    return [tf.Assert(tf.reduce_all(features > 0.0), [tf.strings.as_string(features)])]  # MARK:as_string


def _runtime_string_printed(features):
    return [tf.print("x", tf.strings.as_string(features))]  # MARK:print_as_string


def _runtime_string_printed_alone(features):
    return [tf.print(tf.strings.as_string(features))]  # MARK:print_alone


def _runtime_string_in_guarded_assert(features):
    return [tf.Assert(tf.reduce_all(features > 0.0), [features, tf.strings.as_string(features)])]  # MARK:guarded


@pytest.mark.parametrize("checks, marker, op_type", [
    (_runtime_string_in_assert, "as_string", "'Assert' (op 'Assert/Assert')"),
    (_runtime_string_printed, "print_as_string", "'PrintV2' (op 'PrintV2')"),
    (_runtime_string_printed_alone, "print_alone", "'PrintV2' (op 'PrintV2')"),
    (_runtime_string_in_guarded_assert, "guarded", "'Assert' (op 'Assert/AssertGuard/Assert')"),
])
def test_a_string_computed_at_run_time_is_refused_at_validate(tmp_path, assert_refused, checks, marker, op_type):
    estimator = CerebrasEstimator(_model_fn(checks), model_dir=str(tmp_path / "model"),
                                  config=CSRunConfig(cs_ip="localhost:9000"), params={})
    error = assert_refused(estimator, UnsupportedOpError, lambda: estimator.compile(_input_fn, validate_only=True),
                           f"Op type {op_type}", "string computed at run time", "AsString", _line(marker),
                           "numeric tensors")
    assert error.where == _line(marker)


def test_a_printed_tf_strings_format_is_formatted_by_the_host(tmp_path):
    # tf.print of one string tensor prints it as it is: a tf.strings.format the host can do itself
    program = _compile(tmp_path, lambda x: [tf.print(tf.strings.format("x={} !", x[0], summarize=1))]).program
    (entry,) = program.prints
    assert entry["summarize"] == 1
    assert entry["pieces"] == [{"text": "x="}, {"output": "print/0/data/1", "dtype": "float32"}, {"text": " !"}]


def test_an_assertion_in_a_tf_cond_branch_holds_when_the_branch_is_not_taken(tmp_path):
    def in_branch(features):
        def checked():
            with tf.control_dependencies([tf.debugging.assert_negative(features)]):
                return tf.identity(features)
        return [tf.cond(tf.reduce_sum(features) > 100.0, checked, lambda: tf.identity(features)).op]

    program = _compile(tmp_path, in_branch).program
    (entry,) = program.assertions
    holds = program.tensors[program.outputs[entry["condition"]]]
    producer = next(k for k in program.kernels if holds.id in k.outputs)
    assert producer.kind == "logical_or"  # condition OR NOT (branch taken)
    assert program.kernels[next(k.id for k in program.kernels if producer.inputs[0] in k.outputs)].kind == \
        "logical_not"


@pytest.mark.parametrize("first, second", [
    # plain Assert ops (all data strings or int32) keep their strings outside the guard function
    (lambda x: [tf.Assert(tf.reduce_all(x > 0.0), ["one message"])],
     lambda x: [tf.Assert(tf.reduce_all(x > 0.0), ["another message"])]),
    (lambda x: [tf.print("x is", x)], lambda x: [tf.print("x =", x)]),
    (lambda x: [tf.print("x", x, summarize=3)], lambda x: [tf.print("x", x, summarize=4)]),
    (lambda x: [tf.print("x", x)],
     lambda x: [tf.print("x", x)]),  # the same print on another line: the error/print names the line
])
def test_the_program_hash_covers_messages_and_lines(tmp_path, first, second):
    from cerebras_tf.compiler.driver import program_hash
    from cerebras_tf.precheck import precheck

    def hash_of(checks):
        estimator = CerebrasEstimator(_model_fn(checks), model_dir=str(tmp_path / "model"),
                                      config=CSRunConfig(cs_ip="localhost:9000"), params={})
        return program_hash(precheck(estimator, _input_fn, ModeKeys.TRAIN))

    assert hash_of(first) != hash_of(second)
    assert hash_of(first) == hash_of(first)


def test_check_numerics_is_refused_with_the_assertion_to_write_instead(tmp_path, assert_refused):
    def check_numerics(features):
        return [tf.debugging.check_numerics(features, "bad features").op]  # MARK:check_numerics

    estimator = CerebrasEstimator(_model_fn(check_numerics), model_dir=str(tmp_path / "model"),
                                  config=CSRunConfig(cs_ip="localhost:9000"), params={})
    assert_refused(estimator, UnsupportedOpError, lambda: estimator.compile(_input_fn, validate_only=True),
                   "CheckNumerics", _line("check_numerics"), "tf.debugging.Assert(tf.reduce_all(tf.math.is_finite(x))")
