"""CSRunConfig's cs_config and stack_params: what the simulated CS system does with each setting.

The Model Zoo builds ``cs_config`` as a protobuf message
(``CSConfig(**params["csconfig"])``, or the appliance's CSConfig with cluster
settings) and ``stack_params`` as a dict of compiler settings (``ir_mode``, a
``FullConfig`` proto). CSRunConfig normalises cs_config once into a dict of
its set fields (:func:`cs_config_fields`) and reads the fields below from it.

==================== ==========================================================
cs_config field      on the simulated CS system
==================== ==========================================================
fabric               honoured: the wafer the compiler places on (ours)
use_cbfloat16        honoured: True runs this config's executors in cbfloat16
num_workers_per_csx  honoured: N >= 1 is the number of input workers (0: auto)
num_csx              1 is honoured; more systems are refused (rules/config.py)
execution_strategy   pipeline is honoured; weight streaming is refused
anything else        ignored, with one warning per config naming the fields
==================== ==========================================================

Every stack_params key is ignored (the simulated compiler takes no settings),
named in that same warning. This module never imports TensorFlow.
"""
from __future__ import annotations

import warnings
from typing import Any, Mapping

from cerebras_tf.errors import ConfigWarning

PIPELINE = "pipeline"
WEIGHT_STREAMING = "weight_streaming"

# cs_config fields that mean something to the simulated CS system (see the table above).
HONOURED_FIELDS = ("fabric", "use_cbfloat16", "num_workers_per_csx", "num_csx", "execution_strategy")

# Spellings of the execution strategies: the zoo's strings and the appliance enum's names.
_STRATEGIES = {
    "pipeline": PIPELINE,
    "es_pipeline": PIPELINE,
    "weight_streaming": WEIGHT_STREAMING,
    "es_weight_streaming": WEIGHT_STREAMING,
}


class Settings(dict):
    """A dict of settings that copy.deepcopy shares instead of copying.

    tf.estimator copies a RunConfig with copy.deepcopy (RunConfig.replace); the
    values here may be arbitrary objects (protobuf messages, callables) that
    cannot be deep-copied, and the project only reads them.
    """

    def __deepcopy__(self, memo: dict[int, Any]) -> "Settings":
        return self


def cs_config_fields(cs_config: Any) -> Settings:
    """The fields of `cs_config` as a dict: a dict's items, or the set fields of a protobuf-like message.

    A message is anything with a ``ListFields()`` method returning (field
    descriptor, value) pairs, as protobuf messages have; an enum value comes
    back as its name when the descriptor knows it. Anything else raises
    TypeError naming the type and what is accepted.
    """
    if cs_config is None:
        return Settings()
    if isinstance(cs_config, Mapping):
        bad = [key for key in cs_config if not isinstance(key, str)]
        if bad:
            raise TypeError(f"CSRunConfig(cs_config=...): field names must be strings, got {bad!r}.")
        return Settings(cs_config)
    list_fields = getattr(cs_config, "ListFields", None)
    if not callable(list_fields):
        raise TypeError(
            f"CSRunConfig(cs_config=...) must be a dict, a CSConfig protobuf message (an object with ListFields(), "
            f"e.g. CSConfig(**params['csconfig'])) or None, got {type(cs_config).__module__}."
            f"{type(cs_config).__qualname__}."
        )
    return Settings((field.name, _enum_name(field, value)) for field, value in list_fields())


def _enum_name(field: Any, value: Any) -> Any:
    """An enum field's value as its name (protobuf gives the number), other values unchanged."""
    enum_type = getattr(field, "enum_type", None)
    if enum_type is not None and isinstance(value, int) and not isinstance(value, bool):
        known = getattr(enum_type, "values_by_number", {}).get(value)
        if known is not None:
            return known.name
    return value


def use_cbfloat16(fields: Mapping[str, Any]) -> bool:
    value = fields.get("use_cbfloat16", False)
    if not isinstance(value, bool):
        raise ValueError(f"CSRunConfig(cs_config={{'use_cbfloat16': {value!r}}}): use_cbfloat16 must be True or False.")
    return value


def num_csx(fields: Mapping[str, Any]) -> int:
    """How many CS systems the config asks for (0, protobuf's unset value, means 1)."""
    value = fields.get("num_csx", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"CSRunConfig(cs_config={{'num_csx': {value!r}}}): num_csx must be a positive integer.")
    return max(value, 1)


def num_workers_per_csx(fields: Mapping[str, Any]) -> int | None:
    """The input workers the config asks for; None for 0 or unset (the system picks)."""
    value = fields.get("num_workers_per_csx", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"CSRunConfig(cs_config={{'num_workers_per_csx': {value!r}}}): num_workers_per_csx must be an integer "
            ">= 0 (0 lets the system choose).")
    return value or None


def execution_strategy(fields: Mapping[str, Any]) -> str:
    """PIPELINE or WEIGHT_STREAMING (default pipeline); unknown values raise ValueError."""
    value = fields.get("execution_strategy", PIPELINE)
    name = getattr(value, "name", value)  # a Python enum member
    strategy = _STRATEGIES.get(name.strip().lower()) if isinstance(name, str) else None
    if strategy is None:
        raise ValueError(
            f"CSRunConfig(cs_config={{'execution_strategy': {value!r}}}): unknown execution strategy; use "
            f"'{PIPELINE}' (or ES_PIPELINE). '{WEIGHT_STREAMING}' is recognised but not supported.")
    return strategy


def warn_ignored(cs_config: Mapping[str, Any], stack_params: Mapping[str, Any], stacklevel: int = 2) -> None:
    """One warning naming every cs_config field and stack_params key the simulated system ignores."""
    ignored = sorted(name for name in cs_config if name not in HONOURED_FIELDS)
    parts = []
    if ignored:
        parts.append("cs_config fields " + ", ".join(ignored))
    if stack_params:
        parts.append("stack_params keys " + ", ".join(sorted(map(str, stack_params))))
    if parts:
        warnings.warn(
            f"CSRunConfig settings ignored by the simulated CS system: {'; '.join(parts)}. It has no appliance "
            f"cluster and its compiler takes no settings; the cs_config fields it honours are "
            f"{', '.join(HONOURED_FIELDS)}.",
            ConfigWarning, stacklevel=stacklevel + 1)
