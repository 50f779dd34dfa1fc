"""A long training run on the simulated WSE, for test_acceptance's kill -9 test and benchmarks/kill_soak.py
(not a test module); its regression model also serves the injected-overflow test.

    python kill_train_script.py MODEL_DIR [MAX_STEPS] [--numerics float16|float32|bfloat16|cbfloat16] [--rows N]

Trains a tiny regressor (so a checkpoint every 100 steps comes often) with CerebrasEstimator
.train(use_cs=True), resuming from MODEL_DIR's latest checkpoint, until it is killed or reaches MAX_STEPS.
--numerics is the simulated WSE's half dtype (amp.set_half_dtype; default float16, "float32" computes
without rounding). --rows is the size of the data set (default 64: 8 batches): like tf.estimator, a
resumed run starts input_fn from its beginning, so a killed series is bit-identical to an uninterrupted
run only when the data repeats with a period that divides the checkpoint interval (--rows 40: 5 batches,
and 100 steps are 20 passes). The test imports model_fn and input_fn from here to evaluate and resume the
same model in its own process.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from estimator import EstimatorSpec, ModeKeys

CS_IP = "localhost:9000"
BATCH = 8
ROWS = 64


def input_fn(params):
    rng = np.random.RandomState(3)
    x = rng.randn(params.get("rows", ROWS), 4).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32) + 0.25).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH, drop_remainder=True)


def model_fn(features, labels, mode, params):
    hidden = tf.compat.v1.layers.dense(features, 8, activation=tf.nn.relu, name="hidden",
                                       kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
    predictions = tf.compat.v1.layers.dense(hidden, 1, name="output",
                                            kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions={"y": predictions})
    loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
    optimizer = tf.compat.v1.train.AdamOptimizer(params.get("learning_rate", 1e-3))
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return EstimatorSpec(mode, loss=loss, train_op=train_op, predictions={"y": predictions})


def make_estimator(model_dir: str, params: dict | None = None):
    from cerebras_tf import CerebrasEstimator, CSRunConfig

    config = CSRunConfig(cs_ip=CS_IP, save_checkpoints_steps=100, keep_checkpoint_max=3, tf_random_seed=1,
                         log_step_count_steps=1000)
    return CerebrasEstimator(model_fn, model_dir=model_dir, config=config, params=dict(params or {}))


def main(argv: list[str]) -> None:
    from cerebras_tf import amp, set_default_tf_config

    parser = argparse.ArgumentParser(prog=os.path.basename(argv[0]))
    parser.add_argument("model_dir")
    parser.add_argument("max_steps", nargs="?", type=int, default=100_000_000)
    parser.add_argument("--numerics", default="float16")
    parser.add_argument("--rows", type=int, default=ROWS)
    args = parser.parse_args(argv[1:])
    amp.set_half_dtype(args.numerics)
    set_default_tf_config()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)  # the test reads the "Restoring" line
    make_estimator(args.model_dir, {"rows": args.rows}).train(input_fn, max_steps=args.max_steps, use_cs=True)


if __name__ == "__main__":
    main(sys.argv)
