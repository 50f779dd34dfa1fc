"""Issue 11 (5, 6): nested host_calls evaluate on the simulated WSE as on CPU; model_fn summaries are written.

float32 numerics throughout, so the simulated WSE and plain TF agree to rounding.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import glob
import logging

import numpy as np
import pytest
import tensorflow as tf

from estimator import Estimator, EstimatorSpec, RunConfig
from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig, set_default_tf_config
from cerebras_tf import ir
from cerebras_tf.errors import CerebrasError, HostCallError, MultipleProblemsError
from benchmarks.summaries import read_scalars
from estimator.source import function_location

CS_IP = "localhost:9000"
BATCH = 8


@pytest.fixture(autouse=True)
def _tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    set_default_tf_config()


pytestmark = pytest.mark.usefixtures("float32_numerics")  # every test here compares with TF on CPU


def _input_fn(params):
    rng = np.random.RandomState(3)
    x = rng.randn(32, 10).astype(np.float32)
    y = (x[:, :3].sum(axis=1) > 0).astype(np.int32) + (x[:, 3] > 0.5).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH, drop_remainder=True)


def _network(features):
    """MLP 10-16-3 with seeded initializers (the same weights on both sides)."""
    hidden = tf.compat.v1.layers.dense(features, 16, activation=tf.nn.tanh, name="fc1",
                                       kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=5))
    logits = tf.compat.v1.layers.dense(hidden, 3, name="logits",
                                       kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=6))
    return hidden, logits


def _cs(model_fn, model_dir, **config):
    config.setdefault("save_checkpoints_steps", 100)
    return CerebrasEstimator(model_fn, model_dir=str(model_dir),
                             config=CSRunConfig(cs_ip=CS_IP, tf_random_seed=1, **config), params={})


# --------------------------------------------------------------------------- 5. nested host_call


def _nested_metrics(pair, nothing, named):
    """The zoo's shape of host_call fn: positional nests, a None, a dict (with a list inside)."""
    assert nothing is None and isinstance(pair, tuple) and isinstance(named, dict)
    assert isinstance(named["x"], list) and named["x"][1] is None
    logits, probabilities = pair
    return {"mean_logit": tf.compat.v1.metrics.mean(logits),
            "accuracy": tf.compat.v1.metrics.accuracy(named["y"], tf.argmax(probabilities, 1)),
            "mean_hidden": tf.compat.v1.metrics.mean(named["x"][0]),
            "mean_feature": tf.compat.v1.metrics.mean(named["features"])}


def _keyword_metrics(labels, nest):
    assert set(nest) == {"logits", "none"} and nest["none"] is None
    return {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(nest["logits"], 1)),
            "mean_label": tf.compat.v1.metrics.mean(tf.cast(labels, tf.float32))}


