"""Acceptance tests of the simulated WSE (issue 4), through the public API only.

CerebrasEstimator / CSRunConfig / cerebras_tf.amp, checked against plain Estimator on CPU:

- float32 numerics (`amp.set_half_dtype("float32")`): a whole 50-step Adam run of an MLP matches the
  Estimator step by step (loss sequence, final weights and optimizer slots);
- float16 numerics (the default): the zoo MLP and CNN still converge;
- an injected overflow is skipped (no weight or slot moves, global_step does, the scale halves) and
  training recovers;
- a run killed with SIGKILL at random moments leaves a loadable latest checkpoint that plain TF evaluates
  and that training resumes from, ending bit for bit where an uninterrupted run ends;
- plain Estimator.predict and export_saved_model serve the weights the simulated WSE trained.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.summaries import read_scalars as scalars
from estimator import Estimator, EstimatorSpec
import cerebras_tf
import estimator as estimator_api
from cerebras_tf import CerebrasEstimator, CSRunConfig, amp, set_default_tf_config

CS_IP = "localhost:9000"


def _release() -> None:
    getattr(cerebras_tf, "release_system", lambda *a: None)()


@pytest.fixture(autouse=True)
def _tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    set_default_tf_config()


def _numerics(half_dtype: str):
    """The simulated WSE computes with `half_dtype` for the test; the previous dtype again afterwards."""
    previous = amp.get_half_dtype()
    amp.set_half_dtype(half_dtype)
    try:
        yield
    finally:
        amp.set_half_dtype(previous)
        _release()


@pytest.fixture
def float16_numerics():
    yield from _numerics("float16")


# --------------------------------------------------------------------------- helpers


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
    return estimator_api.Estimator(model_fn, model_dir=str(model_dir), config=estimator_api.RunConfig(**config),
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
    return EstimatorSpec(mode, loss=loss, train_op=train_op)


@pytest.mark.parametrize("host_kernels", ["auto", "numpy", "tensorflow"])
def test_float32_numerics_match_the_cpu_estimator_step_by_step_for_50_adam_steps(tmp_path, float32_numerics,
                                                                                 host_kernels, monkeypatch):
    monkeypatch.setenv("CEREBRAS_TF_HOST_KERNELS", host_kernels)  # the run's provider (host_kernels_tf.py)
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
    loss_scale_state = {"amp/loss_scale", "amp/steps_since_rescale", "amp/overflows_since_rescale"}
    assert set(cs_final) == set(cpu_final) | loss_scale_state  # the executor's dynamic scale is checkpointed too
    assert {"fc1/kernel", "fc1/kernel/Adam", "fc1/kernel/Adam_1", "beta1_power", "beta2_power"} <= set(cs_final)
    for name, value in cpu_final.items():
        np.testing.assert_allclose(cs_final[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


# --------------------------------------------------------------------------- 2. float16 convergence

CONVERGENCE_STEPS = 300
# The zoo CNN's defaults (batch 4, learning rate 0.05) train erratically even in float32 (final loss 0.01-0.75
# over runs); batch 8 at 0.02 trains steadily, so a float16 problem is not lost in that noise.
CONVERGENCE_PARAMS = {"cnn": {"batch_size": 8, "learning_rate": 0.02}}


def _loss_on_cpu(model_fn, input_fn, model_dir, params) -> float:
    """The loss of model_dir's latest checkpoint, evaluated by the same script on CPU (no cs_ip)."""
    return CerebrasEstimator(model_fn, model_dir=str(model_dir), params=dict(params)).evaluate(
        input_fn, steps=8)["loss"]


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_float16_numerics_still_converge(tmp_path, float16_numerics, name):
    """From the same starting weights (the zoo's initializers are unseeded, so both runs warm-start from
    one checkpoint), 300 steps in float16 on the simulated WSE get about as far as float32 on CPU."""
    from examples.zoo import MODELS

    zoo = MODELS[name]
    params = {**zoo.DEFAULT_PARAMS, **CONVERGENCE_PARAMS.get(name, {})}
    start = tmp_path / "start"
    cpu_estimator(zoo.model_fn, start, params).train(zoo.input_fn, max_steps=1)
    start_loss = _loss_on_cpu(zoo.model_fn, zoo.input_fn, start, params)

    CerebrasEstimator(zoo.model_fn, model_dir=str(tmp_path / "cs"), params=params, warm_start_from=str(start),
                      config=CSRunConfig(cs_ip=CS_IP, log_step_count_steps=50)).train(
        zoo.input_fn, max_steps=CONVERGENCE_STEPS, use_cs=True)
    estimator_api.Estimator(zoo.model_fn, model_dir=str(tmp_path / "cpu"), params=params,
                            warm_start_from=str(start)).train(zoo.input_fn, max_steps=CONVERGENCE_STEPS)

    cs_loss = _loss_on_cpu(zoo.model_fn, zoo.input_fn, tmp_path / "cs", params)
    cpu_loss = _loss_on_cpu(zoo.model_fn, zoo.input_fn, tmp_path / "cpu", params)
    # Observed over 20 runs: MLP 0.09-0.26 (start ~1.6), within 5% of CPU; CNN 0.03-0.09 (start ~1.1), within
    # 20% of CPU. A float16 run that does not train stays near the start loss.
    assert cs_loss < 0.3 * start_loss, (cs_loss, start_loss)
    assert cs_loss < 1.5 * cpu_loss + 0.05, (cs_loss, cpu_loss)
    cs_losses = scalars(str(tmp_path / "cs"), "loss")
    assert sorted(cs_losses) == list(range(50, CONVERGENCE_STEPS + 1, 50))
    assert all(np.isfinite(loss) for loss in cs_losses.values())


