"""The Model Zoo-facing API: cs_config as a dict or a CSConfig protobuf message, stack_params, GetWeights."""
from __future__ import annotations

import threading
import warnings
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from cerebras_tf import CSEstimatorSpec, CSRunConfig, amp, errors, release_system
from cerebras_tf.tf_helper import GetWeights

CS_IP = "localhost:9000"

# --------------------------------------------------------------------------- CSConfig-like messages


def _csconfig_class() -> type:
    """A real protobuf message class shaped like the zoo's CSConfig (fields it sets, an enum strategy)."""
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="cerebras_tf_test_csconfig.proto", package="cstest",
                                               syntax="proto3")
    enum = proto.enum_type.add(name="ExecutionStrategy")
    for number, name in enumerate(["ES_UNSPECIFIED", "ES_PIPELINE", "ES_WEIGHT_STREAMING"]):
        enum.value.add(name=name, number=number)
    message = proto.message_type.add(name="CSConfig")
    for number, (name, kind) in enumerate([("use_cbfloat16", field.TYPE_BOOL), ("num_csx", field.TYPE_INT32),
                                           ("mgmt_address", field.TYPE_STRING),
                                           ("max_wgt_servers", field.TYPE_INT32)], start=1):
        message.field.add(name=name, number=number, type=kind, label=field.LABEL_OPTIONAL)
    message.field.add(name="execution_strategy", number=5, type=field.TYPE_ENUM,
                      type_name=".cstest.ExecutionStrategy", label=field.LABEL_OPTIONAL)
    message.field.add(name="mount_dirs", number=6, type=field.TYPE_STRING, label=field.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("cstest.CSConfig"))


CSConfig = _csconfig_class()


class _Field:
    def __init__(self, name: str) -> None:
        self.name = name


class DuckCSConfig:
    """Not a protobuf message, but answers ListFields() like one."""

    def __init__(self, **fields: Any) -> None:
        self._fields = fields

    def ListFields(self) -> list[tuple[_Field, Any]]:  # protobuf's name
        return [(_Field(name), value) for name, value in self._fields.items()]


