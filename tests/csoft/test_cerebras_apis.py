"""The Cerebras APIs the Model Zoo R1.7/R1.8 imports, with real behaviour (issue 22, item 4): the layer helpers
boundary_cast / summary_layer / summarize_tensor, cs1_enable/disable_summaries, the host_call helpers and the
CheckpointReader, on the simulated system and on CPU, checked against TensorFlow on the same inputs."""
from __future__ import annotations

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

import cerebras_tf
from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig, amp
from cerebras_tf.csoft.checkpoint_reader import CheckpointReader
from cerebras_tf.csoft.host_call import host_call_to_eval_metric_ops, validate_host_call
from cerebras_tf.csoft.summary import cs1_disable_summaries, cs1_enable_summaries
from cerebras_tf.errors import HostCallError
from cerebras_tf.tf_helper import boundary_cast, summarize_tensor, summary_layer
from estimator import Estimator, EstimatorSpec, ModeKeys

X = np.random.default_rng(3).normal(size=(8, 3)).astype(np.float32)
C = 1.2345678  # not a float16 value: the gradient through a boundary cast is rounded
CS_IP = "localhost:9000"


def _input_fn(params):
    dataset = tf.data.Dataset.from_tensor_slices((X, X[:, :1]))
    return (dataset.repeat() if params.get("repeat", True) else dataset).batch(4, drop_remainder=True)


def _cast_model_fn(features, labels, mode, params):
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
    scaled = boundary_cast(features * w * 1.2345 + 0.1)
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions={"y": scaled})
    loss = tf.reduce_sum(scaled * C)
    step = tf.compat.v1.train.get_or_create_global_step()
    return EstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train.GradientDescentOptimizer(1.0).minimize(
        loss, global_step=step))


def _estimator(model_dir, model_fn, cs_ip=CS_IP, **config) -> CerebrasEstimator:
    return CerebrasEstimator(model_fn, model_dir=str(model_dir), params={},
                             config=CSRunConfig(cs_ip=cs_ip, tf_random_seed=1, **config))


def _predict(estimator, use_cs) -> np.ndarray:
    return np.stack([p["y"] for p in estimator.predict(lambda params: _input_fn({"repeat": False}), use_cs=use_cs)])


def test_boundary_cast_rounds_to_half_on_the_system_and_is_the_identity_in_float32(tmp_path, tf_config):
    estimator = _estimator(tmp_path, _cast_model_fn)
    estimator.train(_input_fn, max_steps=1, use_cs=False)  # a checkpoint to predict from
    w = estimator.get_variable_value("w")
    plain = X * w * 1.2345 + 0.1
    expected_half = tf.cast(tf.cast(tf.constant(X) * w * 1.2345 + 0.1, tf.float16), tf.float32).numpy()
    np.testing.assert_array_equal(_predict(estimator, use_cs=True), expected_half)  # float16 numerics
    assert not np.array_equal(expected_half, plain)
    cerebras_tf.release_system()
    np.testing.assert_allclose(_predict(estimator, use_cs=False), plain, rtol=1e-6)  # CPU: the identity
    previous = amp.get_half_dtype()
    amp.set_half_dtype("float32")
    try:
        np.testing.assert_allclose(_predict(estimator, use_cs=True), plain, rtol=1e-6)
    finally:
        amp.set_half_dtype(previous)
        cerebras_tf.release_system()


def test_the_gradient_through_a_boundary_cast_is_rounded_as_a_casts_gradient(tmp_path, tf_config):
    estimator = _estimator(tmp_path, _cast_model_fn)
    estimator.train(_input_fn, max_steps=1)  # float16 numerics, loss scaling
    w = tf.Variable(tf.ones([3]))
    with tf.GradientTape() as tape:
        rounded = tf.cast(tf.cast(tf.constant(X[:4]) * w * 1.2345 + 0.1, tf.float16), tf.float32)
        loss = tf.reduce_sum(rounded * C)
    expected = 1.0 - tape.gradient(loss, w).numpy()  # one SGD step, learning rate 1
    np.testing.assert_allclose(estimator.get_variable_value("w"), expected, rtol=1e-6)


def _summary_model_fn(features, labels, mode, params):
    hidden = summary_layer(tf.compat.v1.layers.dense(
        features, 4, name="hidden", kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=1)))
    output = tf.compat.v1.layers.dense(hidden, 1, name="out",
                                       kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
    summarize_tensor(output)
    loss = tf.reduce_mean(tf.square(output - labels))
    step = tf.compat.v1.train.get_or_create_global_step()
    return EstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=step))


