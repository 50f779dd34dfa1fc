"""RunConfig, EstimatorSpec and the Estimator's constructor checks, with tf.estimator's messages."""
from __future__ import annotations

import copy
import functools
import json
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest
import tensorflow as tf

import runtime_models as models
from estimator import run_config_value, runtime
from estimator.runtime import Estimator, EstimatorSpec, ModeKeys, RunConfig, WarmStartSettings

_NEEDS_TFE = "compares with tf.estimator: needs tensorflow-estimator (the Python 3.11 / TF 2.15 stack)"


@pytest.fixture(autouse=True)
def _no_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)


def test_run_config_defaults_and_private_attributes():
    config = RunConfig()
    assert (config.save_checkpoints_secs, config.save_checkpoints_steps) == (600, None)
    assert (config.save_summary_steps, config.keep_checkpoint_max, config.log_step_count_steps) == (100, 5, 100)
    assert config.keep_checkpoint_every_n_hours == 10000
    assert config.session_creation_timeout_secs == 7200 and config.checkpoint_save_graph_def is True
    assert config.model_dir is None and config.tf_random_seed is None and config.session_config is None
    assert (config.is_chief, config.master, config.task_type, config.task_id) == (True, "", "worker", 0)
    assert (config.num_ps_replicas, config.num_worker_replicas) == (0, 1)
    for name in ("train_distribute", "device_fn", "protocol", "eval_distribute", "experimental_distribute",
                 "experimental_max_worker_delay_secs"):
        assert getattr(config, name) is None
        assert run_config_value(config, name) is None
    assert RunConfig(save_checkpoints_steps=10).save_checkpoints_secs is None
    assert RunConfig(save_checkpoints_secs=5).save_checkpoints_steps is None


def test_run_config_replace():
    config = RunConfig(save_checkpoints_steps=10, tf_random_seed=1)
    replaced = config.replace(save_checkpoints_secs=30, model_dir="/tmp/x")
    assert (replaced.save_checkpoints_secs, replaced.save_checkpoints_steps) == (30, None)
    assert replaced.model_dir == "/tmp/x" and replaced.tf_random_seed == 1
    assert (config.save_checkpoints_steps, config.model_dir) == (10, None)  # the original is unchanged
    with pytest.raises(ValueError, match="Replacing cs_ip is not supported"):
        config.replace(cs_ip="x")
    with pytest.raises(ValueError, match="cannot be both set"):
        config.replace(save_checkpoints_steps=1, save_checkpoints_secs=1)
    assert copy.deepcopy(replaced).model_dir == "/tmp/x"


@pytest.mark.parametrize("kwargs, message", [
    (dict(save_checkpoints_steps=1, save_checkpoints_secs=1),
     "`save_checkpoints_steps` and `save_checkpoints_secs` cannot be both set."),
    (dict(model_dir=""), "model_dir should be non-empty."),
    (dict(save_summary_steps=-1), "save_summary_steps should be >= 0"),
    (dict(keep_checkpoint_max=-1), "keep_checkpoint_max should be >= 0"),
    (dict(log_step_count_steps=0), "log_step_count_steps should be > 0"),
    (dict(tf_random_seed=1.5), "tf_random_seed must be integer."),
    (dict(session_config={}), "session_config must be instance of ConfigProto"),
    (dict(device_fn=lambda x: ""), 'device_fn must be callable with exactly one argument "op".'),
    (dict(protocol="http"), "protocol should be grpc or grpc+verbs"),
    (dict(session_creation_timeout_secs=0), "session_creation_timeout_secs should be > 0"),
])
def test_run_config_validation(kwargs, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        RunConfig(**kwargs)


def test_tf_config(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["localhost:2222"]},
                                                "task": {"type": "chief", "index": 0}, "model_dir": "/tmp/m"}))
    config = RunConfig()
    assert (config.task_type, config.task_id, config.is_chief, config.master) == ("chief", 0, True, "")
    assert config.model_dir == "/tmp/m" and config.num_worker_replicas == 1
    assert list(config.session_config.device_filters) == ["/job:ps", "/job:chief"]
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"]},
                                                "task": {"type": "worker", "index": 1}}))
    config = RunConfig()
    assert (config.is_chief, config.master, config.global_id_in_cluster) == (False, "grpc://w:2", 2)
    assert (config.num_ps_replicas, config.num_worker_replicas) == (1, 3)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["w:1"]}, "task": {"type": "worker"}}))
    with pytest.raises(ValueError, match='If "cluster" is set in TF_CONFIG, it must have one "chief" node.'):
        RunConfig()


