"""CSEstimatorSpec: an EstimatorSpec with a host_call for metrics computed on the host."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from estimator import EstimatorSpec, ModeKeys

HostCall = tuple[Callable[..., Any], Sequence[Any] | dict[str, Any]]


class CSEstimatorSpec(EstimatorSpec):
    """EstimatorSpec plus `host_call = (fn, tensors)`.

    On the CS system `fn` runs on the host over `tensors` streamed off the
    wafer; that is how metrics are computed there. `fn` takes the tensors
    positionally (a list/tuple) or by name (a dict) and returns a dict of
    metrics, like `eval_metric_ops`. As with TPUEstimator, each argument may be
    a tensor, None, or lists, tuples and dicts of them nested at any depth
    (e.g. `[(logits, ids), None, features]`); fn gets the same nest. On CPU/GPU
    the CerebrasEstimator turns the host_call of an EVAL spec into
    eval_metric_ops, so the same model_fn evaluates everywhere; in TRAIN and
    PREDICT it is not called there. The structure is checked when the spec is
    used: by the CS-system rules (a HostCallError naming the path of a bad
    leaf), or on CPU/GPU by `validate_host_call`.
    """

    def __new__(cls, mode: str, host_call: HostCall | None = None, **kwargs: Any) -> "CSEstimatorSpec":
        spec = super().__new__(cls, mode, **kwargs)
        spec.host_call = host_call
        return spec


def validate_host_call(host_call: Any) -> None:
    """Raise a clear error unless host_call is None or (callable, list/tuple/dict): the CPU/GPU check.

    The leaves are fn's business there; the CS-system rules also check them
    (rules.spec.check_host_call).
    """
    if host_call is None:
        return
    if not isinstance(host_call, (tuple, list)) or len(host_call) != 2:
        raise ValueError(f"host_call must be a (fn, tensors) pair, got {host_call!r}.")
    fn, tensors = host_call
    if not callable(fn):
        raise ValueError(f"host_call's first element must be callable, got {type(fn).__name__}.")
    if not isinstance(tensors, (tuple, list, dict)):
        raise ValueError(f"host_call's tensors must be a list, tuple or dict, got {type(tensors).__name__}.")


def call_host_fn(host_call: HostCall) -> Any:
    """Call host_call's fn over its tensors (positionally or by name)."""
    fn, tensors = host_call
    return fn(**tensors) if isinstance(tensors, dict) else fn(*tensors)


def to_plain_spec(spec: EstimatorSpec, mode: str) -> EstimatorSpec:
    """The EstimatorSpec plain tf.estimator runs: an EVAL host_call becomes eval_metric_ops."""
    host_call = getattr(spec, "host_call", None)
    if type(spec) is EstimatorSpec:
        return spec
    validate_host_call(host_call)
    fields = spec._asdict()
    if host_call is not None and mode == ModeKeys.EVAL:
        metrics = call_host_fn(host_call)
        if not isinstance(metrics, dict):
            raise ValueError(
                f"host_call fn {getattr(host_call[0], '__name__', host_call[0])} must return a dict of metrics "
                f"(name -> (value_op, update_op)) in EVAL mode, got {type(metrics).__name__}."
            )
        clash = set(metrics) & set(fields["eval_metric_ops"] or {})
        if clash:
            raise ValueError(f"host_call metrics {sorted(clash)} clash with eval_metric_ops of the same name.")
        fields["eval_metric_ops"] = {**(fields["eval_metric_ops"] or {}), **metrics}
    return EstimatorSpec(**fields)
