"""The TensorFlow side of amp: ``optimizer_step``, loss scaling controlled from a model_fn.

Public as ``cerebras_tf.amp.optimizer_step``, which imports this module on
first use: importing ``cerebras_tf.amp`` stays numpy-only (the executor uses
it without TensorFlow), and the numpy GradScaler stays the single specification.
"""
from __future__ import annotations

import json
from typing import Any

import tensorflow as tf

from cerebras_tf.amp.grad_scaler import GradScaler
from cerebras_tf.amp.target import LOSS_SCALING_COLLECTION, is_capturing_for_cs_system

__all__ = ["optimizer_step"]

STATE_SCOPE = "amp"


def optimizer_step(
    loss: tf.Tensor,
    optimizer: tf.compat.v1.train.Optimizer,
    grad_scaler: GradScaler | None,
    max_gradient_norm: float | None = None,
    max_gradient_value: float | None = None,
) -> tf.Operation:
    """Loss scaling, gradient clipping and the optimizer update; returns the train_op.

    Use it in a model_fn instead of ``optimizer.minimize(loss, global_step=...)``::

        scaler = cerebras_tf.amp.GradScaler(loss_scale="dynamic", steps_per_increase=1000)
        train_op = cerebras_tf.amp.optimizer_step(loss, optimizer, scaler, max_gradient_norm=1.0)

    Each step: gradients of ``loss * scale`` are unscaled, checked for inf/NaN,
    clipped by global norm (``tf.clip_by_global_norm``) and/or by value, then
    applied. A step with non-finite gradients changes no weight and no
    optimizer slot. The scale follows ``GradScaler``'s rule (halves on
    overflow, beyond ``overflow_tolerance``; doubles after
    ``steps_per_increase`` steps; stays in ``[min_loss_scale, max_loss_scale]``);
    a static scale never changes. The global step (get_or_create_global_step)
    is incremented on every step.

    Args:
      loss: scalar float loss.
      optimizer: a ``tf.compat.v1.train.Optimizer``.
      grad_scaler: a ``cerebras_tf.amp.GradScaler`` used as a configuration
        (its initial settings); None means no scaling (scale 1), non-finite
        steps are still skipped.
      max_gradient_norm / max_gradient_value: clipping of the unscaled
        gradients in every mode (mutually exclusive); with the scaler's own
        ``max_gradient_norm`` the smaller bound applies.

    On CPU/GPU this builds TF ops; a dynamic scale and its counters are
    non-trainable variables under ``amp/`` (STATE_VARIABLES), saved in
    checkpoints as on the CS system, so a resumed run continues with its
    scale; a ``loss_scale`` summary is added. When the model is captured for the
    (simulated) CS system it emits only
    ``optimizer.apply_gradients(optimizer.compute_gradients(loss), global_step)``
    and records the settings for the executor, which scales natively.
    """
    scaler = GradScaler.for_optimizer_step(grad_scaler, max_gradient_norm, max_gradient_value)
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise TypeError(f"optimizer_step needs a tf.compat.v1.train.Optimizer, got {type(optimizer).__name__}.")
    global_step = tf.compat.v1.train.get_or_create_global_step()
    if is_capturing_for_cs_system():
        tf.compat.v1.add_to_collection(LOSS_SCALING_COLLECTION, json.dumps(scaler.config(), sort_keys=True))
        return optimizer.apply_gradients(optimizer.compute_gradients(loss), global_step=global_step)
    return _scaled_step(loss, optimizer, scaler, global_step)


# The dynamic scale's state, checkpointed under STATE_SCOPE/<key> by both paths (keys of GradScaler.state_dict()),
# so a resumed run, on CPU or on the CS system, continues with the scale it had.
STATE_VARIABLES: dict[str, tf.DType] = {
    "loss_scale": tf.float64, "steps_since_rescale": tf.int64, "overflows_since_rescale": tf.int64}


def _state_variable(name: str, value: Any) -> tf.Variable:
    return tf.compat.v1.get_variable(
        name, initializer=tf.constant(value, STATE_VARIABLES[name]), trainable=False, use_resource=True)


