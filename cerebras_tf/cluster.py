"""TF_CONFIG -> a small description of the input cluster (chief + input workers), and where input runs.

Pure functions with no TensorFlow import, in a module of its own so that
everything that needs them imports them one way: CSSettings resolves the
cluster and the input plan once per run (settings.py), the input workers
stream from it (input_workers/), and the worker command parses its own task.
The input-worker count is worked out here only (`input_worker_count`), for
CSRunConfig.num_input_workers and for the plan alike.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from cerebras_tf.errors import ConfigError, ConfigValueError

# Task types a CS-system TF_CONFIG may list. `evaluator` is accepted and ignored
# (a separate evaluation job); the CS system has no parameter servers.
KNOWN_TASK_TYPES = ("chief", "worker", "evaluator")

_EXAMPLE = (
    '{"cluster": {"chief": ["chief-host:2222"], "worker": ["worker0-host:2223", "worker1-host:2224"]}, '
    '"task": {"type": "chief", "index": 0}}'
)
_FIX = f"Set TF_CONFIG to JSON like {_EXAMPLE} (on worker machines, task type 'worker' with its index)."


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The chief (runs the simulated WSE and the training loop and hosts the
    tf.data service dispatcher) and the input workers, as "host:port" strings."""

    chief: str
    workers: tuple[str, ...] = ()
    task_type: str = "chief"
    task_index: int = 0

    @property
    def dispatcher_address(self) -> str:
        """Input workers register with the dispatcher at the chief's address."""
        return self.chief

    def worker_name(self, index: int) -> str:
        """'worker:1 (host:port)', how messages name an input worker task."""
        return f"worker:{index} ({self.workers[index]})"

    def tf_config(self, task_type: str = "chief", task_index: int = 0) -> str:
        """The TF_CONFIG JSON for one task of this cluster (e.g. to launch a worker)."""
        cluster: dict[str, list[str]] = {"chief": [self.chief]}
        if self.workers:
            cluster["worker"] = list(self.workers)
        return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": task_index}})


@dataclasses.dataclass(frozen=True)
class InputPlan:
    """Where input runs: `local` (in the chief's process, one reader), `embedded`
    (N in-process workers, no network) or `cluster` (the TF_CONFIG workers, over tf.data service)."""

    mode: str
    num_workers: int


# Reading input_fn's data in the chief's own process (what evaluation and prediction on the system do).
LOCAL_PLAN = InputPlan("local", 1)


def _error(field: str, problem: str, raw: str | None = None) -> ConfigError:
    shown = f" TF_CONFIG was {raw!r}." if raw is not None else ""
    return ConfigError(f"TF_CONFIG field '{field}': {problem}.{shown}", fix=_FIX)