def test_estimator_settles_model_dir_and_config(tmp_path):
    model_fn = models.dense_model_fn(runtime, layers=False)
    estimator = Estimator(model_fn, params={})
    assert os.path.isdir(estimator.model_dir) and estimator.config.model_dir == estimator.model_dir
    assert estimator.config.session_config.allow_soft_placement
    config = RunConfig(model_dir=str(tmp_path / "a"))
    assert Estimator(model_fn, config=config, params={}).model_dir == str(tmp_path / "a")
    assert Estimator(model_fn, model_dir=tmp_path / "a", config=config, params={}).model_dir == str(tmp_path / "a")
    with pytest.raises(ValueError, match="`model_dir` are set both in constructor and `RunConfig`"):
        Estimator(model_fn, model_dir=str(tmp_path / "b"), config=config, params={})
    with pytest.raises(ValueError, match="config must be an instance of `RunConfig`"):
        Estimator(model_fn, config={"model_dir": "x"})
    estimator = Estimator(model_fn, model_dir=str(tmp_path), params={"lr": 0.1})
    estimator.params["lr"] = 5
    assert estimator.params == {"lr": 0.1} and estimator._params == {"lr": 0.1}
    assert estimator.config is not estimator.config  # a copy each time, as tf.estimator gives


def test_model_fn_arguments_are_checked_by_name(tmp_path):
    with pytest.raises(ValueError, match="must include features argument"):
        Estimator(lambda x, labels: None, model_dir=str(tmp_path))
    with pytest.raises(ValueError, match="does not include params argument, but params"):
        Estimator(lambda features, labels: None, model_dir=str(tmp_path), params={"a": 1})
    with pytest.raises(ValueError, match=r"has following not expected args: \['extra'\]"):
        Estimator(lambda features, labels, extra: None, model_dir=str(tmp_path))
    with pytest.raises(ValueError, match="model_fn must be provided to Estimator."):
        Estimator(None, model_dir=str(tmp_path))

    def with_extra(features, labels, mode, extra):
        return None

    Estimator(functools.partial(with_extra, extra=1), model_dir=str(tmp_path))  # partial binds the extra one

    class ModelFn:
        def __call__(self, features, labels, mode, params, config):
            return None

    Estimator(ModelFn(), model_dir=str(tmp_path), params={})


def test_model_fn_property_binds_params(tmp_path):
    seen = {}

    def model_fn(features, labels, mode, params, config):
        seen.update(params=params, config=config)
        return EstimatorSpec(mode, predictions=features)

    estimator = Estimator(model_fn, model_dir=str(tmp_path), params={"p": 2})
    with tf.Graph().as_default():
        spec = estimator.model_fn(tf.constant([1.0]), None, ModeKeys.PREDICT, estimator.config)
    assert isinstance(spec, EstimatorSpec) and seen["params"] == {"p": 2}


def _in_graph(fn):
    with tf.Graph().as_default():
        return fn()