def _map_values(fn: Any, grad: Any) -> Any:
    """Apply fn to a dense gradient, or to an IndexedSlices' values."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(fn(grad.values), grad.indices, grad.dense_shape)
    return fn(grad)


def _scaled_step(loss: tf.Tensor, optimizer: tf.compat.v1.train.Optimizer, scaler: GradScaler,
                 global_step: tf.Variable) -> tf.Operation:
    """The TF-ops version of one GradScaler step (see cerebras_tf/amp/grad_scaler.py)."""
    with tf.compat.v1.variable_scope(STATE_SCOPE):
        # The scale is kept in float64 (GradScaler's Python float) and used as float32, like the executor.
        scale_var = steps_var = overflows_var = None
        if scaler.dynamic:
            scale_var = _state_variable("loss_scale", scaler.scale)
            steps_var = _state_variable("steps_since_rescale", 0)
            if scaler.overflow_tolerance > 0:
                overflows_var = _state_variable("overflows_since_rescale", 0)
            scale64 = scale_var.read_value()
        else:
            scale64 = tf.constant(scaler.scale, tf.float64)
        scale = tf.cast(scale64, tf.float32)
        scaled_loss = loss * tf.cast(scale, loss.dtype)
    tf.compat.v1.summary.scalar("loss_scale", scale)  # the scale used for this step, as on the CS system

    grads_and_vars = [(g, v) for g, v in optimizer.compute_gradients(scaled_loss) if g is not None]
    if not grads_and_vars:
        raise ValueError(f"No gradients for any variable from loss {loss.name}.")
    variables = [v for _, v in grads_and_vars]
    with tf.name_scope(f"{STATE_SCOPE}/unscale"):
        inverse = tf.constant(1.0, tf.float32) / scale
        grads = [_map_values(lambda g: g * tf.cast(inverse, g.dtype), g) for g, _ in grads_and_vars]
        finite = tf.reduce_all(tf.stack([
            tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g)) for g in grads]))
        if scaler.max_gradient_norm is not None:
            grads, _ = tf.clip_by_global_norm(grads, scaler.max_gradient_norm)
        if scaler.max_gradient_value is not None:
            bound = scaler.max_gradient_value
            grads = [_map_values(lambda g: tf.clip_by_value(g, -bound, bound), g) for g in grads]

    def apply() -> tf.Tensor:
        with tf.control_dependencies([optimizer.apply_gradients(list(zip(grads, variables)))]):
            return tf.constant(True)

    applied = tf.cond(finite, apply, lambda: tf.constant(False), name=f"{STATE_SCOPE}/apply_if_finite")
    updates = [applied]
    if scaler.dynamic:
        updates.append(_update_scale(scaler, finite, scale64, scale_var, steps_var, overflows_var))
    with tf.control_dependencies(updates):
        return tf.compat.v1.assign_add(global_step, 1).op


def _update_scale(scaler: GradScaler, finite: tf.Tensor, scale: tf.Tensor, scale_var: tf.Variable,
                  steps_var: tf.Variable, overflows_var: tf.Variable | None) -> tf.Operation:
    """GradScaler.update in TF ops: halve past the overflow tolerance, else double after steps_per_increase."""
    with tf.name_scope(f"{STATE_SCOPE}/update"):
        steps = steps_var.read_value() + 1
        overflow = tf.cast(tf.logical_not(finite), tf.int64)
        if overflows_var is not None:
            overflows = overflows_var.read_value() + overflow
            halve = tf.cast(overflows, tf.float64) / tf.cast(steps, tf.float64) > scaler.overflow_tolerance
        else:  # tolerance 0: every overflow halves (and resets), so the count is this step's alone
            overflows, halve = overflow, tf.logical_not(finite)
        grow = tf.logical_and(tf.logical_not(halve), steps >= scaler.steps_per_increase)
        new_scale = tf.where(halve, scale / 2.0, tf.where(grow, scale * 2.0, scale))
        new_scale = tf.minimum(tf.maximum(new_scale, scaler.min_loss_scale), scaler.max_loss_scale)
        reset = tf.logical_or(halve, grow)
        zero = tf.constant(0, tf.int64)
        assigns = [scale_var.assign(new_scale), steps_var.assign(tf.where(reset, zero, steps))]
        if overflows_var is not None:
            assigns.append(overflows_var.assign(tf.where(reset, zero, overflows)))
        return tf.group(*assigns)
