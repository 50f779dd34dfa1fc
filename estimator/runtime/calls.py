"""How the Estimator calls user functions: by the names of their parameters.

model_fn, input_fn and device_fn are called with only the arguments they
name (features, labels, mode, params, config, input_context), as
tf.estimator calls them, so the same functions work on both runtimes.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import tensorflow as tf

from estimator.runtime.spec import EstimatorSpec, as_estimator_spec

VALID_MODEL_FN_ARGS = frozenset({"features", "labels", "mode", "params", "self", "config"})


def fn_args(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The positional-or-keyword parameter names of `fn`.

    functools.partial drops what it binds; a callable object is its __call__;
    a bound method drops self/cls; decorators are looked through via __wrapped__.
    """
    if isinstance(fn, functools.partial):
        given = set(fn.keywords or {})
        return tuple(name for name in fn_args(fn.func)[len(fn.args):] if name not in given)
    target: Any = fn
    if not inspect.isroutine(target) and not isinstance(target, type):
        target = target.__call__  # a callable object: its bound __call__
    bound = inspect.ismethod(target)
    names = list(inspect.getfullargspec(inspect.unwrap(target.__func__ if bound else target)).args)
    if bound and names:
        names.pop(0)
    return tuple(names)


def verify_model_fn_args(model_fn: Callable[..., Any], params: Any) -> None:
    """Refuse a model_fn whose parameters cannot be called as the Estimator calls them."""
    args = set(fn_args(model_fn))
    if "features" not in args:
        raise ValueError(f"model_fn ({model_fn}) must include features argument.")
    if params is not None and "params" not in args:
        raise ValueError(f"model_fn ({model_fn}) does not include params argument, but params ({params}) is passed "
                         "to Estimator.")
    if params is None and "params" in args:
        tf.compat.v1.logging.warning("Estimator's model_fn (%s) includes params argument, but params are not "
                                     "passed to Estimator.", model_fn)
    unexpected = sorted(args - VALID_MODEL_FN_ARGS)
    if unexpected:
        raise ValueError(f"model_fn ({model_fn}) has following not expected args: {unexpected}")


def _named(args: Any, **values: Any) -> dict[str, Any]:
    """The values whose names the function's parameters `args` include (how the Estimator passes them)."""
    return {name: value for name, value in values.items() if name in args}


def call_input_fn(input_fn: Callable[..., Any], mode: str, params: Any, config: Any,
                  input_context: Any = None) -> Any:
    """input_fn(**the arguments it names), built on the CPU as tf.estimator builds input pipelines."""
    args = fn_args(input_fn)
    kwargs = _named(args, mode=mode, params=params, config=config)
    if input_context is not None and "input_context" in args:
        tf.compat.v1.logging.info("The `input_fn` accepts an `input_context` which will be given by "
                                  "DistributionStrategy")
        kwargs["input_context"] = input_context
    with tf.compat.v1.device("/cpu:0"):
        return input_fn(**kwargs)


def call_model_fn(model_fn: Callable[..., Any], features: Any, labels: Any, mode: str, params: Any,
                  config: Any) -> EstimatorSpec:
    """model_fn(features=..., **the other arguments it names), checked to return an EstimatorSpec."""
    args = fn_args(model_fn)
    kwargs: dict[str, Any] = {}
    if "labels" in args:
        kwargs["labels"] = labels
    elif labels is not None:
        raise ValueError("model_fn does not take labels, but input_fn returns labels.")
    kwargs.update(_named(args, mode=mode, params=params, config=config))
    tf.compat.v1.logging.info("Calling model_fn.")
    result = model_fn(features=features, **kwargs)
    tf.compat.v1.logging.info("Done calling model_fn.")
    return as_estimator_spec(result)


def call_logit_fn(logit_fn: Callable[..., Any], features: Any, mode: str, params: Any, config: Any) -> Any:
    """logit_fn(features=..., **the mode/params/config it names) (tf.estimator.experimental's).

    Its result must be a Tensor or a dict of string -> Tensor (ValueError otherwise), and is returned as is.
    """
    kwargs = _named(fn_args(logit_fn), mode=mode, params=params, config=config)
    logits = logit_fn(features=features, **kwargs)
    is_tensor_dict = isinstance(logits, dict) and all(
        isinstance(key, str) and isinstance(value, tf.Tensor) for key, value in logits.items())
    if not (is_tensor_dict or isinstance(logits, tf.Tensor)):
        raise ValueError("logit_fn should return a Tensor or a dictionary mapping strings to Tensors.  logit_fn "
                         f"returned: {logits}")
    return logits
