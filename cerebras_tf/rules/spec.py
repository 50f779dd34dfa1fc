"""Rules on the EstimatorSpec a model_fn returns for a CS-system run.

First that it is one: a model_fn returning None, a dict or a tuple, or
building an EstimatorSpec that tf.estimator rejects (no loss, a non-scalar
loss, a train_op or a prediction that is not a tensor), gets a ModelFnError
pointing at model_fn (the `return` line where TF shows it, else the def
line), instead of tf.estimator's ValueError/TypeError from deep inside the
capture. The CPU/GPU path leaves these to tf.estimator.
"""
from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from cerebras_tf.ir import host_call_structure
from cerebras_tf.errors import CerebrasError, EvalMetricOpsError, HookError, HostCallError, ModelFnError
from estimator import EstimatorSpec, ModeKeys
from estimator.source import creation_location, error_location, function_location, raised_within_module_of

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


_RETURN_SPEC = ("Return tf.estimator.EstimatorSpec(mode, loss=..., train_op=..., predictions=...) (or "
                "cerebras_tf.CSEstimatorSpec) from model_fn in every mode.")


def check_model_fn_result(result: Any, mode: str, model_fn: Callable[..., Any]) -> list[CerebrasError]:
    """model_fn returned an EstimatorSpec (tf.estimator's own check, "model_fn should return an EstimatorSpec.")."""
    if isinstance(result, EstimatorSpec):
        return []
    if result is None:
        got = "None (does every branch of model_fn end in `return EstimatorSpec(...)`?)"
    elif isinstance(result, dict):
        got = f"a dict with keys {sorted(map(str, result))}"
    elif isinstance(result, (tuple, list)):
        got = f"a {type(result).__name__} of {len(result)} (e.g. (loss, train_op))"
    elif isinstance(result, (tf.Tensor, tf.Operation)):
        got = f"a {'tensor' if isinstance(result, tf.Tensor) else 'tf.Operation'} ({result.name}) alone"
    else:
        got = f"{type(result).__name__} {_describe(result)}" if not hasattr(result, "as_estimator_spec") else \
            f"a {type(result).__name__}"
    fix = _RETURN_SPEC
    if hasattr(result, "as_estimator_spec"):  # TPUEstimatorSpec
        fix = ("Return cerebras_tf.CSEstimatorSpec(mode, loss=..., train_op=..., host_call=...) (host_call works as "
               "TPUEstimator's), or spec.as_estimator_spec().")
    return [ModelFnError(f"model_fn should return an EstimatorSpec; in {mode} mode it returned {got}.",
                         where=function_location(model_fn), fix=fix)]


# tf.estimator's messages for the fields of an EstimatorSpec (their beginnings) -> what to do.
_SPEC_FIELD_FIXES = (
    ("Missing loss", "Return the loss in TRAIN and EVAL mode: EstimatorSpec(mode, loss=loss, train_op=train_op)."),
    ("Loss must be scalar", "Reduce the per-example losses to one value, e.g. loss = tf.reduce_mean(per_example) "
                            "(tf.compat.v1.losses.* reduce for you)."),
    ("loss must be Tensor", "Pass the loss tensor computed in model_fn, not a Python or numpy number."),
    ("Missing train_op", "In TRAIN mode return train_op = optimizer.minimize(loss, "
                         "global_step=tf.compat.v1.train.get_global_step())."),
    ("train_op must be Operation or Tensor", "Pass the op that optimizer.minimize(loss, global_step=...) returns "
                                             "(call it), not the optimizer or the method."),
    ("Missing predictions", "In PREDICT mode return predictions: a tensor or a dict of tensors."),
    ("predictions", "Predictions must be tensors computed in model_fn (a tensor or a dict of them); convert "
                    "other values with tf.constant, or compute them on the host after predict()."),
)


def model_fn_spec_error(error: BaseException, mode: str, model_fn: Callable[..., Any]) -> list[CerebrasError]:
    """A ModelFnError for an exception tf.estimator's EstimatorSpec raised while model_fn built its spec (its
    check of the fields), pointing at the line that built it; [] for any other exception (the model's own)."""
    if not raised_within_module_of(error, EstimatorSpec):
        return []
    message = str(error)
    fix = next((fix for start, fix in _SPEC_FIELD_FIXES if message.startswith(start)),
               "Fix the EstimatorSpec's arguments (tf.estimator's message above names the field). " + _RETURN_SPEC)
    return [ModelFnError(f"model_fn's EstimatorSpec is invalid in {mode} mode: {message}",
                         where=error_location(error) or function_location(model_fn), fix=fix)]


