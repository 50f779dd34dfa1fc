"""`tf.estimator` for unchanged legacy scripts on TensorFlow >= 2.16 (opt-in).

TensorFlow 2.16 removed tf.estimator. `install_as_tf_estimator()` (or, from the
Cerebras layer, `import cerebras_tf.legacy_estimator`) makes `tf.estimator`,
`tf.compat.v1.estimator` and `tf.compat.v2.estimator` resolve to a module that
serves this package's Estimator runtime under tf.estimator's names, so a script
written for tf.estimator runs unchanged; so do the `tensorflow_estimator`
modules scripts import from directly (`tensorflow_estimator.python.estimator.
estimator.Estimator`, `...model_fn.EstimatorSpec`, ...: `PACKAGE_MODULES`),
where that package is not installed. Where TensorFlow still has tf.estimator
(2.15 with tensorflow-estimator, and estimator.BACKEND is "tf.estimator"), it
does nothing. Names are looked up when used, so whatever the runtime provides
is there (the standard hooks come from tf.compat.v1.train, as tf.estimator's do).
"""
from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

import tensorflow as tf

from estimator import api
from estimator import runtime as _runtime

MODULE_NAME = "tensorflow.estimator"

# tf.estimator names that are tf.compat.v1.train's (tf.estimator re-exports TF's hooks).
_FROM_V1_TRAIN = (
    "CheckpointSaverHook", "CheckpointSaverListener", "FeedFnHook", "FinalOpsHook", "GlobalStepWaiterHook",
    "LoggingTensorHook", "NanLossDuringTrainingError", "NanTensorHook", "ProfilerHook", "SecondOrStepTimer",
    "SessionRunArgs", "SessionRunContext", "SessionRunHook", "SessionRunValues", "StepCounterHook",
    "StopAtStepHook", "SummarySaverHook",
)
# tf.estimator names served by estimator.api (which names what the runtime lacks so far).
_FROM_API = ("Estimator", "EstimatorSpec", "RunConfig", "ModeKeys", "WarmStartSettings", "TrainSpec", "EvalSpec",
             "train_and_evaluate")


class _TfEstimatorModule(types.ModuleType):
    """tf.estimator, served by estimator.runtime."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in _FROM_API:
            value = getattr(api, name)
        elif hasattr(_runtime, name):
            value = getattr(_runtime, name)
        elif name in _FROM_V1_TRAIN:
            value = getattr(tf.compat.v1.train, name)
        else:
            shown = "tf.estimator" if self.__name__ == MODULE_NAME else self.__name__
            raise AttributeError(
                f"{shown}.{name} is not provided by cerebras-tf's Estimator runtime (installed as tf.estimator "
                f"by estimator.install_as_tf_estimator on TensorFlow {tf.__version__}).")
        setattr(self, name, value)
        return value

    def __dir__(self) -> list[str]:
        return sorted(set(_FROM_API) | set(_FROM_V1_TRAIN) | set(getattr(_runtime, "__all__", ())))


def installed() -> bool:
    """True when tf.estimator is this package's runtime (install_as_tf_estimator ran)."""
    return isinstance(getattr(tf, "estimator", None), _TfEstimatorModule)


def install_as_tf_estimator() -> Any:
    """Make tf.estimator (and tf.compat.v1/v2.estimator) this package's Estimator runtime; returns tf.estimator.

    Does nothing where TensorFlow's own tf.estimator is in use (estimator.BACKEND == "tf.estimator").
    Calling it again is harmless."""
    if api.BACKEND != "runtime":
        return tf.estimator
    module = sys.modules.get(MODULE_NAME)
    if not isinstance(module, _TfEstimatorModule):
        module = _TfEstimatorModule(MODULE_NAME, __doc__)
        sys.modules[MODULE_NAME] = module
    for parent in (tf, tf.compat.v1, tf.compat.v2):
        parent.estimator = module
    _serve_tensorflow_estimator_package()
    return module


# The tensorflow_estimator modules scripts import from directly (the Model Zoo's estimator wrappers do), each
# serving tf.estimator's names.
PACKAGE_MODULES = ("tensorflow_estimator", "tensorflow_estimator.estimator", "tensorflow_estimator.python",
                   "tensorflow_estimator.python.estimator", "tensorflow_estimator.python.estimator.estimator",
                   "tensorflow_estimator.python.estimator.model_fn",
                   "tensorflow_estimator.python.estimator.run_config",
                   "tensorflow_estimator.python.estimator.mode_keys")


def _serve_tensorflow_estimator_package() -> None:
    """Where the tensorflow_estimator package is not installed (TF >= 2.16), serve its usual modules too."""
    served = sys.modules.get("tensorflow_estimator")
    if served is not None and not isinstance(served, _TfEstimatorModule):
        return  # the real package is imported: never shadow it
    if served is None and importlib.util.find_spec("tensorflow_estimator") is not None:
        return  # the real package is installed
    for name in PACKAGE_MODULES:
        module = sys.modules.get(name)
        if not isinstance(module, _TfEstimatorModule):
            module = _TfEstimatorModule(name, f"{name}, served by cerebras-tf's Estimator runtime.")
            module.__path__ = []  # a package: its submodules import
            sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
