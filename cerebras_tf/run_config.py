"""CSRunConfig: a tf.estimator.RunConfig that also names the CS system to run on."""
from __future__ import annotations

import json
import os
import traceback
from typing import Any, Mapping

from estimator import RunConfig
from cerebras_tf.wse.fabric import WSE2, Fabric, fabric_by_name
from estimator.source import user_frame

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


class CSRunConfig(RunConfig):
    """RunConfig for the CerebrasEstimator.

    Args:
      cs_ip: address of the CS system ("host:port"). None runs on CPU/GPU with
        plain TensorFlow; any value selects the simulated CS system, embedded
        in this process (no network connection is made).
      system_name: name of the target system; compiled artifacts are tied to it.
        Defaults to the cs_ip.
      cs_config: dict of system settings: "fabric" is a preset name ("WSE-2",
        the default, or "WSE-1") or a cerebras_tf.wse.fabric.Fabric.
      stack_params: dict of compiler settings.
      num_input_workers: input workers streaming data to the system; defaults
        to the number of `worker` tasks in TF_CONFIG, or 1. Without TF_CONFIG
        workers, N > 1 starts N in-process tf.data service workers.
      input_worker_timeout_secs: how long the chief waits for the TF_CONFIG
        workers (`python -m cerebras_tf.input_worker`) to register.
      **kwargs: any tf.estimator.RunConfig argument. Arguments the CS system
        does not support are accepted here and refused only when a run
        targets the CS system, so the same config works on CPU/GPU.
    """

    def __init__(
        self,
        cs_ip: str | None = None,
        system_name: str | None = None,
        cs_config: Mapping[str, Any] | None = None,
        stack_params: Mapping[str, Any] | None = None,
        num_input_workers: int | None = None,
        input_worker_timeout_secs: float = DEFAULT_INPUT_WORKER_TIMEOUT_SECS,
        **kwargs: Any,
    ) -> None:
        if cs_ip is not None and (not isinstance(cs_ip, str) or not cs_ip.strip()):
            raise ValueError(f"CSRunConfig(cs_ip={cs_ip!r}): cs_ip must be a non-empty 'host:port' string or None.")
        for name, value in (("cs_config", cs_config), ("stack_params", stack_params)):
            if value is not None and not isinstance(value, Mapping):
                raise TypeError(f"CSRunConfig({name}=...) must be a dict or None, got {type(value).__name__}.")
        if num_input_workers is not None and (not isinstance(num_input_workers, int) or num_input_workers < 1):
            raise ValueError(f"CSRunConfig(num_input_workers={num_input_workers!r}) must be a positive integer.")
        if isinstance(input_worker_timeout_secs, bool) or not isinstance(input_worker_timeout_secs, (int, float)) \
                or input_worker_timeout_secs <= 0:
            raise ValueError(
                f"CSRunConfig(input_worker_timeout_secs={input_worker_timeout_secs!r}) must be a positive number."
            )
        fabric = (cs_config or {}).get("fabric", WSE2)
        if not isinstance(fabric, Fabric):
            try:
                fabric = fabric_by_name(fabric)
            except ValueError as exc:
                raise ValueError(f"CSRunConfig(cs_config={{'fabric': {fabric!r}}}): {exc}") from None
        if "save_checkpoints_steps" not in kwargs and "save_checkpoints_secs" not in kwargs:
            kwargs["save_checkpoints_steps"] = DEFAULT_SAVE_CHECKPOINTS_STEPS
        super().__init__(**kwargs)
        self._cs_ip = cs_ip
        self._system_name = system_name or cs_ip
        self._cs_config = dict(cs_config or {})
        self._fabric = fabric
        self._stack_params = dict(stack_params or {})
        self._num_input_workers = num_input_workers
        self._input_worker_timeout_secs = float(input_worker_timeout_secs)
        self._created_at = user_frame(traceback.extract_stack())

    @property
    def cs_ip(self) -> str | None:
        return self._cs_ip

    @property
    def system_name(self) -> str | None:
        return self._system_name

    @property
    def cs_config(self) -> dict[str, Any]:
        return self._cs_config

    @property
    def fabric(self) -> Fabric:
        """The wafer the compiler places the model on (cs_config["fabric"], default WSE-2)."""
        return self._fabric

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
    def num_input_workers(self) -> int:
        if self._num_input_workers is not None:
            return self._num_input_workers
        return max(1, len(self.cluster_spec.as_dict().get("worker", []))) if self.cluster_spec else 1