# --------------------------------------------------------------------------- 3. injected overflow

def _regression_input_fn(overflow_first: bool):
    """kill_train_script's batches; with overflow_first, first a batch whose features are 6e4 (float16 max 65504),
    so its activations and gradients overflow in float16."""
    import kill_train_script as script

    def input_fn(params):
        normal = script.input_fn(params)
        if not overflow_first:
            return normal
        huge = tf.data.Dataset.from_tensors((np.full((script.BATCH, 4), 6e4, np.float32),
                                             np.full((script.BATCH, 1), 6e4, np.float32)))
        return huge.concatenate(normal)
    return input_fn


def test_an_injected_overflow_is_skipped_and_training_recovers(tmp_path, float16_numerics):
    model_dir = str(tmp_path)
    import kill_train_script as script

    estimator = cs_estimator(script.model_fn, model_dir, {"learning_rate": 1e-2}, log_step_count_steps=1,
                             keep_checkpoint_max=10)
    estimator.train(_regression_input_fn(False), max_steps=5, use_cs=True)
    estimator.train(_regression_input_fn(True), max_steps=6, use_cs=True)  # step 6 is the overflowing batch

    at_5, at_6 = checkpoint_values(os.path.join(model_dir, "model.ckpt-5")), checkpoint_values(
        os.path.join(model_dir, "model.ckpt-6"))
    assert (at_5.pop("global_step"), at_6.pop("global_step")) == (5, 6)  # global_step advances...
    assert at_6.pop("amp/loss_scale") == at_5.pop("amp/loss_scale") / 2  # ...the checkpointed scale halves...
    at_5.pop("amp/steps_since_rescale"), at_6.pop("amp/steps_since_rescale")
    assert {"hidden/kernel/Adam", "beta1_power"} <= set(at_5)
    for name, value in at_5.items():  # ...and nothing else moves: weights, Adam slots and beta powers
        np.testing.assert_array_equal(at_6[name], value, err_msg=name)
    assert not np.isfinite(scalars(model_dir, "loss")[6])

    estimator.train(_regression_input_fn(True), max_steps=40, use_cs=True)  # overflow at step 7, then recovery
    scales, losses = scalars(model_dir, "loss_scale"), scalars(model_dir, "loss")
    assert scales[7] == checkpoint_values(os.path.join(model_dir, "model.ckpt-6"))["amp/loss_scale"]  # resumed
    assert scales[8] == scales[7] / 2  # halved after the overflow
    assert all(np.isfinite(losses[step]) for step in range(8, 41))
    assert losses[40] < 0.5 * losses[1]
    at_40 = checkpoint_values(model_dir)
    assert not np.array_equal(at_40["hidden/kernel"], at_6["hidden/kernel"])


# --------------------------------------------------------------------------- 4. kill -9 and resume

