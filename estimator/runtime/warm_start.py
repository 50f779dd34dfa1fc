"""warm_start_from: the settings of what to initialize from another model's checkpoint.

A checkpoint path, a SavedModel directory or a WarmStartSettings; applied
with tf.compat.v1.train.warm_start when a graph is built without a
checkpoint of its own to restore.
"""
from __future__ import annotations

import collections
import os
from typing import Any

import tensorflow as tf

VocabInfo = tf.compat.v1.train.VocabInfo


class WarmStartSettings(collections.namedtuple("WarmStartSettings", [
        "ckpt_to_initialize_from", "vars_to_warm_start", "var_name_to_vocab_info", "var_name_to_prev_var_name"])):
    """What to warm-start from (tf.estimator.WarmStartSettings' fields and defaults).

    vars_to_warm_start: a regex over trainable variables (default '.*'), or a
    list of names/regexes/variables matching any variable; None warm-starts
    nothing. The two maps rename variables and remap vocabularies.
    """

    def __new__(cls, ckpt_to_initialize_from: str, vars_to_warm_start: Any = ".*",
                var_name_to_vocab_info: dict[str, Any] | None = None,
                var_name_to_prev_var_name: dict[str, str] | None = None) -> "WarmStartSettings":
        if not ckpt_to_initialize_from:
            raise ValueError("`ckpt_to_initialize_from` MUST be set in WarmStartSettings")
        return super().__new__(cls, ckpt_to_initialize_from, vars_to_warm_start, var_name_to_vocab_info or {},
                               var_name_to_prev_var_name or {})


def warm_start_settings(warm_start_from: Any) -> WarmStartSettings | None:
    """Estimator(warm_start_from=...) as settings: a path warm-starts every trainable variable."""
    if warm_start_from is None:
        return None
    if isinstance(warm_start_from, (str, bytes, os.PathLike)):
        path = tf.compat.as_str_any(os.fspath(warm_start_from))
        saved_model_variables = os.path.join(path, "variables", "variables")
        if tf.io.gfile.exists(saved_model_variables + ".index"):
            tf.compat.v1.logging.info("Warm-starting from a SavedModel")
            return WarmStartSettings(ckpt_to_initialize_from=saved_model_variables)
        return WarmStartSettings(ckpt_to_initialize_from=path)
    if isinstance(warm_start_from, WarmStartSettings) or type(warm_start_from).__name__ == "WarmStartSettings":
        return warm_start_from
    raise ValueError(f"warm_start_from must be a string or a WarmStartSettings, instead got {type(warm_start_from)}")


def maybe_warm_start(settings: WarmStartSettings | None) -> None:
    """Add warm-start initializers to the current graph (the caller checks there is no checkpoint to restore)."""
    if settings is None:
        return
    tf.compat.v1.logging.info("Warm-starting with WarmStartSettings: %s", settings)
    tf.compat.v1.train.warm_start(*settings)
