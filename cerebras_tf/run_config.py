"""CSRunConfig: a tf.estimator.RunConfig that also names the CS system to run on."""
from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping

from cerebras_tf.cluster import check_num_input_workers, check_tf_config_json, input_worker_count
from cerebras_tf.cs_config import (
    ApplianceCSConfig,
    Settings,
    cs_config_fields,
    execution_strategy,
    num_csx,
    num_workers_per_csx,
    use_cbfloat16,
    warn_ignored,
)
from cerebras_tf.errors import ConfigError, ConfigValueError
from cerebras_tf.wse.fabric import WSE2, Fabric, fabric_by_name
from estimator import RunConfig
from estimator.source import caller_location

# CSRunConfig checkpoints by steps (tf.estimator.RunConfig defaults to every
# 600 seconds, which the CS system does not support).
DEFAULT_SAVE_CHECKPOINTS_STEPS = 1000

# A TF_CONFIG for a single chief with no separate input workers.
DEFAULT_TF_CONFIG: dict[str, Any] = {
    "cluster": {"chief": ["localhost:2222"]},
    "task": {"type": "chief", "index": 0},
}


# How long the chief waits for the TF_CONFIG input workers to register.
DEFAULT_INPUT_WORKER_TIMEOUT_SECS = 120.0


def set_default_tf_config() -> None:
    """Set TF_CONFIG to a single-chief cluster unless the environment already has one."""
    os.environ.setdefault("TF_CONFIG", json.dumps(DEFAULT_TF_CONFIG))


_ADDRESS = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[^\s:\[\]/]+)(?::(\d{1,5}))?")


def _is_address(cs_ip: str) -> bool:
    """'host' or 'host:port' (port 1-65535), the host a name, an IPv4 address or a bracketed IPv6 address."""
    match = _ADDRESS.fullmatch(cs_ip.strip())
    return match is not None and (match.group(1) is None or 1 <= int(match.group(1)) <= 65535)


