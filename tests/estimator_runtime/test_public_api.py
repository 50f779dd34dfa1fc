"""Every public name of tf.estimator 2.15 exists in the runtime (issue 25, item 2), with tf.estimator's signature.

tf.estimator's public names are enumerated from tensorflow-estimator 2.15's generated API modules (the ones
tf.estimator, tf.estimator.experimental and tf.estimator.export are), so these tests run only on the stack
that has it (Python 3.11 / TF 2.15); the runtime's namespaces are estimator.runtime, .experimental and
.export. The names the runtime deliberately leaves out are listed below, each with its reason.
"""
from __future__ import annotations

import inspect
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest
import tensorflow as tf

from estimator import runtime

# The runtime namespace serving each tf.estimator namespace (by its path in tensorflow-estimator's wheel).
NAMESPACES = {
    "tf.estimator": ("tensorflow_estimator.python.estimator.api._v2.estimator", runtime),
    "tf.estimator.experimental": ("tensorflow_estimator.python.estimator.api._v2.estimator.experimental",
                                  runtime.experimental),
    "tf.estimator.export": ("tensorflow_estimator.python.estimator.api._v2.estimator.export", runtime.export),
}

# tf.estimator names the runtime does not provide, and why.
EXCLUDED = {
    # Canned estimators: whole models (feature columns -> layers -> heads) built on tf.estimator's
    # canned/ package; the project trains users' own model_fns, and DESIGN leaves canned estimators out.
    "tf.estimator.BaselineClassifier", "tf.estimator.BaselineEstimator", "tf.estimator.BaselineRegressor",
    "tf.estimator.DNNClassifier", "tf.estimator.DNNEstimator", "tf.estimator.DNNRegressor",
    "tf.estimator.DNNLinearCombinedClassifier", "tf.estimator.DNNLinearCombinedEstimator",
    "tf.estimator.DNNLinearCombinedRegressor",
    "tf.estimator.LinearClassifier", "tf.estimator.LinearEstimator", "tf.estimator.LinearRegressor",
    "tf.estimator.experimental.LinearSDCA",  # the SDCA optimizer of the canned linear estimators
    "tf.estimator.experimental.RNNClassifier", "tf.estimator.experimental.RNNEstimator",
    # Heads: the loss / metrics / predictions / export-signature layer of the canned estimators (tf.estimator's
    # head/ package, used through canned estimators or their model_fn builders); not a runtime concern.
    "tf.estimator.Head", "tf.estimator.BinaryClassHead", "tf.estimator.MultiClassHead", "tf.estimator.MultiHead",
    "tf.estimator.MultiLabelHead", "tf.estimator.RegressionHead", "tf.estimator.LogisticRegressionHead",
    "tf.estimator.PoissonRegressionHead",
    # Feature-column helpers: tf.Example parsing specs built from feature columns for the canned estimators.
    "tf.estimator.classifier_parse_example_spec", "tf.estimator.regressor_parse_example_spec",
}


def _tf_estimator_namespace(path: str):
    pytest.importorskip("tensorflow_estimator", reason="enumerates tf.estimator 2.15: needs tensorflow-estimator "
                        "(the Python 3.11 / TF 2.15 stack)")
    import importlib

    module = importlib.import_module(path)
    return getattr(module, "_tfmw_wrapped_module", module)  # tf.compat.v1's deprecation wrapper, if any


def _public_names(module) -> dict[str, object]:
    return {name: value for name, value in vars(module).items()
            if not name.startswith("_") and not inspect.ismodule(value)}


def _upstream_names() -> list[tuple[str, str]]:
    """(tf.estimator namespace, name) of every public name, when tensorflow-estimator is installed."""
    try:
        import tensorflow_estimator  # noqa: F401
    except ImportError:
        return []
    return sorted((namespace, name) for namespace, (path, _) in NAMESPACES.items()
                  for name in _public_names(_tf_estimator_namespace(path)))


