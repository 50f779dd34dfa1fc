"""Branch functions (tf.case/tf.cond nested in each other, a tf.switch_case on a constant index) are read from the
captured graph's own function library, whatever the default graph holds (issue 22, item 3).

These run in this (eager) process; graph_mode_run.py runs nested conds in a process that disabled eager execution.
"""
from __future__ import annotations

import contextlib
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig, EstimatorSpec
from cerebras_tf.compiler import initial
from cerebras_tf.cs_config import ApplianceCSConfig
from cerebras_tf.errors import UnsupportedOpError
from cerebras_tf.precheck import precheck
from cerebras_tf.wse.executor import Executor
from estimator import ModeKeys
from examples.zoo import mlp

# One global step in each branch: the case's first, the middle one's nested conds (both levels, both sides)
# and the default.
STEPS = (0, 3, 4, 5, 6, 7, 8, 11, 12, 20)


def _constant(values: list[float], index: int, switch_case: bool) -> tf.Tensor:
    """values[index], picked by a tf.switch_case on a constant index (folded at compile time) or directly."""
    if not switch_case:
        return tf.constant(values[index])
    return tf.switch_case(tf.constant(index), [lambda value=value: tf.constant(value) for value in values])


def _rate(step: tf.Tensor, switch_case: bool) -> tf.Tensor:
    """A zoo-style schedule: a tf.case over global_step whose middle branch holds a tf.cond two levels deep and
    whose default is a constant (picked by a tf.switch_case with `switch_case`)."""
    step = tf.cast(step, tf.float32)

    def warmup():
        return 0.01 * step

    def middle():
        return tf.cond(step < 8.0, lambda: tf.cond(step < 6.0, lambda: 0.05 - 0.001 * step, lambda: 0.1 - 0.005 * step),
                       lambda: 0.03 - 0.001 * step)

    def default():
        return _constant([0.2, 0.002], 1, switch_case) * 2.0

    return tf.case([(step < 4.0, warmup), (step < 12.0, middle)], default=default)


def _model_fn(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(features, 5, name="logits")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    step = tf.compat.v1.train.get_global_step()
    switch_case = params["switch_case"]
    rate = _rate(step, switch_case) * _constant([1.0, -1.0], 0, switch_case)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(rate).minimize(loss, global_step=step)
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op, host_call=(lambda lr: {}, [rate]))


def _estimator(tmp_path, switch_case: bool = False) -> CerebrasEstimator:
    return CerebrasEstimator(_model_fn, model_dir=str(tmp_path / "model"), compile_dir=str(tmp_path / "compile"),
                             config=CSRunConfig(cs_ip="localhost:9000"), params={"switch_case": switch_case})


def _expected_rates(est: CerebrasEstimator) -> list[float]:
    """What TensorFlow computes for the schedule at each of STEPS (the rate host_call streams)."""
    model = precheck(est, mlp.input_fn, ModeKeys.TRAIN)
    rate = model.spec.host_call[1][0]
    with model.graph.as_default(), tf.compat.v1.Session(graph=model.graph) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        global_step = tf.compat.v1.train.get_global_step()
        expected = []
        for step in STEPS:
            global_step.load(step, session)
            expected.append(float(session.run(rate)))
    return expected


@contextlib.contextmanager
def _foreign_default_graph():
    """A default graph that is not the captured one, holding conds of its own (as a graph-mode script's global
    graph may): the branch functions of the model are not in it."""
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [])
        tf.cond(x > 0.0, lambda: tf.cond(x > 1.0, lambda: x, lambda: -x), lambda: x * 2.0)
        yield graph


def _computed_rates(result, model) -> list[float]:
    """The rate the compiled program streams at each of STEPS, run on the simulated system's executor."""
    batch = next(iter(mlp.input_fn({}).as_numpy_iterator()))
    start = initial.initial_values(model, result.program)
    return [float(Executor(result.program, {**start, "global_step": np.int64(step)}).step(*batch)
                  .outputs["host_call/0"]) for step in STEPS]


@pytest.mark.parametrize("default_graph", [contextlib.nullcontext, _foreign_default_graph],
                         ids=["eager", "a-foreign-default-graph"])
