"""cerebras_tf.csoft.names: the Cerebras package names the Model Zoo imports, served by cerebras-tf on request."""
from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import warnings

import pytest

from cerebras_tf import CerebrasEstimator, CSRunConfig
from cerebras_tf.cs_config import ApplianceCSConfig
from cerebras_tf.csoft import names
from cerebras_tf.errors import ConfigError, ConfigWarning


@pytest.fixture(autouse=True)
def _no_stand_in_left():
    names.uninstall()
    yield
    names.uninstall()


def _importable(name: str) -> bool:
    """As the zoo's modelzoo/__init__.py asks: find_spec, with a missing parent meaning no."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def test_nothing_is_served_by_default():
    assert names.installed_flavour() is None
    for name in ("cerebras.framework", "cerebras.tf.cs_estimator", "cerebras_appliance", "cerebras_tensorflow"):
        assert not _importable(name)


def test_the_container_names_are_the_projects_classes():
    names.install("container")
    assert _importable("cerebras.framework") and not _importable("cerebras_appliance")
    from cerebras.pb.common.tri_state_pb2 import TS_DISABLED, TS_ENABLED
    from cerebras.pb.tf.csconfig_pb2 import CSConfig
    from cerebras.tf.cs_estimator import CerebrasEstimator as Estimator
    from cerebras.tf.run_config import CSRunConfig as RunConfig
    from cerebras.tf.tf_helper import GetWeights

    assert Estimator is CerebrasEstimator and RunConfig is CSRunConfig
    assert GetWeights is importlib.import_module("cerebras_tf.tf_helper").GetWeights
    assert (TS_DISABLED, TS_ENABLED) == (1, 2)
    message = CSConfig(use_cbfloat16=True)
    assert CSRunConfig(cs_ip="localhost:9000", cs_config=message).half_dtype == "cbfloat16"
    with pytest.raises(ValueError, match="no_such_field"):
        CSConfig(no_such_field=1)  # a real message: unknown fields are refused


def test_the_appliance_names_never_include_the_container_ones():
    """R1.8's zoo asserts when cerebras.framework imports beside the appliance's names."""
    names.install("appliance")
    assert _importable("cerebras_appliance") and _importable("cerebras_tensorflow")
    assert not _importable("cerebras.framework")
    from cerebras_appliance.CSConfig import CSConfig
    from cerebras_appliance.cs_run_config import CSRunConfig as RunConfig
    from cerebras_appliance.environment import appliance_environ
    from cerebras_appliance.pb.workflow.appliance.common.common_config_pb2 import DebugArgs, ExecutionStrategy
    from cerebras_tensorflow.cs_estimator_app import CerebrasAppEstimator

    assert CSConfig is ApplianceCSConfig and RunConfig is CSRunConfig and CerebrasAppEstimator is CerebrasEstimator
    assert appliance_environ is importlib.import_module("os").environ
    assert ExecutionStrategy.Name(ExecutionStrategy.ES_PIPELINE) == "ES_PIPELINE"
    hints = DebugArgs().debug_mgr
    hints.clean_pod_policy = DebugArgs.DebugMGR.CleanPodPolicy.NONE
    hints.task_spec_hints["chief"].container_image = "image"
    assert hints.task_spec_hints["chief"].container_image == "image"


def test_switching_flavours_forgets_the_other_names():
    names.install("container")
    import cerebras.framework  # noqa: F401

    names.install("appliance")
    assert names.installed_flavour() == "appliance"
    assert "cerebras.framework" not in sys.modules and not _importable("cerebras.framework")


def test_an_unknown_flavour_names_the_three_there_are():
    with pytest.raises(ConfigError, match="Unknown Cerebras software flavour 'R1.8'") as caught:
        names.install("R1.8")
    assert all(f"'{flavour}'" in caught.value.fix for flavour in ("container", "weight_streaming", "appliance"))
    assert names.installed_flavour() is None


def test_a_real_cerebras_installation_is_never_shadowed(tmp_path, monkeypatch):
    real = tmp_path / "cerebras_appliance"
    real.mkdir()
    (real / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names.install("appliance")
    assert any(issubclass(w.category, ConfigWarning) and "cerebras_appliance" in str(w.message) for w in caught)
    import cerebras_appliance

    assert cerebras_appliance.REAL
    assert not _importable("cerebras_appliance.CSConfig")  # the real package, which has none
    assert _importable("cerebras_tensorflow.cs_estimator_app")  # not installed for real: still served
    sys.modules.pop("cerebras_appliance")


def test_the_runner_refuses_an_unknown_flavour_and_a_missing_script(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cerebras_tf.csoft", *args], capture_output=True, text=True,
                              timeout=120)

    unknown = run("weights", str(tmp_path / "run.py"))
    assert unknown.returncode == 2 and "Unknown Cerebras software flavour 'weights'" in unknown.stderr
    missing = run("appliance", str(tmp_path / "run.py"))
    assert missing.returncode == 2 and "no such script" in missing.stderr
    script = tmp_path / "run.py"
    script.write_text("import sys, importlib.util\n"
                      "print(sys.argv, importlib.util.find_spec('cerebras_appliance') is not None, __name__)\n")
    ran = run("appliance", str(script), "CSX", "pipeline")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"[{str(script)!r}, 'CSX', 'pipeline'] True __main__"


def test_the_appliance_flavour_lets_json_format_take_r18s_keyword():
    """R1.8's update_debug_args_from_stack_params passes including_default_value_fields=False, which protobuf 5
    removed; served as the appliance, the zoo's call works on either protobuf, and the originals come back."""
    from google.protobuf import json_format

    from cerebras_tf.cs_messages import PROTO_FILES
    from cerebras_tf.csoft import protobuf_compat

    original = json_format.MessageToJson
    message = PROTO_FILES["full"]["FullConfig"]()
    expected = json_format.MessageToJson(message, preserving_proto_field_name=True, indent=0, sort_keys=True)
    names.install("appliance")
    try:
        as_r18_calls_it = json_format.MessageToJson(message, including_default_value_fields=False,
                                                    preserving_proto_field_name=True, indent=0, sort_keys=True)
        assert as_r18_calls_it == expected
        assert json_format.MessageToDict(message, including_default_value_fields=False) == {}
        if protobuf_compat.needed():
            assert json_format.MessageToJson is not original
            with pytest.raises(TypeError, match="got both including_default_value_fields=True"):
                json_format.MessageToJson(message, including_default_value_fields=True,
                                          always_print_fields_with_no_presence=False)
        else:
            assert json_format.MessageToJson is original  # protobuf 4 has the keyword: nothing is changed
    finally:
        names.uninstall()
    assert json_format.MessageToJson is original
    if protobuf_compat.needed():
        with pytest.raises(TypeError):
            json_format.MessageToJson(message, including_default_value_fields=False)
