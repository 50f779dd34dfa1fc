"""The `weight_streaming` flavour of cerebras_tf.csoft.names: the Cerebras weight-streaming container's names
(R1.6/R1.7's weight-streaming configs with --cs_ip), its switch as the zoo reads it, and its estimator
(cerebras_tf.csoft.cs_estimator_ws), weight streaming unless cs_config's execution_strategy says otherwise."""
from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

import cerebras_tf
from cerebras_tf import CerebrasEstimator, CSRunConfig
from cerebras_tf.compiler.driver import PLACEMENT_REPORT_FILE
from cerebras_tf.wse.placement import PlacementReport
from cerebras_tf.csoft import cs_estimator_ws, names
from cerebras_tf.errors import EvalMetricOpsError, RunArgumentError
from cerebras_tf.settings import CSSettings
from cerebras_tf.wse.streaming import StreamingReport

CS_IP = "localhost:9000"


@pytest.fixture(autouse=True)
def _no_stand_in_left():
    names.uninstall()
    yield
    names.uninstall()


def _execution_mode() -> str:
    """Which Cerebras stack a Model Zoo R1.6/R1.7 script finds, asked as its run_utils asks (written here):
    the weight-streaming container when tfwse and cerebras.tf.ws.cs_estimator_ws's CerebrasEstimator import,
    else the pipelined container's cerebras.tf.cs_estimator, else none."""
    try:
        importlib.import_module("tfwse")
        importlib.import_module("cerebras.tf.ws.cs_estimator_ws").CerebrasEstimator  # noqa: B018
        return "WeightStreaming"
    except ImportError:
        pass
    try:
        importlib.import_module("cerebras.tf.cs_estimator").CerebrasEstimator  # noqa: B018
        return "Pipeline"
    except ImportError:
        return "OutsideCerebras"


def test_the_flavour_serves_the_container_names_tfwse_and_the_weight_streaming_estimator():
    names.install("weight_streaming")
    assert names.installed_flavour() == "weight_streaming"
    from cerebras.pb.tf.csconfig_pb2 import CSConfig
    from cerebras.tf.cs_estimator import CerebrasEstimator as PipelinedEstimator
    from cerebras.tf.run_config import CSRunConfig as RunConfig
    from cerebras.tf.summary import cs1_enable_summaries  # noqa: F401
    from cerebras.tf.ws.cs_estimator_ws import CerebrasEstimator as StreamingEstimator

    importlib.import_module("cerebras.framework")
    assert importlib.import_module("tfwse").__name__ == "tfwse"
    assert StreamingEstimator is cs_estimator_ws.CerebrasEstimator
    assert StreamingEstimator.__name__ == "CerebrasEstimator"  # what the zoo's wrapper tests to pass compile_dir
    assert issubclass(StreamingEstimator, CerebrasEstimator) and StreamingEstimator is not CerebrasEstimator
    assert PipelinedEstimator is CerebrasEstimator and RunConfig is CSRunConfig
    assert CSConfig(use_cbfloat16=True).use_cbfloat16


def test_the_zoos_switch_finds_weight_streaming_only_in_this_flavour():
    assert _execution_mode() == "OutsideCerebras"
    names.install("container")
    assert _execution_mode() == "Pipeline"
    names.install("weight_streaming")
    assert _execution_mode() == "WeightStreaming"
    names.install("container")  # switching back forgets tfwse and cerebras.tf.ws
    assert _execution_mode() == "Pipeline"


def test_the_stacks_default_strategy_is_a_settings_default_an_explicit_cs_config_wins():
    plain = CSRunConfig(cs_ip=CS_IP)
    assert CSSettings.resolve(plain, environ={}).execution_strategy == "pipeline"
    assert CSSettings.resolve(plain, environ={}, weight_streaming_stack=True).execution_strategy == "weight_streaming"
    explicit = CSRunConfig(cs_ip=CS_IP, cs_config={"execution_strategy": "ES_PIPELINE"})
    assert CSSettings.resolve(explicit, environ={}, weight_streaming_stack=True).execution_strategy == "pipeline"
    streaming = CSRunConfig(cs_ip=CS_IP, cs_config={"execution_strategy": "weight_streaming"})
    assert CSSettings.resolve(streaming, environ={}).execution_strategy == "weight_streaming"


