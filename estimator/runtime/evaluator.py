"""Estimator.evaluate's graph, loop and results.

The EVAL graph adds a `loss` metric (the mean loss over batches) to the
model's eval_metric_ops and the global step to the results. The loop runs
every metric's update op once per batch from the checkpoint (or fresh
initial values, or a warm start when there is none) until `steps` batches
or the end of the input, then reads the metric values once. The results are
logged ("Saving dict for global step N: ...") and written as summaries to
model_dir/eval (or eval_<name>), with the checkpoint path, as tf.estimator
writes them, so TensorBoard shows evaluation beside training.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np
import tensorflow as tf

from estimator.runtime.hooks import StopAfterNEvalsHook, eval_step_counter
from estimator.runtime.mode_keys import ModeKeys
from estimator.runtime.spec import LOSS_METRIC_KEY
from estimator.runtime.warm_start import maybe_warm_start

if TYPE_CHECKING:
    from estimator.runtime.estimator import Estimator

GLOBAL_STEP_KEY = tf.compat.v1.GraphKeys.GLOBAL_STEP


def evaluate_model(estimator: "Estimator", input_fn: Callable[..., Any], hooks: list[Any],
                   checkpoint_path: str | None, output_dir: str) -> dict[str, Any]:
    """Build the EVAL graph, run it from `checkpoint_path` and write the results to `output_dir`."""
    with tf.Graph().as_default():
        graph = build_eval_graph(estimator, input_fn, hooks, checkpoint_path)
        return run_eval(estimator, graph, checkpoint_path, output_dir)


class EvalGraph(NamedTuple):
    """The EVAL graph's parts run_eval needs: built once, runnable more than once (InMemoryEvaluatorHook)."""

    scaffold: Any
    update_op: Any  # every metric's update
    metrics: dict[str, Any]  # name -> value tensor, `loss` and `global_step` included
    hooks: list[Any]  # the input's, the caller's and the spec's evaluation hooks


def build_eval_graph(estimator: Any, input_fn: Callable[..., Any], hooks: list[Any],
                     checkpoint_path: str | None) -> EvalGraph:
    """Build the EVAL graph in the current graph: input, model_fn, the metrics (`loss` and `global_step`
    added) and, without a checkpoint to restore, the warm start.

    Uses only the Estimator members tf.estimator's Estimator has too, so tf.estimator's estimators (canned
    ones on TF 2.15) can be evaluated this way (InMemoryEvaluatorHook)."""
    graph = tf.compat.v1.get_default_graph()
    tf.compat.v1.random.set_random_seed(estimator.config.tf_random_seed)
    estimator._create_and_assert_global_step(graph)
    features, labels, input_hooks = estimator._get_features_and_labels_from_input_fn(input_fn, ModeKeys.EVAL)
    spec = estimator._call_model_fn(features, labels, ModeKeys.EVAL, estimator.config)
    update_op, metrics = _metric_ops(spec.eval_metric_ops, spec.loss)
    return eval_graph_of(estimator, spec.scaffold, update_op, metrics,
                         [*input_hooks, *hooks, *spec.evaluation_hooks], checkpoint_path)


def eval_graph_of(estimator: Any, scaffold: Any, update_op: Any, metrics: dict[str, Any], hooks: list[Any],
                  checkpoint_path: str | None) -> EvalGraph:
    """The EVAL graph built up to the metrics, completed: the warm start (without a checkpoint), the
    `global_step` result, and a local init op that also initializes the eval step counter."""
    global_step = tf.compat.v1.train.get_global_step()
    if not checkpoint_path:
        maybe_warm_start(getattr(estimator, "_warm_start_settings", None))
    if GLOBAL_STEP_KEY in metrics:
        raise ValueError("Metric with name `global_step` is not allowed, because Estimator already defines a "
                         "default metric with the same name.")
    metrics[GLOBAL_STEP_KEY] = global_step
    if scaffold.local_init_op is not None:
        eval_step_counter()  # the model's own local_init_op must not leave the eval step uninitialized
        scaffold = tf.compat.v1.train.Scaffold(
            local_init_op=tf.group(scaffold.local_init_op, tf.compat.v1.train.Scaffold.default_local_init_op()),
            copy_from_scaffold=scaffold)
    return EvalGraph(scaffold, update_op, metrics, hooks)


def run_evaluation(estimator: "Estimator", scaffold: Any, update_op: Any, metrics: dict[str, Any],
                   hooks: list[Any], checkpoint_path: str | None, output_dir: str) -> dict[str, Any]:
    """In the EVAL graph built up to the metrics (a strategy's, distributed.py): complete it, run it from
    `checkpoint_path` (or a warm start) and write the results (with global_step) to `output_dir`."""
    graph = eval_graph_of(estimator, scaffold, update_op, metrics, hooks, checkpoint_path)
    return run_eval(estimator, graph, checkpoint_path, output_dir)


def run_eval(estimator: Any, graph: EvalGraph, checkpoint_path: str | None, output_dir: str) -> dict[str, Any]:
    """Run a built EVAL graph (in the current graph) from `checkpoint_path`; write and return the results."""
    results = _run(estimator, graph.scaffold, graph.update_op, graph.metrics, graph.hooks, checkpoint_path)
    step = int(results[GLOBAL_STEP_KEY])
    write_dict_to_summary(output_dir, results, step)  # in the graph: v1 summary writers refuse eager mode
    if checkpoint_path:
        _write_checkpoint_path(output_dir, checkpoint_path, step)
    return results