def test_the_enumeration_sees_tf_estimator_2_15():
    names = {f"{namespace}.{name}" for namespace, name in _upstream_names()}
    if not names:
        pytest.skip("enumerates tf.estimator 2.15: needs tensorflow-estimator (the Python 3.11 / TF 2.15 stack)")
    assert tf.__version__.startswith("2.15")
    for expected in ("tf.estimator.Estimator", "tf.estimator.experimental.InMemoryEvaluatorHook",
                     "tf.estimator.export.ServingInputReceiver", "tf.estimator.DNNClassifier"):
        assert expected in names
    assert len(names) == 74  # tf.estimator 53, .experimental 12, .export 9: a changed list is noticed
    assert EXCLUDED <= names, f"exclusions that are no tf.estimator name: {sorted(EXCLUDED - names)}"


@pytest.mark.parametrize("namespace, name", _upstream_names() or [pytest.param("-", "-", marks=pytest.mark.skip(
    reason="enumerates tf.estimator 2.15: needs tensorflow-estimator (the Python 3.11 / TF 2.15 stack)"))])
def test_public_name_exists_in_the_runtime(namespace, name):
    if f"{namespace}.{name}" in EXCLUDED:
        pytest.skip("excluded: " + ("canned estimator" if "Head" not in name and "parse" not in name
                                    else "head" if "Head" in name else "feature-column helper"))
    path, ours_namespace = NAMESPACES[namespace]
    upstream = _public_names(_tf_estimator_namespace(path))[name]
    assert hasattr(ours_namespace, name), f"{namespace}.{name} is missing from {ours_namespace.__name__}"
    ours = getattr(ours_namespace, name)
    if name == "ModeKeys":  # TF's EstimatorModeKeys there; the runtime's own class, with the same values
        assert {k: v for k, v in vars(ours).items() if k.isupper()} == \
            {k: v for k, v in vars(upstream).items() if k.isupper()}
        return
    if not getattr(upstream, "__module__", "").startswith("tensorflow_estimator"):
        # TF's own objects tf.estimator re-exports (session hooks, ExportOutputs): the very same object.
        assert ours is upstream
        return
    assert callable(ours) == callable(upstream)
    assert isinstance(ours, type) == isinstance(upstream, type)
    if isinstance(upstream, type) and not hasattr(upstream, "_fields"):
        assert _parameters(ours.__init__) == _parameters(upstream.__init__)
    elif isinstance(upstream, type):  # a namedtuple: its fields and __new__
        assert ours._fields == upstream._fields
        assert _parameters(ours.__new__) == _parameters(upstream.__new__)
    elif callable(upstream):
        assert _parameters(ours) == _parameters(upstream)
    else:
        assert ours == upstream


def _parameters(function) -> list[tuple[str, object]]:
    """(name, default) of each parameter; defaults that are objects compare by their kind only."""
    result = []
    for parameter in inspect.signature(function).parameters.values():
        default = parameter.default
        if default is not inspect.Parameter.empty and not isinstance(default, (int, float, str, bool, type(None))):
            default = type(default).__name__ if not callable(default) else "<callable>"
        result.append((parameter.name, default))
    return result


def test_mode_keys_are_tf_estimators():
    assert (runtime.ModeKeys.TRAIN, runtime.ModeKeys.EVAL, runtime.ModeKeys.PREDICT) == ("train", "eval", "infer")


def test_estimator_refuses_export_savedmodel_and_v1_keeps_it():
    est = runtime.Estimator(model_fn=lambda features, labels, mode: None)
    with pytest.raises(AttributeError, match="Please use `export_saved_model`"):
        est.export_savedmodel  # noqa: B018
    assert not hasattr(est, "export_savedmodel")
    from estimator.runtime import v1

    assert issubclass(v1.Estimator, runtime.Estimator)
    assert "strip_default_attrs" in inspect.signature(v1.Estimator.export_savedmodel).parameters
