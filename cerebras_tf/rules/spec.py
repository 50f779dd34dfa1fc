"""Rules on the EstimatorSpec a model_fn returns for a CS-system run."""
from __future__ import annotations

from typing import Any, Callable

from cerebras_tf.errors import CerebrasError, EvalMetricOpsError, HookError
from estimator import EstimatorSpec, ModeKeys
from estimator.source import function_location

_SPEC_HOOK_FIELDS = ("training_chief_hooks", "training_hooks", "evaluation_hooks", "prediction_hooks")


def describe_hook(hook: Any) -> str:
    """'ClassName (module)' for a hook or listener object."""
    cls = type(hook)
    return f"{cls.__name__} ({cls.__module__})"


def hooks_not_supported(what: str, hooks: Any, where: str | None) -> list[CerebrasError]:
    """One HookError naming every hook in `hooks`, or nothing if there are none."""
    hooks = list(hooks or [])
    if not hooks:
        return []
    names = ", ".join(describe_hook(h) for h in hooks)
    return [
        HookError(
            f"User-defined hooks are not supported on the CS system: {what} = [{names}]. The hooks would run "
            "against tensors that live on the wafer, which the host cannot read between steps (the real "
            "system fails with 'accessing a tensor that is not initialized').",
            where=where,
            fix="Remove the hooks for CS-system runs (they work with use_cs=False or cs_ip=None); stream values "
            "to the host with CSEstimatorSpec(host_call=(fn, tensors)) instead.",
        )
    ]


def check_spec(spec: EstimatorSpec, mode: str, model_fn: Callable[..., Any]) -> list[CerebrasError]:
    """No eval_metric_ops and no spec-level hooks on the CS system."""
    where = function_location(model_fn)
    problems: list[CerebrasError] = []
    if spec.eval_metric_ops:
        run = "training" if mode == ModeKeys.TRAIN else "evaluation"
        problems.append(
            EvalMetricOpsError(
                f"Detected unsupported eval_metric_ops in CS system {run} run.",
                where=where,
                fix=f"Compute metrics on the host: return CSEstimatorSpec(host_call=(metric_fn, [tensors...])) "
                f"where metric_fn returns the metric dict (found metrics: {sorted(spec.eval_metric_ops)}). "
                "eval_metric_ops still work on CPU/GPU.",
            )
        )
    for field in _SPEC_HOOK_FIELDS:
        problems += hooks_not_supported(f"EstimatorSpec.{field}", getattr(spec, field), where)
    return problems
