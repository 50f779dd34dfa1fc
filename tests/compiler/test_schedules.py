"""Learning-rate schedules computed from global_step compile to kernels (tf.case/cond ones if-converted)."""
from __future__ import annotations

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
