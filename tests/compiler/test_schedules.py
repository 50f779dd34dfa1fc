"""Learning-rate schedules computed from global_step compile to kernels (tf.case/cond ones if-converted)."""
from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig
from examples.zoo import mlp

SCHEDULES = {
    "exponential_staircase": lambda s: tf.compat.v1.train.exponential_decay(0.1, s, 10, 0.5, staircase=True),
    "polynomial_cycle": lambda s: tf.compat.v1.train.polynomial_decay(0.1, s, 10, cycle=True),
    "cosine": lambda s: tf.compat.v1.train.cosine_decay(0.1, s, 100),
    "cosine_restarts": lambda s: tf.compat.v1.train.cosine_decay_restarts(0.1, s, 100),
    "natural_exp": lambda s: tf.compat.v1.train.natural_exp_decay(0.1, s, 10, 0.5),
    "inverse_time": lambda s: tf.compat.v1.train.inverse_time_decay(0.1, s, 10, 0.5),
    "piecewise_constant": lambda s: tf.compat.v1.train.piecewise_constant(s, [10, 20, 30], [0.4, 0.3, 0.2, 0.1]),
}


def _model_fn(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(features, 5, name="logits")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    step = tf.compat.v1.train.get_global_step()
    variables = tf.compat.v1.trainable_variables()
    grads = [tf.clip_by_norm(g, 1.0) for g in tf.gradients(loss, variables)]
    optimizer = tf.compat.v1.train.MomentumOptimizer(SCHEDULES[params["schedule"]](step), 0.9, use_nesterov=True)
    return CSEstimatorSpec(mode, loss=loss, train_op=optimizer.apply_gradients(zip(grads, variables), step))


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_schedule_compiles_from_global_step(tmp_path, schedule):
    est = CerebrasEstimator(_model_fn, model_dir=str(tmp_path), params={"schedule": schedule},
                            config=CSRunConfig(cs_ip="localhost:9000"))
    program = est.compile(mlp.input_fn, validate_only=True).program
    reads = [k for k in program.kernels if k.kind == "read_variable" and k.vars == ["global_step"]]
    assert reads and all(k.role == "forward" for k in reads)  # the schedule is computed each step
    momentum = [k for k in program.kernels if k.kind == "apply_momentum"]
    assert len(momentum) == 2 and all(k.attrs["use_nesterov"] for k in momentum)


# ---- the Model Zoo's construct: tf.case over schedules whose branches read global_step ------------------------
SCHEDULE_STEPS = (0, 4, 9, 10, 17, 29, 30, 55, 71)


def _zoo_style_schedule(step):
    """Warm-up, then exponential decay, then cosine decay: a tf.case whose branches read global_step
    themselves (each schedule runs on global_step minus its start), as the zoo's Trainer builds it."""
    def warmup():
        return tf.compat.v1.train.polynomial_decay(0.0, step, 10, end_learning_rate=0.1)

    def decay():
        return tf.compat.v1.train.exponential_decay(0.1, step - 10, 5, 0.5)

    def cosine():
        return tf.compat.v1.train.cosine_decay(0.025, step - 30, 50)

    return tf.case([(tf.less(step, 10), warmup), (tf.less(step, 30), decay)], default=cosine)


def _case_model_fn(features, labels, mode, params):
    logits = tf.compat.v1.layers.dense(features, 5, name="logits")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    step = tf.compat.v1.train.get_global_step()
    learning_rate = _zoo_style_schedule(step)
    train_op = tf.compat.v1.train.MomentumOptimizer(learning_rate, 0.9).minimize(loss, global_step=step)
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op, host_call=(lambda lr: {}, [learning_rate]))


def test_zoo_style_case_schedule_reading_global_step_matches_tensorflow(tmp_path):
    from cerebras_tf.compiler import initial
    from cerebras_tf.precheck import precheck
    from cerebras_tf.wse.executor import Executor
    from estimator import ModeKeys

    est = CerebrasEstimator(_case_model_fn, model_dir=str(tmp_path), config=CSRunConfig(cs_ip="localhost:9000"))
    model = precheck(est, mlp.input_fn, ModeKeys.TRAIN)
    result = est.compile(mlp.input_fn, validate_only=True)
    program = result.program
    assert int(re.search(r"tf.cond if-converted: (\d+)", result.report).group(1)) >= 2  # the case's two conds
    branch_reads = [k for k in program.kernels if k.kind == "read_variable" and k.vars == ["global_step"]
                    and k.tf_name.startswith("case/")]
    assert branch_reads and all(k.role == "forward" for k in branch_reads)
    assert not any(k.guard is not None for k in program.kernels)  # read-only branches: nothing to guard
    assert not program.model_loss_scaling

    learning_rate = model.spec.host_call[1][0]
    batch = next(iter(mlp.input_fn({}).as_numpy_iterator()))
    start = initial.initial_values(model, program)
    with model.graph.as_default(), tf.compat.v1.Session(graph=model.graph) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        global_step = tf.compat.v1.train.get_global_step()
        expected = []
        for step in SCHEDULE_STEPS:
            global_step.load(step, session)
            expected.append(session.run(learning_rate))
    computed = [float(Executor(program, {**start, "global_step": np.int64(step)}).step(*batch)
                      .outputs["host_call/0"]) for step in SCHEDULE_STEPS]
    np.testing.assert_allclose(computed, expected, rtol=1e-6)
    assert len(set(np.round(expected, 6))) == len(SCHEDULE_STEPS)  # every schedule is exercised