def check_spec(spec: EstimatorSpec, mode: str, model_fn: Callable[..., Any],
               host_runs_eval_metric_ops: bool = False) -> list[CerebrasError]:
    """No eval_metric_ops, no spec-level hooks and a host_call the system can stream (check_host_call).

    eval_metric_ops are reported where the model_fn built the first of them (its ops record the line);
    hooks and host_call problems, Python objects TF records nothing about, at `def model_fn`. An
    evaluation whose stack takes eval_metric_ops (`host_runs_eval_metric_ops`: an appliance's, R1.8's CSX
    runs, and the weight-streaming container's; see CSSettings) takes them, as those stacks did: the host
    runs them over the tensors they read, which the program streams.
    """
    where = function_location(model_fn)
    problems: list[CerebrasError] = []
    if spec.eval_metric_ops and not (host_runs_eval_metric_ops and mode == ModeKeys.EVAL):
        run = "training" if mode == ModeKeys.TRAIN else "evaluation"
        metrics = spec.eval_metric_ops
        problems.append(
            EvalMetricOpsError(
                f"Detected unsupported eval_metric_ops in CS system {run} run.",
                where=creation_location([metrics[name] for name in sorted(metrics)]) or where,
                fix=f"Compute metrics on the host: return CSEstimatorSpec(host_call=(metric_fn, [tensors...])) "
                f"where metric_fn returns the metric dict (found metrics: {sorted(spec.eval_metric_ops)}). "
                "eval_metric_ops still work on CPU/GPU.",
            )
        )
    for field in _SPEC_HOOK_FIELDS:
        problems += hooks_not_supported(f"EstimatorSpec.{field}", getattr(spec, field), where)
    problems += check_host_call(getattr(spec, "host_call", None), where)
    return problems


_HOST_CALL_FIX = ("Return CSEstimatorSpec(host_call=(fn, tensors)): tensors a list/tuple (fn's positional "
                  "arguments) or a dict (its keyword arguments) of tensors or None, nested in lists, tuples and "
                  "dicts with str keys as deep as you like. Compute other values inside fn, on the host.")


def check_host_call(host_call: Any, where: str | None) -> list[CerebrasError]:
    """host_call is None or (callable, list|tuple|dict) whose leaves, at any depth, are tensors or None.

    The structure is what TPUEstimator's host_call accepts; each problem names
    the leaf's path, the program output it would be ("host_call/<i>/<key>...").
    """
    if host_call is None:
        return []
    if not isinstance(host_call, (tuple, list)) or len(host_call) != 2:
        return [HostCallError(f"host_call must be a (fn, tensors) pair, got {_describe(host_call)}.",
                              where=where, fix=_HOST_CALL_FIX)]
    fn, tensors = host_call
    problems: list[CerebrasError] = []
    if not callable(fn):
        problems.append(HostCallError(f"host_call's fn (its first element) is not callable: got {_describe(fn)}.",
                                      where=where, fix=_HOST_CALL_FIX))
    _, _, bad = host_call_structure(tensors, lambda x: isinstance(x, tf.Tensor))
    for path, item in bad:
        what = ("host_call's tensors (its second element) must be a list, tuple or dict"
                if path == "host_call" else f"{path} in host_call's tensors must be a tensor or None")
        problems.append(HostCallError(f"{what}, got {_describe(item)}; only tensors stream off the wafer.",
                                      where=where, fix=_HOST_CALL_FIX))
    return problems


def _describe(item: Any) -> str:
    if isinstance(item, dict):
        return "a dict with non-str keys"
    if isinstance(item, tuple) and hasattr(item, "_fields"):
        return f"a namedtuple ({type(item).__name__}; use a tuple or a dict)"
    if isinstance(item, (set, frozenset)):
        return f"a {type(item).__name__} (unordered; use a list or tuple)"
    if isinstance(item, tf.Tensor):
        return f"a tensor ({item.name}) where another spelling of the same path has one too"
    text = repr(item)
    return f"{type(item).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
