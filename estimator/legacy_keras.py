"""tf.compat.v1.layers on TensorFlow >= 2.16: route TF's Keras to tf-keras without the user knowing.

TF >= 2.16 ships Keras 3, which has no TF1 layers: `tf.compat.v1.layers.dense` raises
"`dense` is not available with Keras 3" unless the tf-keras package is installed and the
environment variable TF_USE_LEGACY_KERAS is set when TensorFlow first resolves `tf.keras` /
`tf.compat.v1.layers` (TF reads it lazily, on first use of each, not when TensorFlow is imported).
`prefer_legacy_keras()` sets it (unless the user set it) before anything of ours touches
TensorFlow; `estimator/__init__` calls it first. This module imports no TensorFlow.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import sys

ENV_VAR = "TF_USE_LEGACY_KERAS"
_TRUE = ("true", "True", "1")  # the values TensorFlow's KerasLazyLoader accepts
_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos", "tf-nightly")

HOW_TO_FIX = (f"tf.compat.v1.layers need the tf-keras package on TensorFlow >= 2.16 (pip install tf-keras; "
              f"cerebras-tf installs the matching version) and {ENV_VAR}=1 set before TensorFlow first uses Keras: "
              f"import cerebras_tf (or estimator) before anything touches tf.keras or tf.compat.v1.layers, or "
              f"export {ENV_VAR}=1.")


def tensorflow_version() -> tuple[int, int] | None:
    """The installed TensorFlow's (major, minor), without importing it; None when it cannot be told."""
    module = sys.modules.get("tensorflow")
    version = getattr(module, "__version__", None)
    if not isinstance(version, str):
        for name in _DISTRIBUTIONS:
            try:
                version = importlib.metadata.version(name)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    try:
        major, minor = str(version).split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def needs_legacy_keras() -> bool:
    """True on TensorFlow >= 2.16 (Keras 3 is tf.keras there unless told otherwise)."""
    version = tensorflow_version()
    return version is None or version >= (2, 16)


def prefer_legacy_keras() -> None:
    """Set TF_USE_LEGACY_KERAS=1 on TF >= 2.16 when tf-keras is installed and the user has not set it.

    Warns when tf.compat.v1.layers cannot work: tf-keras missing, the variable set to something else,
    or TensorFlow already resolved tf.compat.v1.layers to Keras 3 before this ran."""
    if not needs_legacy_keras():
        return
    if importlib.util.find_spec("tf_keras") is None:
        logging.getLogger("tensorflow").warning(
            "TensorFlow >= 2.16 without the tf-keras package: tf.compat.v1.layers will fail. %s", HOW_TO_FIX)
        return
    value = os.environ.setdefault(ENV_VAR, "1")
    if value not in _TRUE:
        logging.getLogger("tensorflow").warning(
            "%s=%r: tf.compat.v1.layers use Keras 3 and will fail. %s", ENV_VAR, value, HOW_TO_FIX)
        return
    layers = _resolved_v1_layers()
    if layers is not None and getattr(layers, "_tfll_keras_version", None) == "keras_3":
        logging.getLogger("tensorflow").warning(
            "tf.compat.v1.layers was used before %s was set, so TensorFlow routed it to Keras 3, where "
            "it fails. %s", ENV_VAR, HOW_TO_FIX)


def _resolved_v1_layers() -> object | None:
    """TensorFlow's lazy tf.compat.v1.layers loader if TensorFlow is imported and it has been resolved."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    try:
        layers = vars(vars(vars(tf)["compat"])["v1"]).get("layers")
    except (KeyError, TypeError):
        return None
    if layers is None or not vars(layers).get("_tfll_initialized", False):
        return None
    return layers
