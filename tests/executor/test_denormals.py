"""Denormals are flushed on the executor's threads, as TensorFlow's CPU kernels flush them (wse/denormals.py)."""
from __future__ import annotations

import contextlib
import os
import threading

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from estimator import EstimatorSpec, ModeKeys
from cerebras_tf import CerebrasEstimator, CSRunConfig
from cerebras_tf.compiler import initial
from cerebras_tf.precheck import precheck
from cerebras_tf.wse import dataflow, denormals, threads
from cerebras_tf.wse.executor import Executor

pytestmark = pytest.mark.skipif(not denormals.AVAILABLE, reason="x86-64 with numba only")
SUBNORMAL = np.float32(1e-39)


def test_flushing_sets_the_bits_for_the_block_and_restores_them():
    before = denormals.mxcsr()
    assert SUBNORMAL * np.float32(1) != 0  # numpy keeps subnormals by default
    with denormals.flushing():
        assert denormals.mxcsr() & denormals.FTZ_DAZ == denormals.FTZ_DAZ
        assert SUBNORMAL * np.float32(1) == 0  # a subnormal operand reads as zero
        assert np.float32(1e-20) * np.float32(1e-20) == 0  # a subnormal result becomes zero
    control = ~0x3F  # the low six bits are sticky status flags, which arithmetic sets
    assert denormals.mxcsr() & control == before & control and SUBNORMAL * np.float32(1) != 0


def test_pool_threads_and_helpers_compute_as_the_kernels_thread():
    """A split kernel's slices on the pool thread, and units on the executor's helper thread, flush as the
    step's own thread does, and the pool thread keeps its own setting outside that work."""
    x = np.full(1 << 18, SUBNORMAL, np.float32)
    out = np.empty_like(x)
    with denormals.flushing():
        threads.split_range(x.size, lambda lo, hi: np.multiply(x[lo:hi], np.float32(1), out=out[lo:hi]), 1 << 10)
        assert not out.any()
    threads.split_range(x.size, lambda lo, hi: np.multiply(x[lo:hi], np.float32(1), out=out[lo:hi]), 1 << 10)
    assert (out == SUBNORMAL).all()
    for flushed in (True, False):
        seen: list[int] = []
        both = threading.Barrier(2, timeout=10)

        def compute(index: int, both: threading.Barrier = both, seen: list[int] = seen) -> None:
            both.wait()  # the two units run at once: one on the caller's thread, one on the helper
            seen.append(denormals.mxcsr() & denormals.FTZ_DAZ)

        units = [dataflow.Access(reads=[], outputs=[i]) for i in range(2)]
        with denormals.flushing() if flushed else contextlib.nullcontext():
            dataflow.run(dataflow.Schedule.build(units, set()), compute, lambda i, r: None, lambda t: None, 2)
        assert seen == [denormals.FTZ_DAZ if flushed else 0] * 2


def _input_fn(params):
    x = np.full((64, 4), 1e-10, np.float32)
    return tf.data.Dataset.from_tensor_slices((x, np.zeros(64, np.float32))).repeat().batch(8, drop_remainder=True)


def _model_fn(features, labels, mode, params):
    w = tf.compat.v1.get_variable("w", [4, 1], initializer=tf.compat.v1.constant_initializer(1e-30))
    products = tf.matmul(features * 1e-30, w * 1e30)  # 1e-40 in each product: subnormal
    loss = tf.reduce_sum(products) + tf.reduce_sum(w) * 0
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_a_step_flushes_an_underflowing_result_as_tensorflow_does(tmp_path):
    estimator = CerebrasEstimator(_model_fn, model_dir=str(tmp_path / "model"),
                                  config=CSRunConfig(cs_ip="localhost:9000"))
    model = precheck(estimator, _input_fn, ModeKeys.TRAIN)
    program = estimator.compile(_input_fn).program
    with model.graph.as_default(), tf.compat.v1.Session(graph=model.graph) as session:
        session.run([tf.compat.v1.global_variables_initializer(),
                     [op for op in model.graph.get_operations() if op.type == "MakeIterator"]])
        tf_loss = session.run(model.spec.loss)
    batch = next(_input_fn({}).as_numpy_iterator())
    executor = Executor(program, initial.initial_values(model, program), half_dtype="float32")
    loss = executor.step(*batch).loss
    assert tf_loss == 0.0 and loss == 0.0  # without flushing: 8 * 4 products of 1e-40 = 3.2e-39
    assert np.float32(1e-10) * np.float32(1e-30) != 0  # outside the step nothing is flushed