def test_estimator_spec_validation():
    def check(message, error=ValueError, **fields):
        """EstimatorSpec(**fields) fails; callables among the fields are built inside the graph."""
        def build():
            return EstimatorSpec(**{k: v() if callable(v) else v for k, v in fields.items()})

        with pytest.raises(error, match=message):
            _in_graph(build)

    one = lambda: tf.constant(1.0)  # noqa: E731
    check("Missing train_op.", mode=ModeKeys.TRAIN, loss=one)
    check("Missing loss.", mode=ModeKeys.EVAL)
    check("Missing predictions.", mode=ModeKeys.PREDICT)
    check("loss must be Tensor, given: 1.0", TypeError, mode=ModeKeys.EVAL, loss=1.0)
    check("Loss must be scalar", mode=ModeKeys.EVAL, loss=lambda: tf.constant([1.0, 2.0]))
    check("eval_metric_ops must be a dict", TypeError, mode=ModeKeys.PREDICT, predictions=one, eval_metric_ops=[1])
    check("Values of eval_metric_ops must be .metric_value, update_op. tuples", TypeError, mode=ModeKeys.EVAL,
          loss=one, eval_metric_ops={"m": 1})
    check("All hooks must be SessionRunHook instances", TypeError, mode=ModeKeys.PREDICT, predictions=one,
          prediction_hooks=[1])
    check("scaffold must be tf.train.Scaffold", TypeError, mode=ModeKeys.PREDICT, predictions=one, scaffold=1)
    check("train_op must be Operation or Tensor", TypeError, mode=ModeKeys.TRAIN, loss=one, train_op=1)
    check('loss with ".*" must be from the default graph', mode=ModeKeys.EVAL, loss=tf.constant(2.0))  # eager
    other = tf.Graph()
    with other.as_default():
        foreign = tf.constant(3.0)
    check('prediction values with "Const:0" must be from the default graph', mode=ModeKeys.PREDICT,
          predictions=foreign)


def test_estimator_spec_defaults_and_replace():
    def build():
        loss = tf.reshape(tf.constant(1.0), [1])
        spec = EstimatorSpec(ModeKeys.EVAL, loss=loss)
        return spec, spec._replace(predictions={"p": loss})

    spec, replaced = _in_graph(build)
    assert spec._fields == ("mode", "predictions", "loss", "train_op", "eval_metric_ops", "export_outputs",
                            "training_chief_hooks", "training_hooks", "scaffold", "evaluation_hooks",
                            "prediction_hooks")
    assert spec.loss.shape.as_list() == []  # a [1] loss is reshaped to a scalar
    assert spec.predictions == {} and spec.eval_metric_ops == {} and spec.training_hooks == ()
    assert isinstance(spec.scaffold, tf.compat.v1.train.Scaffold)
    assert isinstance(replaced, EstimatorSpec) and set(replaced.predictions) == {"p"}
    with pytest.raises(ValueError, match="mode of EstimatorSpec cannot be changed."):
        spec._replace(mode=ModeKeys.TRAIN)
    predict = _in_graph(lambda: EstimatorSpec(ModeKeys.PREDICT, predictions={"p": tf.constant([1.0])}))
    assert list(predict.export_outputs) == ["serving_default"]


def test_warm_start_settings():
    settings = WarmStartSettings("/ckpt")
    assert settings == ("/ckpt", ".*", {}, {})
    with pytest.raises(ValueError, match="`ckpt_to_initialize_from` MUST be set"):
        WarmStartSettings("")


def test_tf_estimator_specs_are_accepted(tmp_path):
    """On TF 2.15 a model_fn returning tf.estimator's EstimatorSpec runs on the runtime unchanged."""
    tfe = pytest.importorskip("tensorflow_estimator", reason=_NEEDS_TFE).estimator
    estimator = Estimator(models.dense_model_fn(tfe, layers=False), model_dir=str(tmp_path), params={})
    estimator.train(models.input_fn(), steps=2)
    assert estimator.evaluate(models.input_fn(), steps=1)["global_step"] == 2


def test_tf_estimator_run_configs_are_accepted(tmp_path):
    tfe = pytest.importorskip("tensorflow_estimator", reason=_NEEDS_TFE).estimator
    config = tfe.RunConfig(tf_random_seed=4, save_checkpoints_steps=7, keep_checkpoint_max=2)
    estimator = Estimator(models.dense_model_fn(runtime, layers=False), model_dir=str(tmp_path), config=config,
                          params={})
    assert isinstance(estimator.config, RunConfig)
    assert (estimator.config.tf_random_seed, estimator.config.save_checkpoints_steps) == (4, 7)
    assert (estimator.config.save_checkpoints_secs, estimator.config.keep_checkpoint_max) == (None, 2)
    defaults = Estimator(models.dense_model_fn(runtime, layers=False), model_dir=str(tmp_path),
                         config=tfe.RunConfig(), params={}).config
    assert (defaults.save_checkpoints_steps, defaults.save_checkpoints_secs) == (None, 600)
