"""Host-side input streaming for the simulated CS system: the chief's reader, in-process workers, and
TF_CONFIG's input workers on tf.data service.

- service: the chief's tf.data service dispatcher for TF_CONFIG workers, registration wait, shutdown.
- stream: InputStream, numpy (features, labels) batches with per-worker counts and fault handling.

TF_CONFIG parsing and where input runs (Cluster, InputPlan) live in cerebras_tf/cluster.py, which the
settings and the rules import too; they are re-exported here. Worker machines run
`python -m cerebras_tf.input_workers` (see __main__.py). `stream` and `service` are imported on first use so
that parsing TF_CONFIG needs no TensorFlow.
"""
from __future__ import annotations

import importlib
from typing import Any

from cerebras_tf.cluster import (
    Cluster,
    InputPlan,
    cluster_from_environ,
    parse_tf_config,
    plan_input_workers,
)

_LAZY = {
    "InputStream": "cerebras_tf.input_workers.stream",
    "InputStats": "cerebras_tf.input_workers.stream",
    "InputServers": "cerebras_tf.input_workers.service",
    "batch_size": "cerebras_tf.input_workers.stream",
}

__all__ = ["Cluster", "InputPlan", "InputServers", "InputStats", "InputStream", "batch_size",
           "cluster_from_environ", "parse_tf_config", "plan_input_workers"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cerebras_tf.input_workers' has no attribute {name!r}")
