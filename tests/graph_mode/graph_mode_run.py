"""The zoo-style model of tests/zoo_constructs in a script that disabled eager execution, as R1.8's run.py does.

Run as `python graph_mode_run.py WORKDIR`; prints one `OK <check>` line per check passed and exits non-zero
on the first that fails. Graph mode is process-wide, hence a script of its own. It validates, compiles,
trains on the simulated system in float32 numerics and compares every variable and summary with the same
model trained by the plain Estimator in this process; evaluates and predicts on the system against CPU;
trains a model whose tf.case holds a two-level nested tf.cond (and a constant tf.switch_case), refuses one
with a while loop there; trains with two embedded input workers; and evaluates an appliance config's model
on the system, its eval_metric_ops (with tf.conds) run on the host, as R1.8's CSX evaluation does.
"""
import glob
import json
import os
import sys

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "zoo_constructs"))

import zoo_bert_like as zoo  # noqa: E402

import cerebras_tf  # noqa: E402
from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig, EstimatorSpec, amp  # noqa: E402
from cerebras_tf.cs_config import ApplianceCSConfig  # noqa: E402
from cerebras_tf.errors import UnsupportedOpError  # noqa: E402

WORKDIR = sys.argv[1]
STEPS = 12
SUMMARY_STEPS = 4
PARAMS = {**zoo.DEFAULT_PARAMS, "loss_scaling": "tf_dynamic"}  # TF's scale: conds nested in conds
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"chief": ["localhost:2222"]}, "task": {"type": "chief", "index": 0}})


def ok(check):
    print("OK", check, flush=True)


def estimator(name, model_fn=zoo.model_fn, params=PARAMS, cs_ip="localhost:9000", **config):
    config = CSRunConfig(cs_ip=cs_ip, tf_random_seed=1, save_summary_steps=SUMMARY_STEPS,
                         save_checkpoints_steps=1000, log_step_count_steps=SUMMARY_STEPS, **config)
    return CerebrasEstimator(model_fn, model_dir=os.path.join(WORKDIR, name), config=config, params=params)


def summaries(name):
    found = {}
    for path in glob.glob(os.path.join(WORKDIR, name, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    found.setdefault(value.tag, {})[event.step] = value.simple_value
    return found


def zoo_model():
    system = estimator("system")
    assert system.compile(zoo.train_input_fn, validate_only=True) is not None
    compiled = system.compile(zoo.train_input_fn)
    assert any(key.startswith("summary/") for key in compiled.program.outputs)
    ok("validate and compile")

    amp.set_half_dtype("float32")
    system.train(zoo.train_input_fn, max_steps=STEPS)
    cpu = estimator("cpu", cs_ip=None)
    cpu.train(zoo.train_input_fn, max_steps=STEPS)
    names = set(cpu.get_variable_names())
    assert names == set(system.get_variable_names()) and "current_loss_scale" in names
    for name in sorted(names):
        np.testing.assert_allclose(system.get_variable_value(name), cpu.get_variable_value(name),
                                   rtol=2e-5, atol=2e-6, err_msg=name)
    ok("training on the system matches the Estimator")

    on_system, on_cpu = summaries("system"), summaries("cpu")
    tags = {tag for tag in on_cpu if tag.startswith("train/")}
    assert {"train/cost", "train/lr"} <= tags, tags
    for tag in sorted(tags):
        assert sorted(on_system[tag]) == sorted(on_cpu[tag]), tag
        np.testing.assert_allclose([on_system[tag][s] for s in sorted(on_cpu[tag])],
                                   [on_cpu[tag][s] for s in sorted(on_cpu[tag])], rtol=1e-4, err_msg=tag)
    ok("summaries")

    cerebras_tf.release_system()
    steps = PARAMS["num_examples"] // PARAMS["batch_size"]
    on_wafer = system.evaluate(zoo.eval_input_fn, steps=steps, use_cs=True)
    on_host = system.evaluate(zoo.eval_input_fn, use_cs=False)
    assert set(on_wafer) == set(on_host) and on_wafer["global_step"] == STEPS
    for key in on_host:
        np.testing.assert_allclose(on_wafer[key], on_host[key], rtol=1e-5, err_msg=key)
    ok("evaluate with host_call")
    cerebras_tf.release_system()


def regression_input_fn(params):
    x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(({"x": x}, x @ np.ones((4, 1), np.float32)))
    return (dataset.repeat() if params.get("repeat", True) else dataset).batch(4, drop_remainder=True)


def nested_rate(step, loop=False):
    """A tf.case over global_step whose default holds a tf.cond two levels deep, the innermost choice a
    tf.switch_case on a constant index (or, with `loop`, a tf.while_loop, which the CS system refuses)."""
    def innermost():
        if loop:
            return tf.while_loop(lambda i, r: i < 2, lambda i, r: (i + 1, r * 0.5), (0, 0.08))[1]
        return tf.switch_case(tf.constant(1), [lambda: tf.constant(0.5), lambda: tf.constant(0.01)])

    return tf.case([(step < 2, lambda: tf.constant(0.05))],
                   default=lambda: tf.cond(step < 4, lambda: tf.cond(step < 3, lambda: 0.03, lambda: 0.02),
                                           innermost))


def nested_cond_model_fn(features, labels, mode, params):
    prediction = tf.compat.v1.layers.dense(features["x"], 1, name="dense",
                                           kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=7))
    if mode == "infer":
        return EstimatorSpec(mode, predictions={"y": prediction})
    loss = tf.reduce_mean(tf.square(prediction - labels))
    step = tf.compat.v1.train.get_or_create_global_step()
    rate = nested_rate(step, loop=params.get("loop", False))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(rate).minimize(loss, global_step=step)
    metrics = {"first_batch_mean": first_batch_mean(prediction)} if params.get("metric") else None
    return EstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


def first_batch_mean(values):
    """A metric whose update and value are tf.conds over its own counters (as a hand-written zoo metric may be)."""
    collections = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES, tf.compat.v1.GraphKeys.METRIC_VARIABLES]
    total = tf.compat.v1.Variable(0.0, trainable=False, collections=collections, name="first_batch_mean/total")
    count = tf.compat.v1.Variable(0.0, trainable=False, collections=collections, name="first_batch_mean/count")
    update = tf.cond(count < 1.0, lambda: tf.group(total.assign_add(tf.reduce_sum(values)),
                                                   count.assign_add(tf.cast(tf.size(values), tf.float32))), tf.no_op)
    return tf.cond(count > 0.0, lambda: total / count, lambda: tf.constant(0.0)), update