class CSRunConfig(RunConfig):
    """RunConfig for the CerebrasEstimator.

    Args:
      cs_ip: address of the CS system ("host:port"). None runs on CPU/GPU with
        plain TensorFlow (unless cs_config is the appliance's CSConfig); any
        value selects the simulated CS system, embedded in this process (no
        network connection is made).
      system_name: name of the target system; compiled artifacts are tied to it.
        Defaults to the cs_ip.
      cs_config: system settings, a dict or a protobuf-like CSConfig message
        (anything with ListFields(), as the Model Zoo passes), normalised once
        into a dict of its set fields (see cerebras_tf/cs_config.py):
        "fabric" is a preset name ("WSE-2", the default, or "WSE-1") or a
        cerebras_tf.wse.fabric.Fabric; use_cbfloat16=True makes this config's
        runs on the simulated system use the cbfloat16 half dtype (it wins over
        amp.set_half_dtype; False or unset keeps amp's process-wide choice);
        num_workers_per_csx=N >= 1 sets num_input_workers; execution_strategy
        chooses pipelined or weight streaming execution (num_csx > 1 only with
        weight streaming: that many systems train data parallel, each on its
        own batch; evaluation and prediction run on one); other
        fields are ignored with one ConfigWarning. The
        appliance's CSConfig (cs_config.ApplianceCSConfig, what R1.8's
        run_appliance builds) with no cs_ip selects the simulated CS system
        for use_cs=True runs: no appliance cluster is reachable from here, so
        the embedded one stands in for it (mgmt_address is never contacted).
      stack_params: dict of compiler settings (values may be any objects, e.g.
        protobuf messages); ignored by the simulated system, with one
        ConfigWarning naming the keys.
      num_input_workers: input workers streaming data to the system; defaults
        to cs_config's num_workers_per_csx, else the number of `worker` tasks
        in TF_CONFIG, or 1. Without TF_CONFIG workers, N > 1 starts N
        in-process tf.data service workers.
      input_worker_timeout_secs: how long the chief waits for the TF_CONFIG
        workers (`python -m cerebras_tf.input_workers`) to register.
      **kwargs: any tf.estimator.RunConfig argument. Arguments the CS system
        does not support are accepted here and refused only when a run
        targets the CS system, so the same config works on CPU/GPU.
    """

    def __init__(
        self,
        cs_ip: str | None = None,
        system_name: str | None = None,
        cs_config: Mapping[str, Any] | Any | None = None,
        stack_params: Mapping[str, Any] | None = None,
        num_input_workers: int | None = None,
        input_worker_timeout_secs: float = DEFAULT_INPUT_WORKER_TIMEOUT_SECS,
        **kwargs: Any,
    ) -> None:
        if cs_ip is not None and (not isinstance(cs_ip, str) or not cs_ip.strip()):
            raise ConfigValueError(
                f"CSRunConfig(cs_ip={cs_ip!r}): cs_ip must be a non-empty 'host:port' string or None.",
                fix="Pass cs_ip='host:port' to target the CS system, or None for CPU/GPU.")
        if cs_ip is not None and not _is_address(cs_ip):
            raise ConfigValueError(
                f"CSRunConfig(cs_ip={cs_ip!r}): cs_ip must be 'host' or 'host:port' (a port from 1 to 65535; an "
                "IPv6 host in brackets).",
                fix="Pass one host and at most one port, e.g. cs_ip='10.0.0.1:9000'. The Model Zoo's run.py adds "
                    "':9000' to its --cs_ip itself: pass it the host alone (--cs_ip 10.0.0.1).")
        try:
            fields = cs_config_fields(cs_config)
            workers_per_csx = num_workers_per_csx(fields)
            half_dtype = "cbfloat16" if use_cbfloat16(fields) else None
            systems, strategy = num_csx(fields), execution_strategy(fields)
        except ConfigError as exc:  # say where the config was built
            raise type(exc)(exc.message, where=exc.where or caller_location(), fix=exc.fix) from None
        if stack_params is not None and not isinstance(stack_params, Mapping):
            raise TypeError(f"CSRunConfig(stack_params=...) must be a dict or None, got {type(stack_params).__name__}.")
        if num_input_workers is None:
            num_input_workers = workers_per_csx
        elif workers_per_csx is not None and workers_per_csx != num_input_workers:
            raise ConfigValueError(f"CSRunConfig(num_input_workers={num_input_workers!r}) contradicts cs_config's "
                                   f"num_workers_per_csx={workers_per_csx}.", fix="Give one of them.")
        check_num_input_workers(num_input_workers)
        if isinstance(input_worker_timeout_secs, bool) or not isinstance(input_worker_timeout_secs, (int, float)) \
                or input_worker_timeout_secs <= 0:
            raise ConfigValueError(
                f"CSRunConfig(input_worker_timeout_secs={input_worker_timeout_secs!r}) must be a positive number.",
                fix="Give the seconds the chief waits for the TF_CONFIG input workers, e.g. 120."
            )
        fabric = fields.get("fabric", WSE2)
        if not isinstance(fabric, Fabric):
            try:
                fabric = fabric_by_name(fabric)
            except ValueError as exc:
                raise ValueError(f"CSRunConfig(cs_config={{'fabric': {fabric!r}}}): {exc}") from None
        try:  # the parent reads TF_CONFIG and fails on a malformed one with a raw JSON/attribute error
            check_tf_config_json(os.environ.get("TF_CONFIG"))
        except ConfigError as exc:
            raise ConfigError(exc.message, where=caller_location(), fix=exc.fix) from None
        if "save_checkpoints_steps" not in kwargs and "save_checkpoints_secs" not in kwargs:
            kwargs["save_checkpoints_steps"] = DEFAULT_SAVE_CHECKPOINTS_STEPS
        super().__init__(**kwargs)
        self._cs_ip = cs_ip
        self._appliance = cs_ip is None and isinstance(cs_config, ApplianceCSConfig)
        self._system_name = system_name or cs_ip
        self._cs_config = fields
        self._fabric = fabric
        self._half_dtype = half_dtype
        self._num_csx = systems
        self._execution_strategy = strategy
        self._stack_params = Settings(stack_params or {})
        self._num_input_workers = num_input_workers
        self._input_worker_timeout_secs = float(input_worker_timeout_secs)
        self._created_at = caller_location()
        warn_ignored(fields, self._stack_params, stacklevel=2)

    @property
    def cs_ip(self) -> str | None:
        return self._cs_ip

    @property
    def appliance(self) -> bool:
        """Whether this config names an appliance (the appliance's CSConfig, no cs_ip): use_cs=True runs go to
        the simulated CS system standing in for it."""
        return self._appliance

    @property
    def system_name(self) -> str | None:
        return self._system_name

    @property
    def cs_config(self) -> dict[str, Any]:
        """cs_config's fields as a dict (a protobuf message's set fields, enum values by name)."""
        return self._cs_config

    @property
    def fabric(self) -> Fabric:
        """The wafer the compiler places the model on (cs_config["fabric"], default WSE-2)."""
        return self._fabric

    @property
    def half_dtype(self) -> str | None:
        """The half dtype of this config's runs on the simulated system ("cbfloat16" with
        cs_config use_cbfloat16=True), or None: amp.get_half_dtype() when the run starts."""
        return self._half_dtype

    @property
    def num_csx(self) -> int:
        """CS systems asked for (cs_config num_csx, default 1): more than 1 trains data parallel in weight streaming."""
        return self._num_csx

    @property
    def execution_strategy(self) -> str:
        """cs_config's execution strategy, "pipeline" (default) or "weight_streaming"."""
        return self._execution_strategy

    @property
    def stack_params(self) -> dict[str, Any]:
        return self._stack_params

    @property
    def created_at(self) -> str | None:
        """'file:line' of the user code that built this config."""
        return self._created_at

    @property
    def input_worker_timeout_secs(self) -> float:
        return self._input_worker_timeout_secs

    @property
    def requested_input_workers(self) -> int | None:
        """num_input_workers (or cs_config's num_workers_per_csx) as given; None: TF_CONFIG decides when a run
        starts (see CSSettings)."""
        return self._num_input_workers

    @property
    def num_input_workers(self) -> int:
        """The input workers this config asks for, with the TF_CONFIG of when it was built."""
        workers = len(self.cluster_spec.as_dict().get("worker", [])) if self.cluster_spec else 0
        return input_worker_count(self._num_input_workers, workers)