def _parse_address(field: str, value: Any) -> str:
    if not isinstance(value, str) or value.count(":") != 1:
        raise _error(field, f"expected a 'host:port' string, got {value!r}")
    host, port = value.split(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _error(field, f"expected a 'host:port' string with a port in 1..65535, got {value!r}")
    return value


def _normalized(address: str) -> str:
    host, port = address.split(":")
    return f"{'127.0.0.1' if host == 'localhost' else host.lower()}:{port}"


def _json_object(raw: str) -> dict[str, Any]:
    """TF_CONFIG's JSON object, or the ConfigError naming what it is instead."""
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _error("TF_CONFIG", f"not valid JSON ({exc})", raw) from None
    if not isinstance(config, dict):
        raise _error("TF_CONFIG", f"expected a JSON object, got {type(config).__name__}", raw)
    return config


def check_tf_config_json(raw: str | None) -> None:
    """Refuse a TF_CONFIG that tf.estimator's RunConfig could not read at all (it would fail with a raw
    JSONDecodeError or AttributeError): set but empty, not JSON, not an object, or a cluster/task that is not
    an object. Everything else is left to the RunConfig (CPU/GPU distribution) and to parse_tf_config (runs
    on the CS system)."""
    if raw is None:
        return
    if not raw.strip():
        raise ConfigError("TF_CONFIG is set but empty.", fix=f"Unset TF_CONFIG, or: {_FIX}")
    config = _json_object(raw)
    for field in ("cluster", "task"):
        if field in config and not isinstance(config[field], dict):
            raise _error(field, f"expected an object, got {config[field]!r}", raw)


def parse_tf_config(raw: str | None) -> Cluster:
    """Parse and validate a TF_CONFIG string. None or "" means a lone chief with
    no input workers (input runs in the chief's process).

    Raises ConfigError naming the offending field: malformed JSON, missing chief,
    bad or duplicate addresses, unknown task types, a task not in the cluster.
    """
    if not raw:
        return Cluster(chief="localhost:2222")
    config = _json_object(raw)
    cluster = config.get("cluster")
    if not isinstance(cluster, dict):
        raise _error("cluster", "missing, or not an object mapping task types to address lists", raw)
    for task_type, addresses in cluster.items():
        if task_type not in KNOWN_TASK_TYPES:
            raise _error(
                f"cluster.{task_type}",
                f"unknown task type (the CS system uses {', '.join(KNOWN_TASK_TYPES)}; it has no parameter servers)",
                raw,
            )
        if not isinstance(addresses, list):
            raise _error(f"cluster.{task_type}", f"expected a list of 'host:port' strings, got {addresses!r}", raw)
    if "chief" not in cluster:
        raise _error("cluster.chief", "missing: the chief runs the training loop and the input dispatcher", raw)
    if len(cluster["chief"]) != 1:
        raise _error("cluster.chief", f"expected exactly one address, got {len(cluster['chief'])}", raw)

    seen: dict[str, str] = {}
    parsed: dict[str, list[str]] = {}
    for task_type, addresses in cluster.items():
        parsed[task_type] = []
        for index, value in enumerate(addresses):
            field = f"cluster.{task_type}[{index}]"
            address = _parse_address(field, value)
            key = _normalized(address)
            if key in seen:
                raise _error(field, f"duplicate address {address!r}, already used by {seen[key]}", raw)
            seen[key] = field
            parsed[task_type].append(address)

    task = config.get("task", {"type": "chief", "index": 0})
    if not isinstance(task, dict):
        raise _error("task", f"expected an object like {{\"type\": \"worker\", \"index\": 0}}, got {task!r}", raw)
    task_type = task.get("type", "chief")
    task_index = task.get("index", 0)
    if task_type not in parsed:
        raise _error("task.type", f"{task_type!r} is not a task type listed under 'cluster'", raw)
    if not isinstance(task_index, int) or isinstance(task_index, bool) or not 0 <= task_index < len(parsed[task_type]):
        raise _error(
            "task.index",
            f"{task_index!r} is out of range: cluster.{task_type} has {len(parsed[task_type])} address(es)",
            raw,
        )
    return Cluster(
        chief=parsed["chief"][0],
        workers=tuple(parsed.get("worker", ())),
        task_type=task_type,
        task_index=task_index,
    )


def cluster_from_environ(environ: Mapping[str, str] = os.environ) -> Cluster:
    """parse_tf_config(TF_CONFIG from the environment)."""
    return parse_tf_config(environ.get("TF_CONFIG"))


def check_num_input_workers(value: Any, caller: str = "CSRunConfig") -> int | None:
    """`value` as an explicit input-worker count: None (not given) or a positive integer (not a bool), else
    ConfigValueError (a ValueError).

    The one check of the count's type and range, made where a caller hands the
    count in (CSRunConfig when it is built, InputStream given a count directly),
    so the plan below and CSSettings take it as valid.
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigValueError(f"{caller}(num_input_workers={value!r}) must be a positive integer.",
                               fix="Give the number of input workers as an int >= 1 (e.g. num_input_workers=2), "
                                   "or leave it out: TF_CONFIG's workers, else 1.")
    return value


def input_worker_count(num_input_workers: int | None, tf_config_workers: int) -> int:
    """How many input workers a run asks for: the explicit count, else the TF_CONFIG `worker` tasks, else 1."""
    return num_input_workers if num_input_workers is not None else max(1, tf_config_workers)


def plan_input_workers(cluster: Cluster, num_input_workers: int | None = None) -> InputPlan:
    """Decide where input runs, for a count check_num_input_workers accepted.

    TF_CONFIG workers listed: `cluster` mode with those workers (num_input_workers,
    if given, must match: ConfigError otherwise). Otherwise num_input_workers > 1
    reads with that many in-process workers; 1 or None runs input locally.
    """
    if cluster.workers:
        if num_input_workers is not None and num_input_workers != len(cluster.workers):
            raise ConfigError(
                f"num_input_workers={num_input_workers} does not match the {len(cluster.workers)} task(s) in "
                f"TF_CONFIG field 'cluster.worker' ({', '.join(cluster.workers)}).",
                fix="Leave num_input_workers unset when TF_CONFIG lists the workers, or list that many workers.",
            )
        return InputPlan("cluster", len(cluster.workers))
    count = input_worker_count(num_input_workers, 0)
    return InputPlan("embedded" if count > 1 else "local", count)