def _metric_ops(eval_metric_ops: dict[str, Any], loss: Any) -> tuple[Any, dict[str, Any]]:
    """(one op running every metric's update, {name: value tensor}), with the `loss` metric added."""
    if LOSS_METRIC_KEY in eval_metric_ops:
        raise ValueError(f'Metric with name "{LOSS_METRIC_KEY}" is not allowed, because Estimator already defines '
                         "a default metric with the same name.")
    metric_ops = {**eval_metric_ops, LOSS_METRIC_KEY: tf.compat.v1.metrics.mean(loss)}
    names = sorted(metric_ops)
    update_op = tf.group(*[metric_ops[name][1] for name in names])
    return update_op, {name: metric_ops[name][0] for name in names}


def _run(estimator: Any, scaffold: Any, update_op: Any, metrics: dict[str, Any], hooks: list[Any],
         checkpoint_path: str | None) -> dict[str, Any]:
    """Run the metric updates batch by batch, then read the metric values once."""
    eval_step = eval_step_counter()
    eval_ops = [update_op, tf.compat.v1.assign_add(eval_step, 1, use_locking=True)]
    with tf.control_dependencies(eval_ops):
        evals_completed = tf.identity(eval_step.read_value())
    for hook in hooks:
        if isinstance(hook, StopAfterNEvalsHook):
            hook.set_evals_completed_tensor(evals_completed)
    tf.compat.v1.logging.info("Starting evaluation at " + time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime()))
    started = time.time()
    final_ops = tf.compat.v1.train.FinalOpsHook(metrics)
    creator = tf.compat.v1.train.ChiefSessionCreator(
        scaffold=scaffold, checkpoint_filename_with_path=checkpoint_path, master=estimator.config.evaluation_master,
        config=estimator.config.session_config)
    with tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=[*hooks, final_ops]) as session:
        while not session.should_stop():
            session.run(eval_ops)
    tf.compat.v1.logging.info(f"Inference Time : {time.time() - started:0.5f}s")
    tf.compat.v1.logging.info("Finished evaluation at " + time.strftime("%Y-%m-%d-%H:%M:%S", time.localtime()))
    return final_ops.final_ops_values


def dict_to_str(results: dict[str, Any]) -> str:
    """'a = 1, b = 2' over the sorted keys, leaving out serialized summaries."""
    # "%s" (str), not an f-string: format() would print a numpy float32 with float64 digits.
    return ", ".join("%s = %s" % (key, value) for key, value in sorted(results.items())
                     if not isinstance(value, bytes))


def write_dict_to_summary(output_dir: str, results: dict[str, Any], global_step: int) -> None:
    """Log the results and write them as summaries at `global_step` (global_step itself left out)."""
    tf.compat.v1.logging.info("Saving dict for global step %d: %s", global_step, dict_to_str(results))
    summary = tf.compat.v1.Summary()
    for key, value in results.items():
        if value is None or key == GLOBAL_STEP_KEY:
            continue
        if isinstance(value, (np.float32, float)):
            summary.value.add(tag=key, simple_value=float(value))
        elif isinstance(value, (np.int64, np.int32, int)):
            summary.value.add(tag=key, simple_value=int(value))
        elif isinstance(value, bytes):
            _add_serialized_summary(summary, key, value)
        elif isinstance(value, np.ndarray):
            entry = summary.value.add(tag=key, node_name=key)
            entry.tensor.CopyFrom(tf.make_tensor_proto(value))
            tf.compat.v1.logging.info("Summary for np.ndarray is not visible in Tensorboard by default. Consider "
                                      "using a Tensorboard plugin for visualization.")
        else:
            tf.compat.v1.logging.warning("Skipping summary for %s, must be a float, np.float32, np.int64, np.int32 "
                                         "or int or np.ndarray or a serialized string of Summary.", key)
    writer = tf.compat.v1.summary.FileWriterCache.get(output_dir)
    writer.add_summary(summary, global_step)
    writer.flush()


def _add_serialized_summary(summary: Any, key: str, value: bytes) -> None:
    """A metric whose value is a serialized Summary (e.g. an image): its values, tagged key/0, key/1, ..."""
    try:
        parsed = tf.compat.v1.Summary.FromString(value)
    except Exception:  # protobuf's DecodeError: not a Summary
        tf.compat.v1.logging.warning("Skipping summary for %s, cannot parse string to Summary.", key)
        return
    for i, entry in enumerate(parsed.value):
        entry.tag = f"{key}/{i}"
    summary.value.extend(parsed.value)


def _write_checkpoint_path(output_dir: str, checkpoint_path: str, global_step: int) -> None:
    """Record which checkpoint was evaluated (a `checkpoint_path` text summary)."""
    tf.compat.v1.logging.info("Saving 'checkpoint_path' summary for global step %d: %s", global_step,
                              checkpoint_path)
    summary = tf.compat.v1.Summary()
    summary.value.add(tag="checkpoint_path", tensor=tf.make_tensor_proto(checkpoint_path, dtype=tf.string))
    writer = tf.compat.v1.summary.FileWriterCache.get(output_dir)
    writer.add_summary(summary, global_step)
    writer.flush()
