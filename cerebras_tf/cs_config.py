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
num_csx              weight streaming: N data-parallel systems (estimate, training); eval uses 1
execution_strategy   honoured: pipeline (placement) or weight streaming (timing)
anything else        ignored, with one warning per config naming the fields
==================== ==========================================================

Every stack_params key is ignored (the simulated compiler takes no settings),
named in that same warning. This module never imports TensorFlow.

R1.8's appliance flow builds its cs_config as :class:`ApplianceCSConfig` (the
appliance's ``CSConfig``: cluster settings, ``DebugArgs`` carrying the
compiler's FullConfig as JSON, the execution strategy) and no cs_ip: such a
config selects the simulated CS system for ``use_cs=True`` runs, as the
appliance's estimator sends them to the cluster.
"""
from __future__ import annotations

import dataclasses
import json
import warnings
from typing import Any, Mapping, Sequence

from cerebras_tf.errors import ConfigTypeError, ConfigValueError, ConfigWarning

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
    if isinstance(cs_config, ApplianceCSConfig):
        return Settings(cs_config.fields())
    if isinstance(cs_config, Mapping):
        bad = [key for key in cs_config if not isinstance(key, str)]
        if bad:
            raise ConfigTypeError(f"CSRunConfig(cs_config=...): field names must be strings, got {bad!r}.",
                                  fix="Name each cs_config field by a string, e.g. {'use_cbfloat16': True}.")
        return Settings(cs_config)
    list_fields = getattr(cs_config, "ListFields", None)
    if not callable(list_fields):
        raise ConfigTypeError(
            f"CSRunConfig(cs_config=...) must be a dict, a CSConfig protobuf message (an object with ListFields(), "
            f"e.g. CSConfig(**params['csconfig'])), the appliance's CSConfig or None, got "
            f"{type(cs_config).__module__}.{type(cs_config).__qualname__}.",
            fix="Pass the CSConfig message or a dict of its fields (or None), not "
                f"{type(cs_config).__qualname__} {cs_config!r:.60}.")
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
        raise ConfigValueError(f"CSRunConfig(cs_config={{'use_cbfloat16': {value!r}}}): use_cbfloat16 must be True or "
                               "False.", fix="Set use_cbfloat16 to True or False (a YAML boolean).")
    return value


def num_csx(fields: Mapping[str, Any]) -> int:
    """How many CS systems the config asks for (0, protobuf's unset value, means 1)."""
    value = fields.get("num_csx", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigValueError(f"CSRunConfig(cs_config={{'num_csx': {value!r}}}): num_csx must be a positive "
                               "integer.",
                               fix="Set num_csx=1, or the number of CS systems to train on (weight streaming).")
    return max(value, 1)


def num_workers_per_csx(fields: Mapping[str, Any]) -> int | None:
    """The input workers the config asks for; None for 0 or unset (the system picks)."""
    value = fields.get("num_workers_per_csx", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigValueError(
            f"CSRunConfig(cs_config={{'num_workers_per_csx': {value!r}}}): num_workers_per_csx must be an integer "
            ">= 0.", fix="Give the number of input workers, or 0 to let the system choose.")
    return value or None


def execution_strategy(fields: Mapping[str, Any]) -> str:
    """PIPELINE or WEIGHT_STREAMING (default pipeline); unknown values raise ConfigValueError."""
    value = fields.get("execution_strategy", PIPELINE)
    name = getattr(value, "name", value)  # a Python enum member
    strategy = _STRATEGIES.get(name.strip().lower()) if isinstance(name, str) else None
    if strategy is None:
        raise ConfigValueError(
            f"CSRunConfig(cs_config={{'execution_strategy': {value!r}}}): unknown execution strategy.",
            fix=f"Use '{PIPELINE}' (ES_PIPELINE) or '{WEIGHT_STREAMING}' (ES_WEIGHT_STREAMING), or leave it out for "
                "the estimator's default (pipeline; weight streaming for the weight-streaming stack's estimator).")
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


# The appliance CSConfig's fields and the types each takes (None: unset).
_APPLIANCE_INTS = ("num_csx", "max_wgt_servers", "max_act_per_csx", "transfer_processes", "num_workers_per_csx",
                   "job_time_sec")
_APPLIANCE_STRINGS = ("mgmt_address", "mgmt_namespace", "credentials_path")
_APPLIANCE_STRING_LISTS = ("mount_dirs", "python_paths", "job_labels")
# ExecutionStrategy enum numbers (cerebras_tf/cs_messages.py) by the names execution_strategy() reads.
_STRATEGY_NUMBERS = {1: "ES_PIPELINE", 2: "ES_WEIGHT_STREAMING"}
FULL_CONFIG_FIELD = "debug_args.debug_crd.pipeline_options.full_config"


@dataclasses.dataclass
class ApplianceCSConfig:
    """The appliance's ``CSConfig`` (R1.8's ``cerebras_appliance.CSConfig.CSConfig``): cluster settings.

    Built by the Model Zoo's ``run_appliance`` with keyword arguments; every
    argument is optional (None: unset) and checked here, a wrong one raising
    ConfigTypeError/ConfigValueError naming it. ``execution_strategy`` takes
    the ``ExecutionStrategy`` enum (ES_PIPELINE, ES_WEIGHT_STREAMING) or its
    name; ``debug_args`` a ``DebugArgs`` message, whose FullConfig JSON
    (``debug_crd.pipeline_options.full_config``) must parse as a FullConfig.
    A CSRunConfig with this cs_config and no cs_ip runs ``use_cs=True`` calls
    on the simulated CS system, as the appliance's estimator runs them on the
    cluster; the simulated system honours num_csx, num_workers_per_csx and
    execution_strategy (see the table above) and names the rest in its
    ConfigWarning.
    """

    num_csx: int | None = None
    max_wgt_servers: int | None = None
    max_act_per_csx: int | None = None
    mgmt_address: str | None = None
    mgmt_namespace: str | None = None
    credentials_path: str | None = None
    debug_args: Any = None
    mount_dirs: Sequence[str] | None = None
    python_paths: Sequence[str] | None = None
    transfer_processes: int | None = None
    num_workers_per_csx: int | None = None
    execution_strategy: Any = None
    job_labels: Sequence[str] | None = None
    job_time_sec: int | None = None
    disable_version_check: bool | None = None

    def __post_init__(self) -> None:
        for name in _APPLIANCE_INTS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                self._refuse(ConfigValueError, name, "an integer >= 0", value)
        for name in _APPLIANCE_STRINGS:
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                self._refuse(ConfigTypeError, name, "a string", getattr(self, name))
        for name in _APPLIANCE_STRING_LISTS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, str) or not isinstance(value, (list, tuple))
                                      or not all(isinstance(item, str) for item in value)):
                self._refuse(ConfigTypeError, name, "a list of strings", value)
        if self.disable_version_check is not None and not isinstance(self.disable_version_check, bool):
            self._refuse(ConfigTypeError, "disable_version_check", "True or False", self.disable_version_check)
        strategy = self.execution_strategy
        if isinstance(strategy, int) and not isinstance(strategy, bool):
            if strategy not in _STRATEGY_NUMBERS:
                self._refuse(ConfigValueError, "execution_strategy", "ExecutionStrategy.ES_PIPELINE (or "
                             "ES_WEIGHT_STREAMING)", strategy)
            self.execution_strategy = _STRATEGY_NUMBERS[strategy]
        if self.execution_strategy is not None:
            try:
                execution_strategy({"execution_strategy": self.execution_strategy})
            except ConfigValueError as exc:
                raise ConfigValueError(f"CSConfig(execution_strategy={strategy!r}): unknown execution strategy.",
                                       where=_where(), fix=exc.fix) from None
        if self.debug_args is not None:
            check_debug_args(self.debug_args)

    def fields(self) -> dict[str, Any]:
        """The set fields, by name (execution_strategy by its enum name), as cs_config_fields reads them."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if getattr(self, field.name) is not None}

    @staticmethod
    def _refuse(error: type[ConfigTypeError] | type[ConfigValueError], name: str, expected: str, value: Any) -> None:
        raise error(f"CSConfig({name}={value!r:.80}): {name} must be {expected}.", where=_where(),
                    fix=f"Give {name} as {expected}, or leave it out.")


def check_debug_args(debug_args: Any) -> None:
    """Refuse a DebugArgs that is not a message, or whose FullConfig JSON does not parse as a FullConfig."""
    if getattr(debug_args, "DESCRIPTOR", None) is None or debug_args.DESCRIPTOR.name != "DebugArgs":
        raise ConfigTypeError(f"CSConfig(debug_args=...) must be a DebugArgs message, got "
                              f"{type(debug_args).__qualname__}.", where=_where(),
                              fix="Build it with DebugArgs() (or the zoo's get_debug_args), or leave it out.")
    text = debug_args.debug_crd.pipeline_options.full_config
    if not text:
        return
    from google.protobuf import json_format

    from cerebras_tf.cs_messages import FullConfig

    try:
        json.loads(text)
        json_format.Parse(text, FullConfig())
    except (ValueError, json_format.ParseError) as exc:
        raise ConfigValueError(
            f"CSConfig(debug_args=...): {FULL_CONFIG_FIELD} is not a FullConfig in JSON: {exc}", where=_where(),
            fix="Serialise the FullConfig with google.protobuf.json_format.MessageToJson (as the zoo's "
                "update_debug_args_from_stack_params does), or leave the field empty.") from None


def _where() -> str | None:
    """The user code that built the config (imported here: the estimator layer brings in TensorFlow)."""
    from estimator.source import caller_location

    return caller_location()
