"""Acceptance tests of the simulated WSE (issue 4), through the public API only.

CerebrasEstimator / CSRunConfig / cerebras_tf.amp, checked against plain tf.estimator.Estimator on CPU:

- float32 numerics (`amp.set_half_dtype("float32")`): a whole 50-step Adam run of an MLP matches the
  Estimator step by step (loss sequence, final weights and optimizer slots);
- float16 numerics (the default): the zoo MLP and CNN still converge;
- an injected overflow is skipped (no weight or slot moves, global_step does, the scale halves) and
  training recovers;
- a run killed with SIGKILL at random moments leaves a loadable latest checkpoint that plain TF evaluates
  and that training resumes from.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import glob

import numpy as np
import pytest
import tensorflow as tf

import cerebras_tf
from cerebras_tf import CerebrasEstimator, CSRunConfig, amp, set_default_tf_config

CS_IP = "localhost:9000"


def _release() -> None:
    getattr(cerebras_tf, "release_system", lambda *a: None)()


@pytest.fixture(autouse=True)
def _tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    set_default_tf_config()


@pytest.fixture
def float32_numerics():
    """The simulated WSE computes in float32 (no half rounding) for the test; float16 again afterwards."""
    previous = amp.get_half_dtype()
    amp.set_half_dtype("float32")
    try:
        yield
    finally:
        amp.set_half_dtype(previous)
        _release()


@pytest.fixture
def float16_numerics():
    previous = amp.get_half_dtype()
    amp.set_half_dtype("float16")
    try:
        yield
    finally:
        amp.set_half_dtype(previous)
        _release()


# --------------------------------------------------------------------------- helpers


def scalars(model_dir: str, tag: str) -> dict[int, float]:
    """step -> value of the scalar summary `tag` in model_dir's event files (TF1 simple_value or TF2 tensor)."""
    found: dict[int, float] = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag != tag:
                    continue
                if value.HasField("tensor"):
                    found[event.step] = float(tf.make_ndarray(value.tensor))
                else:
                    found[event.step] = float(value.simple_value)
    return found


def checkpoint_values(path: str) -> dict[str, np.ndarray]:
    """Every variable of a checkpoint (a path or a model_dir: its latest)."""
    if os.path.isdir(path):
        path = tf.train.latest_checkpoint(path)
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def cs_estimator(model_fn, model_dir, params=None, **config):
    config.setdefault("save_checkpoints_steps", 100)
    config.setdefault("tf_random_seed", 1)
    return CerebrasEstimator(model_fn, model_dir=str(model_dir), config=CSRunConfig(cs_ip=CS_IP, **config),
                             params=dict(params or {}))


def cpu_estimator(model_fn, model_dir, params=None, **config):
    config.setdefault("tf_random_seed", 1)
    return tf.estimator.Estimator(model_fn, model_dir=str(model_dir), config=tf.estimator.RunConfig(**config),
                                  params=dict(params or {}))


# --------------------------------------------------------------------------- 1. float32 parity

PARITY_STEPS = 50
PARITY_BATCH = 16


def _parity_input_fn(params):
    """64 fixed examples, unshuffled, repeating: both sides see the same batches in the same order."""
    rng = np.random.RandomState(7)
    x = rng.randn(64, 10).astype(np.float32)
    y = ((x[:, :3].sum(axis=1) > 0).astype(np.int32) + (x[:, 3] > 0.5).astype(np.int32))
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(PARITY_BATCH, drop_remainder=True)


def _parity_model_fn(features, labels, mode, params):
    """MLP 10-32-16-3 with seeded initializers (reproducible on both sides), softmax cross entropy, Adam."""
    hidden = features
    for i, (units, activation) in enumerate([(32, tf.nn.relu), (16, tf.nn.tanh)]):
        hidden = tf.compat.v1.layers.dense(
            hidden, units, activation=activation, name=f"fc{i + 1}",
            kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=11 + i),
            bias_initializer=tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=21 + i))
    logits = tf.compat.v1.layers.dense(hidden, 3, name="logits",
                                       kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=13))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_float32_numerics_match_the_cpu_estimator_step_by_step_for_50_adam_steps(tmp_path, float32_numerics):
    cs_dir, cpu_dir = str(tmp_path / "cs"), str(tmp_path / "cpu")
    cs_estimator(_parity_model_fn, cs_dir, log_step_count_steps=1).train(
        _parity_input_fn, max_steps=PARITY_STEPS, use_cs=True)
    cpu_estimator(_parity_model_fn, cpu_dir, save_summary_steps=1, log_step_count_steps=1).train(
        _parity_input_fn, max_steps=PARITY_STEPS)

    cs_losses, cpu_losses = scalars(cs_dir, "loss"), scalars(cpu_dir, "loss")
    steps = list(range(1, PARITY_STEPS + 1))
    assert sorted(cs_losses) == steps
    assert sorted(cpu_losses) == steps
    cs_seq, cpu_seq = [cs_losses[s] for s in steps], [cpu_losses[s] for s in steps]
    np.testing.assert_allclose(cs_seq, cpu_seq, rtol=1e-5, err_msg="loss per step, simulated WSE vs CPU")
    assert cpu_seq[-1] < 0.8 * cpu_seq[0]  # it is a training run, not 50 copies of one number

    # float32 never overflows here: the dynamic loss scale stays at its initial value, no step is skipped.
    assert set(scalars(cs_dir, "loss_scale").values()) == {2.0 ** 15}

    cs_final, cpu_final = checkpoint_values(cs_dir), checkpoint_values(cpu_dir)
    assert tf.train.latest_checkpoint(cs_dir).endswith(f"model.ckpt-{PARITY_STEPS}")
    assert set(cs_final) == set(cpu_final)
    assert {"fc1/kernel", "fc1/kernel/Adam", "fc1/kernel/Adam_1", "beta1_power", "beta2_power"} <= set(cs_final)
    for name, value in cpu_final.items():
        np.testing.assert_allclose(cs_final[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