def _config(**kwargs: Any) -> tuple[CSRunConfig, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = CSRunConfig(cs_ip=CS_IP, **kwargs)
    return config, [w for w in caught if issubclass(w.category, errors.ConfigWarning)]


# --------------------------------------------------------------------------- normalising cs_config


@pytest.mark.parametrize("cs_config", [
    {"use_cbfloat16": True},
    DuckCSConfig(use_cbfloat16=True),
    CSConfig(use_cbfloat16=True),
], ids=["dict", "duck-typed", "protobuf"])
def test_use_cbfloat16_selects_cbfloat16_for_the_config_without_a_warning(cs_config):
    config, warned = _config(cs_config=cs_config)
    assert config.cs_config == {"use_cbfloat16": True}
    assert (config.half_dtype, config.num_csx, config.execution_strategy) == ("cbfloat16", 1, "pipeline")
    assert warned == []


@pytest.mark.parametrize("cs_config", [None, {}, {"use_cbfloat16": False}, CSConfig(use_cbfloat16=False)])
def test_without_use_cbfloat16_the_config_leaves_the_half_dtype_to_amp(cs_config):
    assert _config(cs_config=cs_config)[0].half_dtype is None


def test_a_protobuf_message_is_normalised_into_its_set_fields_with_enum_names():
    message = CSConfig(num_csx=1, mgmt_address="mgmt:443", execution_strategy=1, mount_dirs=["/data"])
    config, _ = _config(cs_config=message)
    assert config.cs_config == {"num_csx": 1, "mgmt_address": "mgmt:443", "execution_strategy": "ES_PIPELINE",
                                "mount_dirs": ["/data"]}
    assert config.execution_strategy == "pipeline"


@pytest.mark.parametrize("cs_config", [["use_cbfloat16"], "use_cbfloat16", object()])
def test_cs_config_of_another_type_is_refused_naming_the_type_and_what_is_accepted(cs_config):
    with pytest.raises(TypeError, match=rf"cs_config=.*dict.*ListFields.*got .*{type(cs_config).__qualname__}"):
        CSRunConfig(cs_ip=CS_IP, cs_config=cs_config)


@pytest.mark.parametrize("cs_config, match", [
    ({"use_cbfloat16": "yes"}, "use_cbfloat16 must be True or False"),
    ({"num_csx": -1}, "num_csx must be a positive integer"),
    ({"execution_strategy": "data_parallel"}, "unknown execution strategy"),
    ({"num_workers_per_csx": 1.5}, "num_workers_per_csx must be an integer"),
    ({1: True}, "field names must be strings"),
])
def test_invalid_cs_config_values_are_refused_when_the_config_is_built(cs_config, match):
    with pytest.raises((TypeError, ValueError), match=match):
        CSRunConfig(cs_ip=CS_IP, cs_config=cs_config)


def test_ignored_settings_give_one_warning_per_config_naming_them():
    config, warned = _config(
        cs_config=CSConfig(use_cbfloat16=True, mgmt_address="mgmt:443", max_wgt_servers=4),
        stack_params={"ir_mode": "mlir-cirh", "config": CSConfig(num_csx=1)},
    )
    assert len(warned) == 1
    message = str(warned[0].message)
    assert "ignored by the simulated CS system" in message
    assert "cs_config fields max_wgt_servers, mgmt_address" in message
    assert "stack_params keys config, ir_mode" in message
    assert warned[0].filename == __file__  # points at the CSRunConfig(...) call
    with warnings.catch_warnings(record=True) as caught:  # copies of the config (Estimator's replace) stay quiet
        warnings.simplefilter("always")
        copy = config.replace(model_dir="elsewhere")
    assert caught == [] and copy.half_dtype == "cbfloat16"


def test_stack_params_accepts_any_values_and_copies_of_the_config_share_them():
    lock = threading.Lock()  # cannot be deep-copied, as RunConfig.replace copies configs
    config, warned = _config(stack_params={"config": lock})
    assert len(warned) == 1 and "stack_params keys config" in str(warned[0].message)
    assert config.replace(model_dir="elsewhere").stack_params["config"] is lock
    with pytest.raises(TypeError, match="stack_params"):
        CSRunConfig(cs_ip=CS_IP, stack_params=["ir_mode"])


def test_num_workers_per_csx_sets_the_input_workers(tf_config):
    assert _config(cs_config={"num_workers_per_csx": 2})[0].num_input_workers == 2
    assert _config(cs_config={"num_workers_per_csx": 0})[0].num_input_workers == 1  # 0: the system chooses
    assert _config(cs_config={"num_workers_per_csx": 2}, num_input_workers=2)[0].num_input_workers == 2
    with pytest.raises(ValueError, match="contradicts cs_config's num_workers_per_csx=2"):
        CSRunConfig(cs_ip=CS_IP, cs_config={"num_workers_per_csx": 2}, num_input_workers=3)


# --------------------------------------------------------------------------- refused settings


def _two_systems_vs_one(tmp_path, build_estimator, make_input_fn, cs_config, model_fn=None, steps=4):
    """Weights after `steps` steps on one system at batch 8 and on two systems at batch 4 each (the same
    examples in the same order), and each run's estimator."""
    runs = {}
    for systems, batch in ((1, 8), (2, 4)):
        config = CSRunConfig(cs_ip=CS_IP, cs_config={**cs_config, "num_csx": systems}, tf_random_seed=1,
                             save_checkpoints_steps=None)
        estimator = build_estimator(str(tmp_path / f"systems{systems}"), model_fn, config=config,
                                    params={"batch_size": batch})
        estimator.train(make_input_fn(shuffle=False), max_steps=steps)
        release_system()
        runs[systems] = estimator, {name: estimator.get_variable_value(name)
                                    for name in estimator.get_variable_names()}
    return runs


@pytest.mark.parametrize("cs_config", [
    {"execution_strategy": "weight_streaming"},
    {"execution_strategy": "ES_WEIGHT_STREAMING"},  # CSConfig's enum name
], ids=["name", "enum_name"])
def test_two_systems_train_data_parallel_as_one_system_on_the_global_batch(
        cs_config, tmp_path, tf_config, build_estimator, make_input_fn, float32_numerics, caplog):
    with caplog.at_level("INFO"):
        runs = _two_systems_vs_one(tmp_path, build_estimator, make_input_fn, cs_config)
    (_, w1), (two, w2) = runs[1], runs[2]
    assert set(w1) == set(w2) and w2["global_step"] == w1["global_step"] == 4
    for name in w1:  # the mean loss over 2 x 4 examples: the average of the two systems' gradients
        np.testing.assert_allclose(w2[name], w1[name], rtol=2e-6, atol=1e-7, err_msg=name)
    assert any("data parallel on 2 simulated systems" in r.getMessage() for r in caplog.records)
    # the checkpoint is a plain TF checkpoint: CPU evaluates it; on the system, evaluation runs on one system
    on_cpu = two.evaluate(make_input_fn(shuffle=False, repeat=1), steps=1)
    on_system = two.evaluate(make_input_fn(shuffle=False, repeat=1), steps=1, use_cs=True)
    assert on_cpu["global_step"] == on_system["global_step"] == 4
    np.testing.assert_allclose(on_system["loss"], on_cpu["loss"], rtol=1e-5)
    assert any("evaluating runs on one system of the simulated cluster" in r.getMessage() for r in caplog.records)


def _loss_scaled_learning_rate_model_fn(features, labels, mode, params):
    """An update that reads the batch's loss beside the gradients: its learning rate."""
    output = tf.compat.v1.layers.dense(features, 1, name="out",
                                       kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=3))
    loss = tf.reduce_mean(tf.square(output - labels))
    learning_rate = 0.01 * tf.stop_gradient(loss)
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(learning_rate).minimize(loss, global_step=step)
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def test_a_model_whose_update_reads_the_batch_is_refused_on_several_systems_before_anything_is_written(
        tmp_path, tf_config, build_estimator, make_input_fn, assert_refused):
    config = CSRunConfig(cs_ip=CS_IP, cs_config={"execution_strategy": "weight_streaming", "num_csx": 2})
    estimator = build_estimator(str(tmp_path / "model"), _loss_scaled_learning_rate_model_fn, config=config)
    assert_refused(estimator, errors.ConfigError, lambda: estimator.train(make_input_fn(), max_steps=2),
                   "cs_config num_csx=2: the simulated cluster cannot train this model data parallel",
                   "the optimizer update reads 1 tensor(s) computed from the batch that are not gradients")