def test_a_run_killed_at_random_moments_leaves_a_loadable_checkpoint_and_resumes_from_it(tmp_path):
    """Three SIGKILLs at random moments (maybe mid-save), each run resuming from the latest checkpoint; then the
    series, resumed once more to a fixed step, ends bit for bit where an uninterrupted run ends (every variable,
    Adam slots, global_step and the loss-scale state). The data (--rows 40) repeats every 5 batches, a divisor
    of the checkpoint interval: a resumed run's input_fn starts over, as in tf.estimator. The soak with 10
    kills, most of them mid-save, in float16 and float32: python -m benchmarks.kill_soak."""
    import glob
    import subprocess
    import sys
    import time

    import kill_train_script as script

    from cerebras_tf.run.trainer_lock import LOCK_FILE

    model_dir, reference_dir = str(tmp_path / "killed"), str(tmp_path / "uninterrupted")
    script_path = os.path.join(os.path.dirname(__file__), "kill_train_script.py")

    def command(directory, *max_steps):
        return [sys.executable, script_path, directory, *map(str, max_steps), "--rows", "40"]

    rng = np.random.RandomState(0)
    steps_seen = []
    for attempt in range(3):
        log_path = tmp_path / f"run{attempt}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(command(model_dir), stdout=log, stderr=subprocess.STDOUT)
            try:
                before = tf.train.latest_checkpoint(model_dir)
                deadline = time.monotonic() + 120
                while tf.train.latest_checkpoint(model_dir) == before and time.monotonic() < deadline:
                    assert proc.poll() is None, log_path.read_text()
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.0, 1.5))  # somewhere in the next checkpoints, maybe mid-write
            finally:
                proc.kill()
                proc.wait(timeout=30)
        latest = tf.train.latest_checkpoint(model_dir)
        step = int(tf.train.load_checkpoint(latest).get_tensor("global_step"))
        assert latest.endswith(f"model.ckpt-{step}")
        steps_seen.append(step)
        if attempt:
            assert f"Restoring the simulated WSE's weights from {os.path.join(model_dir, 'model.ckpt-')}" \
                in log_path.read_text()
        # Plain TF on CPU loads it.
        plain = Estimator(script.model_fn, model_dir=model_dir, params={})
        assert plain.evaluate(script.input_fn, steps=2)["global_step"] == step
    assert steps_seen == sorted(steps_seen) and steps_seen[-1] > steps_seen[0]  # each run resumed and went on

    # Resumed once more to a fixed step, beside an uninterrupted run to that step (both at once: two processes).
    last = steps_seen[-1] + 100
    logs = [tmp_path / "final.log", tmp_path / "uninterrupted.log"]
    runs = []
    for directory, log_path in zip((model_dir, reference_dir), logs):
        with open(log_path, "w") as log:
            runs.append(subprocess.Popen(command(directory, last), stdout=log, stderr=subprocess.STDOUT))
    for proc, log_path in zip(runs, logs):
        assert proc.wait(timeout=300) == 0, log_path.read_text()
    assert "Taking over the trainer lock" in logs[0].read_text()
    resumed, uninterrupted = checkpoint_values(model_dir), checkpoint_values(reference_dir)
    assert resumed["global_step"] == last
    assert {"amp/loss_scale", "amp/steps_since_rescale", "hidden/kernel/Adam", "beta1_power"} <= set(resumed)
    assert sorted(resumed) == sorted(uninterrupted)
    for name, value in uninterrupted.items():
        assert resumed[name].dtype == value.dtype, name
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)
    assert not glob.glob(os.path.join(model_dir, "*.tempstate*"))
    assert not os.path.exists(os.path.join(model_dir, LOCK_FILE))


# --------------------------------------------------------------------------- 5. plain TF reads the checkpoint

def test_plain_estimator_predict_and_export_saved_model_read_the_checkpoint(tmp_path):
    import kill_train_script as script

    model_dir = str(tmp_path / "model")
    cs_estimator(script.model_fn, model_dir, {"learning_rate": 1e-2}).train(script.input_fn, max_steps=30)
    weights = checkpoint_values(model_dir)
    assert weights["global_step"] == 30
    x = np.random.RandomState(5).randn(6, 4).astype(np.float32)
    hidden = np.maximum(x @ weights["hidden/kernel"] + weights["hidden/bias"], 0)
    expected = hidden @ weights["output/kernel"] + weights["output/bias"]

    plain = Estimator(script.model_fn, model_dir=model_dir, params={})
    predicted = np.stack([p["y"] for p in plain.predict(lambda: tf.data.Dataset.from_tensor_slices(x).batch(3))])
    np.testing.assert_allclose(predicted, expected, rtol=1e-5, atol=1e-6)

    def serving_input_receiver_fn():
        features = tf.compat.v1.placeholder(tf.float32, [None, 4], name="features")
        return estimator_api.export.TensorServingInputReceiver(features, {"features": features})

    export_dir = plain.export_saved_model(str(tmp_path / "export"), serving_input_receiver_fn)
    served = tf.saved_model.load(export_dir).signatures["serving_default"](features=tf.constant(x))
    np.testing.assert_allclose(served["y"].numpy(), expected, rtol=1e-5, atol=1e-6)