def _estimator(cls, model_dir, make_model_fn, **config):
    return cls(make_model_fn(), model_dir=str(model_dir), params={"batch_size": 4},
               config=CSRunConfig(cs_ip=CS_IP, tf_random_seed=1, **config))


def test_the_flavours_estimator_compiles_in_weight_streaming_unless_cs_config_says_pipeline(
        tmp_path, make_model_fn, make_input_fn):
    streamed = _estimator(cs_estimator_ws.CerebrasEstimator, tmp_path / "ws", make_model_fn).compile(make_input_fn())
    assert isinstance(streamed.placement, StreamingReport)
    assert "Weight streaming on 1 system x WSE-2" in streamed.report
    assert "(weight streaming, 1 system; limited by" in streamed.summary()
    assert "Execution mode: weight streaming: the default of the weight-streaming stack's estimator" in \
        streamed.summary()

    explicit = _estimator(cs_estimator_ws.CerebrasEstimator, tmp_path / "pipe", make_model_fn,
                          cs_config={"execution_strategy": "pipeline"}).compile(make_input_fn())
    assert isinstance(explicit.placement, PlacementReport)
    assert "weight streaming" not in explicit.summary().lower()

    # The project's own estimator keeps pipelined execution by default.
    pipelined = _estimator(CerebrasEstimator, tmp_path / "plain", make_model_fn).compile(make_input_fn())
    assert isinstance(pipelined.placement, PlacementReport)


def test_the_flavours_estimator_trains_and_evaluates_eval_metric_ops_on_the_system(
        tmp_path, tf_config, make_model_fn, make_input_fn):
    """The zoo's weight-streaming path returns eval_metric_ops (GPT-2, GPT-J): the weight-streaming stack's
    evaluation runs them on the host; the pipelined stack refuses them, as the container did."""
    trainer = _estimator(cs_estimator_ws.CerebrasEstimator, tmp_path, make_model_fn)
    trainer.train(make_input_fn(), max_steps=3, sparsifier=None)  # the zoo passes sparsifier=None
    report = json.loads((tmp_path / "cs_compile" / "train" / PLACEMENT_REPORT_FILE).read_text())
    assert report["execution_strategy"] == "weight_streaming"
    cerebras_tf.release_system()
    # the conftest model_fn with eval_metric_ops returns them in every mode: evaluate with it, same variables
    estimator = cs_estimator_ws.CerebrasEstimator(make_model_fn(eval_metric_ops=True), model_dir=str(tmp_path),
                                                  params={"batch_size": 4},
                                                  config=CSRunConfig(cs_ip=CS_IP, tf_random_seed=1))
    result = estimator.evaluate(make_input_fn(), steps=2, use_cs=True)
    assert result["global_step"] == 3 and np.isfinite(result["mean_label"]) and np.isfinite(result["loss"])
    cerebras_tf.release_system()
    cpu = estimator.evaluate(make_input_fn(shuffle=False), steps=2, use_cs=False)
    on_system = estimator.evaluate(make_input_fn(shuffle=False), steps=2, use_cs=True)
    assert on_system["mean_label"] == pytest.approx(cpu["mean_label"], rel=1e-6)

    pipelined = CerebrasEstimator(make_model_fn(eval_metric_ops=True), model_dir=str(tmp_path),
                                  params={"batch_size": 4}, config=CSRunConfig(cs_ip="localhost:9001"))
    with pytest.raises(EvalMetricOpsError, match="Detected unsupported eval_metric_ops in CS system evaluation"):
        pipelined.evaluate(make_input_fn(), steps=2, use_cs=True)


def test_a_sparsifier_is_refused_before_anything_is_written(tmp_path, tf_config, make_model_fn, make_input_fn,
                                                            assert_refused):
    estimator = _estimator(cs_estimator_ws.CerebrasEstimator, tmp_path / "model", make_model_fn)
    assert_refused(estimator, RunArgumentError, lambda: estimator.train(make_input_fn(), max_steps=1,
                                                                        sparsifier=object()),
                   "sparse weight-streaming training is not simulated")