def replacing_model_fn(features, labels, mode, params):
    """As the Model Zoo's BERT does in EVAL: a features entry replaced in place, the dict handed to host_call."""
    spec = nested_cond_model_fn(features, labels, mode, params)  # reads the input x
    if mode != "eval":
        return spec
    features["x"] = tf.cast(features["x"], tf.float16)
    return CSEstimatorSpec(mode, loss=spec.loss, host_call=(
        lambda features: {"x_mean": tf.compat.v1.metrics.mean(tf.cast(features["x"], tf.float32))}, [features]))


def a_replaced_features_entry():
    system = estimator("replaced", replacing_model_fn, params={})
    system.train(regression_input_fn, max_steps=2, use_cs=False)
    metrics = system.evaluate(lambda params: regression_input_fn({"repeat": False}), steps=2, use_cs=True)
    x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)[:8]
    np.testing.assert_allclose(metrics["x_mean"], x.astype(np.float16).astype(np.float32).mean(), rtol=1e-5)
    ok("a features entry replaced by model_fn")
    cerebras_tf.release_system()


def nested_conds_and_workers():
    system = estimator("nested", nested_cond_model_fn, params={})
    cpu = estimator("nested_cpu", nested_cond_model_fn, params={}, cs_ip=None)
    for max_steps in (3, 6):  # the second call resumes from the checkpoint (and restarts input_fn), on both
        system.train(regression_input_fn, max_steps=max_steps)
        cpu.train(regression_input_fn, max_steps=max_steps)
    assert system.get_variable_value("global_step") == 6
    for name in ("dense/kernel", "dense/bias"):  # float32 numerics
        np.testing.assert_allclose(system.get_variable_value(name), cpu.get_variable_value(name), rtol=1e-5)
    ok("nested conds")
    looping = estimator("looping", nested_cond_model_fn, params={"loop": True})
    try:
        looping.compile(regression_input_fn, validate_only=True)
    except UnsupportedOpError as error:
        assert "a tf.while_loop inside a branch of a tf.cond/tf.case cannot be compiled" in str(error), error
        assert error.where.startswith(os.path.abspath(__file__)), error.where
    else:
        raise AssertionError("a while loop inside nested conds compiled")
    ok("a while loop in a nested branch is refused")
    cerebras_tf.release_system()
    workers = estimator("workers", nested_cond_model_fn, params={}, num_input_workers=2)
    workers.train(regression_input_fn, max_steps=6)  # two in-process input workers (no network)
    assert workers.get_variable_value("global_step") == 6
    ok("two input workers")
    cerebras_tf.release_system()
    predictions = list(system.predict(lambda params: regression_input_fn({"repeat": False}), use_cs=True))
    expected = list(system.predict(lambda params: regression_input_fn({"repeat": False})))
    assert len(predictions) == len(expected) == 32
    np.testing.assert_allclose([p["y"] for p in predictions], [p["y"] for p in expected], rtol=1e-5)
    assert not tf.executing_eagerly()  # the script's mode is untouched
    ok("predict")
    cerebras_tf.release_system()


def an_appliance_evaluation():
    """R1.8's CSX evaluation: an appliance config, the model's eval_metric_ops (with conds) run on the host."""
    config = CSRunConfig(cs_config=ApplianceCSConfig(), tf_random_seed=1, save_checkpoints_steps=1000)
    system = CerebrasEstimator(nested_cond_model_fn, model_dir=os.path.join(WORKDIR, "appliance"), config=config,
                               params={"metric": True})
    system.train(regression_input_fn, max_steps=2, use_cs=False)
    once = lambda params: regression_input_fn({"repeat": False})  # noqa: E731
    on_system, on_cpu = system.evaluate(once, steps=3, use_cs=True), system.evaluate(once, steps=3)
    assert set(on_system) == set(on_cpu) == {"first_batch_mean", "loss", "global_step"}, on_system
    for key in on_cpu:
        np.testing.assert_allclose(on_system[key], on_cpu[key], rtol=1e-5, err_msg=key)
    ok("an appliance evaluation with eval_metric_ops")
    cerebras_tf.release_system()


zoo_model()
nested_conds_and_workers()
a_replaced_features_entry()
an_appliance_evaluation()