def test_several_systems_in_pipelined_execution_are_refused_before_anything_is_written(
        make_estimator, make_input_fn, assert_refused):
    estimator = make_estimator(cs_config={"num_csx": 2})
    for action in (lambda: estimator.compile(make_input_fn(), validate_only=True),
                   lambda: estimator.train(make_input_fn(), max_steps=2)):
        assert_refused(estimator, errors.ConfigError, action,
                       "cs_config num_csx=2 asks for 2 CS systems in pipelined execution")


def test_refused_settings_do_not_stop_cpu_runs(make_estimator, make_input_fn):
    estimator = make_estimator(cs_config={"num_csx": 4, "execution_strategy": "ES_WEIGHT_STREAMING"})
    estimator.train(make_input_fn(), max_steps=1, use_cs=False)
    assert tf.train.latest_checkpoint(estimator.model_dir)


# --------------------------------------------------------------------------- numerics of use_cbfloat16


def _train_and_evaluate(model_dir: str, build_estimator, make_input_fn, global_half: str, cs_config: Any = None):
    """Weights after 5 steps on the simulated WSE and the loss of one evaluation step, with amp's half dtype
    set to `global_half` meanwhile."""
    previous = amp.set_half_dtype(global_half)
    try:
        estimator = build_estimator(model_dir, tf_random_seed=1, save_checkpoints_steps=None, cs_config=cs_config)
        estimator.train(make_input_fn(shuffle=False), max_steps=5)
        release_system()  # the simulated system keeps one program per process: free it for the EVAL program
        loss = estimator.evaluate(make_input_fn(shuffle=False), steps=1, use_cs=True)["loss"]
    finally:
        amp.set_half_dtype(previous)
        release_system()
    reader = tf.train.load_checkpoint(model_dir)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}, loss


def test_use_cbfloat16_runs_the_config_in_cbfloat16_whatever_amp_selects(
        tmp_path, tf_config, build_estimator, make_input_fn):
    def run(name, *args):
        return _train_and_evaluate(str(tmp_path / name), build_estimator, make_input_fn, *args)

    by_config, by_config_loss = run("config", "float16", CSConfig(use_cbfloat16=True))
    by_amp, by_amp_loss = run("amp", "cbfloat16")  # a config without use_cbfloat16 keeps amp's choice
    float16, float16_loss = run("float16", "float16")
    assert sorted(by_config) == sorted(by_amp) == sorted(float16)
    for name in by_config:
        np.testing.assert_array_equal(by_config[name], by_amp[name], err_msg=name)
    assert by_config_loss == by_amp_loss
    # cbfloat16's default loss scale (2**31) and rounding differ from float16's.
    assert by_config["amp/loss_scale"] > 2.0 ** 15 >= float16["amp/loss_scale"]
    assert not np.array_equal(by_config["hidden/kernel"], float16["hidden/kernel"])
    assert by_config_loss != float16_loss


# --------------------------------------------------------------------------- GetWeights


def test_get_weights_reads_a_checkpoint_like_tf(tmp_path, build_estimator, make_input_fn):
    model_dir = str(tmp_path / "model")
    build_estimator(model_dir, cs_ip=None).train(make_input_fn(), max_steps=2)
    prefix = tf.train.latest_checkpoint(model_dir)
    reader = tf.train.load_checkpoint(prefix)
    names = sorted(reader.get_variable_to_shape_map())
    for weights in (GetWeights(prefix), GetWeights(model_dir)):
        assert list(weights.var_names) == names and len(weights) == len(names)
        pairs = list(weights)
        assert [name for name, _ in pairs] == names and list(weights) != []  # iterates again
        for name, value in pairs:
            np.testing.assert_array_equal(value, reader.get_tensor(name))
            np.testing.assert_array_equal(weights[name], reader.get_tensor(name))
            assert name in weights
        assert int(weights["global_step"]) == 2
        assert "no/such/variable" not in weights
        with pytest.raises(KeyError, match="no/such/variable"):
            weights["no/such/variable"]


def test_get_weights_refuses_a_path_without_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no TF checkpoint"):
        GetWeights(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no readable TF checkpoint"):
        GetWeights(str(tmp_path / "model.ckpt-7"))