def test_nested_branches_lower_from_the_captured_graph(tmp_path, default_graph):
    est = _estimator(tmp_path)
    with default_graph():
        result = est.compile(mlp.input_fn, validate_only=True)
        model = precheck(est, mlp.input_fn, ModeKeys.TRAIN)
    if_converted = int(re.search(r"tf.cond if-converted: (\d+)", result.report).group(1))
    assert if_converted == 4  # the case's two Ifs and the middle branch's two nested conds
    expected = _expected_rates(est)
    np.testing.assert_allclose(_computed_rates(result, model), expected, rtol=1e-6)
    assert len(set(np.round(expected, 6))) == len(STEPS) - 1  # every branch is taken (two steps of the default)


def test_a_switch_case_on_a_constant_index_folds_with_its_branches_from_the_captured_graph(tmp_path):
    """Folding runs a constant tf.switch_case (one at the top level, one in the tf.case's default branch) with
    the functions of its branches, which the clean graph it is folded in must be given."""
    est = _estimator(tmp_path, switch_case=True)
    result = est.compile(mlp.input_fn, validate_only=True)
    assert not any(k.tf_type in ("Case", "StatelessCase") for k in result.program.kernels)
    model = precheck(est, mlp.input_fn, ModeKeys.TRAIN)
    np.testing.assert_allclose(_computed_rates(result, model), _expected_rates(est), rtol=1e-6)


def test_a_recompiled_model_with_nested_branches_reuses_its_artifact(tmp_path):
    """TF numbers the functions of a cond/case anew each time model_fn runs: the graph hash reads their bodies
    (a tf.switch_case's list of branches too), so the same model compiles to the same artifact."""
    first = _estimator(tmp_path, switch_case=True).compile(mlp.input_fn)
    second = _estimator(tmp_path, switch_case=True).compile(mlp.input_fn)
    assert not first.reused and second.reused


def test_a_switch_case_on_a_computed_index_is_refused_naming_the_fix(tmp_path):
    def model_fn(features, labels, mode, params):
        logits = tf.compat.v1.layers.dense(features, 5, name="logits")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        step = tf.compat.v1.train.get_global_step()
        index = tf.cast(tf.minimum(step // 10, 1), tf.int32)
        rate = tf.switch_case(index, [lambda: tf.constant(0.1), lambda: tf.constant(0.01)])
        train_op = tf.compat.v1.train.GradientDescentOptimizer(rate).minimize(loss, global_step=step)
        return CSEstimatorSpec(mode, loss=loss, train_op=train_op)

    est = CerebrasEstimator(model_fn, model_dir=str(tmp_path), config=CSRunConfig(cs_ip="localhost:9000"), params={})
    with pytest.raises(UnsupportedOpError, match="StatelessCase") as refused:
        est.compile(mlp.input_fn, validate_only=True)
    assert "Write it as tf.case over predicates" in refused.value.fix
    assert refused.value.where.startswith(os.path.abspath(__file__))


def _capped_mean(values: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """A metric whose update and value are tf.conds on its own counters: the mean of the first batch only."""
    collections = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES, tf.compat.v1.GraphKeys.METRIC_VARIABLES]
    total = tf.compat.v1.Variable(0.0, trainable=False, collections=collections, name="capped_mean/total")
    count = tf.compat.v1.Variable(0.0, trainable=False, collections=collections, name="capped_mean/count")
    size = tf.cast(tf.size(values), tf.float32)
    update = tf.cond(count < 1.0, lambda: tf.group(total.assign_add(tf.reduce_sum(values)), count.assign_add(size)),
                     tf.no_op)
    value = tf.cond(count > 0.0, lambda: total / count, lambda: tf.constant(0.0))
    return value, update


def _metric_model_fn(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(features, 5, name="logits",
                                       kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    step = tf.compat.v1.train.get_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
    return EstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops={"capped_mean": _capped_mean(logits)})


def test_an_appliance_evaluation_runs_metric_ops_with_conds_with_their_branch_functions(tmp_path, float32_numerics):
    """An appliance's evaluation copies the metric ops into a graph of their own on the host: a metric's tf.cond
    needs its branch functions there too."""
    est = CerebrasEstimator(_metric_model_fn, model_dir=str(tmp_path), params={},
                            config=CSRunConfig(cs_config=ApplianceCSConfig()))
    est.train(mlp.input_fn, max_steps=2, use_cs=False)
    on_system = est.evaluate(mlp.input_fn, steps=3, use_cs=True)
    on_cpu = est.evaluate(mlp.input_fn, steps=3)
    assert set(on_system) == set(on_cpu) == {"capped_mean", "loss", "global_step"}
    for key in on_cpu:
        np.testing.assert_allclose(on_system[key], on_cpu[key], rtol=1e-5, err_msg=key)