def _host_call_model_fn(kind):
    def model_fn(features, labels, mode, params):
        hidden, logits = _network(features)
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            loss, global_step=tf.compat.v1.train.get_global_step())
        if kind == "list":
            host_call = (_nested_metrics, [(logits, tf.nn.softmax(logits)), None,
                                           {"x": [hidden, None], "y": labels, "features": features}])
        else:
            host_call = (_keyword_metrics, {"labels": labels, "nest": {"logits": logits, "none": None}})
        return CSEstimatorSpec(mode, loss=loss, train_op=train_op, host_call=host_call)

    return model_fn


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_a_nested_host_call_evaluates_on_the_system_as_on_cpu(tmp_path, kind):
    estimator = _cs(_host_call_model_fn(kind), tmp_path)
    estimator.train(_input_fn, max_steps=5, use_cs=False)
    on_system = estimator.evaluate(_input_fn, steps=3, use_cs=True)
    on_cpu = estimator.evaluate(_input_fn, steps=3)
    assert set(on_system) == set(on_cpu)
    for name, value in on_cpu.items():
        assert on_system[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_host_call_leaves_are_program_outputs_keyed_by_path_and_inputs_stream_back(tmp_path):
    program = _cs(_host_call_model_fn("list"), tmp_path).compile(_input_fn, mode="eval").program
    assert set(program.outputs) == {"loss", "host_call/0/0", "host_call/0/1", "host_call/2/x/0", "host_call/2/y",
                                    "host_call/2/features"}
    assert program.outputs["host_call/2/y"] == program.inputs["labels"]
    assert program.outputs["host_call/2/features"] == program.inputs["features"]
    restored = ir.Program.from_json(program.to_json(), program.arrays)
    args, kwargs = ir.host_call_arguments(restored.host_call, lambda key: key)
    assert kwargs == {}
    assert args == [("host_call/0/0", "host_call/0/1"), None,
                    {"x": ["host_call/2/x/0", None], "y": "host_call/2/y", "features": "host_call/2/features"}]


def _bad_host_call_model_fn(make_host_call):
    def model_fn(features, labels, mode, params):
        _, logits = _network(features)
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        return CSEstimatorSpec(mode, loss=loss, host_call=make_host_call(labels, logits))

    return model_fn


@pytest.mark.parametrize("make_host_call, expected", [
    (lambda labels, logits: ("metrics", [labels]), "host_call's fn (its first element) is not callable: got str"),
    (lambda labels, logits: (_keyword_metrics, [labels, {"k": "abc"}]),
     "host_call/1/k in host_call's tensors must be a tensor or None, got str 'abc'"),
    (lambda labels, logits: (_keyword_metrics, {labels, logits}),
     "host_call's tensors (its second element) must be a list, tuple or dict, got a set"),
    (lambda labels, logits: (_keyword_metrics, [labels, ({logits},)]),
     "host_call/1/0 in host_call's tensors must be a tensor or None, got a set"),
])
def test_a_bad_host_call_is_refused_naming_its_path_and_model_fn(tmp_path, make_host_call, expected):
    model_fn = _bad_host_call_model_fn(make_host_call)
    estimator = _cs(model_fn, tmp_path)
    with pytest.raises(HostCallError) as refused:
        estimator.compile(_input_fn, validate_only=True, mode="eval")
    assert expected in str(refused.value)
    assert refused.value.where == function_location(model_fn)
    with pytest.raises(CerebrasError):
        estimator.evaluate(_input_fn, steps=1, use_cs=True)
    assert not glob.glob(str(tmp_path / "*"))  # refused before anything was written


def test_every_bad_leaf_is_reported_at_once(tmp_path):
    model_fn = _bad_host_call_model_fn(lambda labels, logits: (None, [labels, 1.5, {"a": [logits, "b"]}]))
    with pytest.raises(MultipleProblemsError) as refused:
        _cs(model_fn, tmp_path).compile(_input_fn, validate_only=True, mode="eval")
    text = str(refused.value)
    assert "not callable" in text and "host_call/1 " in text and "host_call/2/a/1 " in text


# --------------------------------------------------------------------------- 6. summaries


def _summary_model_fn(image=False):
    def model_fn(features, labels, mode, params):
        hidden, logits = _network(features)
        xent = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        l2 = 0.01 * tf.add_n([tf.nn.l2_loss(v) for v in tf.compat.v1.trainable_variables() if "kernel" in v.name])
        loss = xent + l2
        global_step = tf.compat.v1.train.get_global_step()
        learning_rate = tf.compat.v1.train.exponential_decay(0.2, global_step, 4, 0.5)
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
        grads_and_vars = optimizer.compute_gradients(loss)
        with tf.name_scope("train"):  # tags are folded: "train/cost_xent", ...
            tf.compat.v1.summary.scalar("cost_xent", xent)
            tf.compat.v1.summary.scalar("cost_l2", l2)
            tf.compat.v1.summary.scalar("lr", learning_rate)
            tf.compat.v1.summary.scalar("unclipped_grad_norm", tf.linalg.global_norm([g for g, _ in grads_and_vars]))
        for grad, var in grads_and_vars:
            tf.compat.v1.summary.histogram(f"gradients/{var.op.name}", grad)
        tf.compat.v1.summary.histogram("activations/hidden", hidden)
        if image:
            tf.compat.v1.summary.image("inputs", tf.reshape(features, [BATCH, 2, 5, 1]))
        train_op = optimizer.apply_gradients(grads_and_vars, global_step=global_step)
        return EstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


def _events(model_dir):
    """tag -> {step: Summary.Value} over model_dir's event files."""
    found = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                found.setdefault(value.tag, {})[event.step] = value
    return found


def _estimator_summary_steps(steps) -> bool:
    """Whether `steps` are the Estimator's summary steps for save_summary_steps=4 over 10 steps: 1, 5, 9, where
    each after the first may come one step early. TF's SummarySaverHook takes the global step it fetched in the
    same run as the train op plus one, and that read may follow the increment (nothing orders them): then its
    next summary comes a step early (seen once in CI: 1, 5, 8)."""
    steps = sorted(steps)
    return len(steps) == 3 and steps[0] == 1 and all(b - a in (3, 4) for a, b in zip(steps, steps[1:]))


def test_model_fn_summaries_are_written_like_the_estimator_at_its_summary_steps(tmp_path):
    cs_dir, cpu_dir = str(tmp_path / "cs"), str(tmp_path / "cpu")
    _cs(_summary_model_fn(), cs_dir, save_summary_steps=4, log_step_count_steps=5).train(_input_fn, max_steps=10)
    Estimator(_summary_model_fn(), model_dir=cpu_dir, config=RunConfig(
        tf_random_seed=1, save_summary_steps=4, log_step_count_steps=5)).train(_input_fn, max_steps=10)

    on_system, on_cpu = _events(cs_dir), _events(cpu_dir)
    scalars = ["train/cost_xent", "train/cost_l2", "train/lr", "train/unclipped_grad_norm"]
    histograms = ["gradients/fc1/kernel", "gradients/fc1/bias", "gradients/logits/kernel", "gradients/logits/bias",
                  "activations/hidden"]
    for tag in scalars + histograms:
        assert sorted(on_system[tag]) == [1, 5, 9], tag  # the summary saver: the first step, then every 4
        assert _estimator_summary_steps(on_cpu[tag]), (tag, sorted(on_cpu[tag]))
    for tag in scalars:
        for step in on_cpu[tag].keys() & on_system[tag].keys():
            value = on_cpu[tag][step]
            assert on_system[tag][step].simple_value == pytest.approx(value.simple_value, rel=1e-5), (tag, step)
    for tag in histograms:
        for step in on_cpu[tag].keys() & on_system[tag].keys():
            cpu, wse = on_cpu[tag][step].histo, on_system[tag][step].histo
            assert wse.num == cpu.num and list(wse.bucket_limit) == pytest.approx(list(cpu.bucket_limit), rel=1e-4)
            assert list(wse.bucket) == list(cpu.bucket), (tag, step)
            assert (wse.min, wse.max, wse.sum) == pytest.approx((cpu.min, cpu.max, cpu.sum), rel=1e-4, abs=1e-6)
    assert on_system["train/lr"][9].simple_value == pytest.approx(0.2 * 0.5 ** 2)  # the schedule at global step 8
    # "loss" stays on the log steps on the system (the Estimator puts it on its summary steps)
    assert set(read_scalars(cs_dir, "loss")) == {5, 10}
    assert set(read_scalars(cpu_dir, "loss")) == set(on_cpu["train/cost_xent"])
    if 5 in read_scalars(cpu_dir, "loss"):
        assert read_scalars(cs_dir, "loss")[5] == pytest.approx(read_scalars(cpu_dir, "loss")[5], rel=1e-5)
    assert len(glob.glob(os.path.join(cs_dir, "events.out.tfevents.*"))) == 1  # one event writer for the run
    assert {"loss_scale", "global_step/sec", "samples/sec"} <= set(on_system)


def test_a_summary_output_missing_on_a_step_is_skipped(tmp_path):
    """An overflow step runs no optimizer kernel: the gradient norm (computed after the unscaled gradients)
    is then missing from the step's outputs, and only that summary is left out."""
    from cerebras_tf.run.chief import ModelSummaries

    program = _cs(_summary_model_fn(), tmp_path).compile(_input_fn).program
    assert program.summaries["train/lr"] == "scalar" and program.summaries["activations/hidden"] == "histogram"
    outputs = {"summary/train/lr": np.float32(0.1), "summary/activations/hidden": np.ones([BATCH, 16], np.float32)}
    summary = ModelSummaries(program).summary(outputs)
    assert [v.tag for v in summary.value] == ["train/lr", "activations/hidden"]
    assert summary.value[0].simple_value == pytest.approx(0.1) and summary.value[1].histo.num == BATCH * 16


def test_an_image_summary_is_not_written_and_warned_about_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    _cs(_summary_model_fn(image=True), tmp_path, save_summary_steps=2).train(_input_fn, max_steps=6)
    warnings = [r.getMessage() for r in caplog.records if "cannot compute" in r.getMessage()]
    assert len(warnings) == 1 and "inputs (image)" in warnings[0], warnings
    found = _events(str(tmp_path))
    assert "train/lr" in found and not any(tag.startswith("inputs") for tag in found)
