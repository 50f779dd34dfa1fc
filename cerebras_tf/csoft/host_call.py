"""``cerebras.tf.host_call``: a host_call checked, and turned into eval_metric_ops for plain TF.

The Model Zoo's estimator wrapper validates a spec's host_call and, outside
the Cerebras stack, evaluates it as ``eval_metric_ops``. Here both follow the
Cerebras contract: an empty host_call is ``()``; otherwise ``(fn, tensors)``
(or ``(fn, tensors, extra)``, whose third element must be a list or tuple and
is not used), ``tensors`` a list/tuple (fn's positional arguments) or dict
(keyword arguments) of tensors, None or nests of them; ``fn`` returns a dict
of metrics, or a list/tuple of them (keyed ``elem_<i>``), each a
``(value, update_op)`` pair. Problems are HostCallErrors naming the part that
is wrong (the CS-system rules' own checks, rules.spec.check_host_call).
"""
from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf

from cerebras_tf.errors import HostCallError, raise_problems
from cerebras_tf.rules.spec import check_host_call
from cerebras_tf.spec import call_host_fn
from estimator.source import caller_location

__all__ = ["host_call_to_eval_metric_ops", "validate_host_call"]

_log = logging.getLogger("tensorflow")


def validate_host_call(host_call: Any) -> Any:
    """`host_call` when it is valid (``()`` when it is empty); a HostCallError naming what is wrong else."""
    if host_call is None or (isinstance(host_call, (tuple, list)) and not host_call):
        return ()
    where = caller_location()
    if isinstance(host_call, (tuple, list)) and len(host_call) == 3:
        if not isinstance(host_call[2], (tuple, list)):
            raise HostCallError(f"host_call's third element must be a list or tuple, got "
                                f"{type(host_call[2]).__name__}.", where=where,
                                fix="Give host_call as (fn, tensors), or (fn, tensors, [extra]).")
        raise_problems(check_host_call(tuple(host_call[:2]), where))
    else:
        raise_problems(check_host_call(host_call, where))
    return host_call


def host_call_to_eval_metric_ops(host_call: Any) -> dict[str, Any]:
    """fn(*tensors) (or fn(**tensors)) as eval_metric_ops: a dict of (value, update_op) pairs."""
    host_call = validate_host_call(host_call)
    if not host_call:
        return {}
    metrics = call_host_fn((host_call[0], host_call[1]))
    if isinstance(metrics, dict):
        named = dict(metrics)
    elif isinstance(metrics, (tuple, list)):
        named = {f"elem_{index}": value for index, value in enumerate(metrics)}
    else:
        raise HostCallError(f"host_call's fn returned {type(metrics).__name__}, not a dict or list of metrics.",
                            where=caller_location(),
                            fix="Return {name: tf.compat.v1.metrics.<metric>(...)} from the host_call's fn.")
    kept = {key: value for key, value in named.items()
            if isinstance(value, (tuple, list)) and len(value) == 2 and tf.is_tensor(value[0])}
    if len(kept) < len(named):
        _log.info("host_call entries that are not (value, update_op) metric pairs are not metrics, and are left "
                  "out of eval_metric_ops: %s", ", ".join(sorted(map(str, set(named) - set(kept)))))
    return kept