def _histograms(model_dir) -> dict[str, dict[int, tuple[float, float]]]:
    """tag -> {step: (num, sum)} of the histograms in model_dir's event files."""
    found: dict[str, dict[int, tuple[float, float]]] = {}
    for path in glob.glob(os.path.join(str(model_dir), "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.HasField("histo"):
                    found.setdefault(value.tag, {})[event.step] = (value.histo.num, value.histo.sum)
    return found


def test_summary_layer_writes_the_same_histograms_on_the_system_as_on_cpu(tmp_path, tf_config, float32_numerics):
    for name, cs_ip in (("system", CS_IP), ("cpu", None)):
        _estimator(tmp_path / name, _summary_model_fn, cs_ip, save_summary_steps=2).train(_input_fn, max_steps=4)
    on_system, on_cpu = _histograms(tmp_path / "system"), _histograms(tmp_path / "cpu")
    assert {"hidden/BiasAdd/activation", "hidden/BiasAdd/gradient", "out/BiasAdd"} <= set(on_cpu), set(on_cpu)
    for tag in ("hidden/BiasAdd/activation", "hidden/BiasAdd/gradient", "out/BiasAdd"):
        assert sorted(on_system[tag]) == sorted(on_cpu[tag]), tag
        np.testing.assert_allclose([on_system[tag][s] for s in sorted(on_cpu[tag])],
                                   [on_cpu[tag][s] for s in sorted(on_cpu[tag])], rtol=1e-4, err_msg=tag)


def test_the_gradient_histogram_is_unscaled_in_half_precision(tmp_path, tf_config):
    _estimator(tmp_path, _summary_model_fn, save_summary_steps=1).train(_input_fn, max_steps=2)  # loss scaling
    gradient = _histograms(tmp_path)["hidden/BiasAdd/gradient"]
    assert gradient and all(abs(total) < 10 for _, total in gradient.values())  # not multiplied by the scale


def test_cs1_disable_summaries_leaves_them_out_on_the_system_only(tmp_path, tf_config):
    with cs1_disable_summaries():
        estimator = _estimator(tmp_path / "system", _summary_model_fn, save_summary_steps=1)
        estimator.train(_input_fn, max_steps=2)
        compiled = estimator.compile(_input_fn)
        _estimator(tmp_path / "cpu", _summary_model_fn, None, save_summary_steps=1).train(_input_fn, max_steps=2)
        with cs1_enable_summaries():  # nested: the innermost wins
            assert any(k.startswith("summary/") for k in estimator.compile(_input_fn).program.outputs)
    assert not any(key.startswith("summary/") for key in compiled.program.outputs)
    assert not _histograms(tmp_path / "system")
    assert "hidden/BiasAdd/activation" in _histograms(tmp_path / "cpu")
    assert any(key.startswith("summary/") for key in estimator.compile(_input_fn).program.outputs)  # outside


def _metric_model_fn(features, labels, mode, params):
    output = tf.compat.v1.layers.dense(features, 1, name="out")
    loss = tf.reduce_mean(tf.square(output - labels))
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)

    def metrics(labels, output):
        return [tf.compat.v1.metrics.mean_absolute_error(labels, output), tf.reduce_mean(output)]

    host_call = (metrics, [labels, output])
    if params.get("as_eval_metric_ops"):
        return EstimatorSpec(mode, loss=loss, train_op=train_op,
                             eval_metric_ops=host_call_to_eval_metric_ops(validate_host_call(host_call)))
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op, host_call=(
        lambda labels, output: {"elem_0": tf.compat.v1.metrics.mean_absolute_error(labels, output)},
        [labels, output]))


def test_host_call_to_eval_metric_ops_evaluates_on_cpu_as_the_host_call_on_the_system(tmp_path, tf_config,
                                                                                      float32_numerics):
    system = _estimator(tmp_path, _metric_model_fn)
    system.train(_input_fn, max_steps=2)
    cerebras_tf.release_system()
    on_system = system.evaluate(lambda params: _input_fn({"repeat": False}), steps=2, use_cs=True)
    plain = Estimator(_metric_model_fn, model_dir=str(tmp_path), params={"as_eval_metric_ops": True}).evaluate(
        lambda params: _input_fn({"repeat": False}))
    assert set(plain) == {"elem_0", "loss", "global_step"}  # the list entry that is no metric pair is left out
    np.testing.assert_allclose(plain["elem_0"], on_system["elem_0"], rtol=1e-5)


@pytest.mark.parametrize("host_call, fragment", [
    ((len,), "must be a (fn, tensors) pair"),
    (("fn", [tf.constant(1.0)]), "is not callable"),
    ((len, "tensors"), "must be a list, tuple or dict"),
    ((len, [tf.constant(1.0)], "extra"), "third element must be a list or tuple"),
])
def test_validate_host_call_names_what_is_wrong(host_call, fragment):
    with pytest.raises(HostCallError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        validate_host_call(host_call)
    assert validate_host_call(None) == () and validate_host_call([]) == ()


def test_checkpoint_reader_reads_a_system_checkpoint_as_tfs_reader(tmp_path, tf_config):
    estimator = _estimator(tmp_path, _metric_model_fn, keep_checkpoint_max=5, save_checkpoints_steps=100)
    estimator.train(_input_fn, max_steps=100)
    cerebras_tf.release_system()
    estimator.train(_input_fn, max_steps=102)
    prefixes = CheckpointReader.all_checkpoints(str(tmp_path))
    assert [os.path.basename(p) for p in prefixes] == ["model.ckpt-100", "model.ckpt-102"]
    assert all(CheckpointReader.is_a_checkpoint(p) for p in prefixes)
    assert not CheckpointReader.is_a_checkpoint(str(tmp_path / "model.ckpt-7"))
    reader, tf_reader = CheckpointReader(str(tmp_path)), tf.train.load_checkpoint(str(tmp_path))
    assert reader.get_variable_to_shape_map() == tf_reader.get_variable_to_shape_map()
    assert reader.get_variable_to_dtype_map() == tf_reader.get_variable_to_dtype_map()
    for name in tf_reader.get_variable_to_shape_map():
        assert reader.has_tensor(name)
        np.testing.assert_array_equal(reader.get_tensor(name), tf_reader.get_tensor(name))
    assert reader.get_tensor("global_step") == 102
    with pytest.raises(FileNotFoundError):
        CheckpointReader(str(tmp_path / "empty"))
