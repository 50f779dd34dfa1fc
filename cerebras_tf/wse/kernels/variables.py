"""Variable kernels and fused optimizer updates (resource operands are ctx.variables, in TF order).

Aliasing rule: read_variable returns a *copy*, as TF's ReadVariableOp snapshot:
the writing kinds below update the variable arrays in place, and an earlier
read must keep its value. gather_variable also copies (fancy indexing).
Writing kinds return no outputs. Scalar hyperparameters are cast to the
variable's dtype first and combined in that dtype, as TF's training_ops.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from cerebras_tf.wse.kernels import _jit
from cerebras_tf.wse.kernels._indices import check_indices, check_sparse_apply_indices
from cerebras_tf.wse.kernels._registry import KernelContext, register
from cerebras_tf.wse.kernels.data import gather
from cerebras_tf.wse.threads import STREAMING_MIN_ELEMENTS_PER_THREAD as STREAMING
from cerebras_tf.wse.threads import split_range


def _s(x: Any, like: np.ndarray) -> np.generic:
    """A scalar operand in the variable's dtype."""
    return like.dtype.type(np.asarray(x).reshape(-1)[0])


@register("read_variable")
def read_variable(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    return [np.array(ctx.variables[0], copy=True)]


@register("gather_variable")
def gather_variable(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """ResourceGather(resource; indices) with attr batch_dims (axis 0)."""
    batch_dims = int(attrs.get("batch_dims", 0))
    return [gather(ctx.variables[0], inputs[0], batch_dims, batch_dims, ctx.check)]


@register("assign_variable")
def assign_variable(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """The value copied into the variable's array in place (one memcpy-speed pass when the dtypes agree)."""
    var, value = ctx.variables[0], inputs[0]
    if value is not var:
        np.copyto(var, value, casting="unsafe")
    return []


@register("assign_add_variable")
def assign_add_variable(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    ctx.variables[0][...] += inputs[0]
    return []


@register("assign_sub_variable")
def assign_sub_variable(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    ctx.variables[0][...] -= inputs[0]
    return []


@register("scatter_add_variable")
def scatter_add_variable(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """ResourceScatterAdd(resource; indices, updates): duplicate indices accumulate. An index outside
    [0, rows) raises KernelInputError with TF's message before anything is written (TF's CPU kernel adds the
    rows before the first bad index; the run stops there either way and that step is not saved)."""
    var = ctx.variables[0]
    indices, updates = np.asarray(inputs[0]), np.asarray(inputs[1], var.dtype)
    check_indices(indices, var.shape[0])
    if updates.ndim == 0:
        updates = np.broadcast_to(updates, indices.shape + var.shape[1:])
    np.add.at(var, indices, updates)
    return []


# ---- optimizers ---------------------------------------------------------------------------

@register("apply_gradient_descent")
def apply_gradient_descent(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """(var; alpha, delta): var -= delta * alpha."""
    var = ctx.variables[0]
    var -= inputs[1] * _s(inputs[0], var)
    return []


@register("apply_momentum")
def apply_momentum(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """(var, accum; lr, grad, momentum): accum = accum*m + g; var -= accum*lr
    (nesterov: var -= g*lr + accum*m*lr)."""
    var, accum = ctx.variables[:2]
    lr, grad, mom = _s(inputs[0], var), inputs[1], _s(inputs[2], var)
    if _jit.enabled() and _flat_together(var, accum, grad):
        fv, fa, fg = (a.reshape(-1) for a in (var, accum, grad))
        nesterov = bool(attrs.get("use_nesterov"))
        split_range(var.size, lambda lo, hi: _momentum(fv[lo:hi], fa[lo:hi], fg[lo:hi], lr, mom, nesterov),
                    STREAMING)
        return []
    accum *= mom
    accum += grad
    if attrs.get("use_nesterov"):
        var -= grad * lr + accum * mom * lr
    else:
        var -= accum * lr
    return []


def _flat_together(var: np.ndarray, *others: np.ndarray) -> bool:
    """Whether the update can walk every operand as one flat array: same shape and dtype, C-contiguous."""
    return var.dtype in (np.float32, np.float64) and all(
        a.shape == var.shape and a.dtype == var.dtype and a.flags.c_contiguous for a in (var, *others))


@_jit.jit
def _momentum(var: np.ndarray, accum: np.ndarray, g: np.ndarray, lr: Any, mom: Any,
              nesterov: bool) -> None:  # pragma: no cover - compiled by numba
    """apply_momentum's numpy operations, element by element in the same order."""
    for i in range(var.size):
        a = accum[i] * mom + g[i]
        accum[i] = a
        var[i] = var[i] - (g[i] * lr + (a * mom) * lr if nesterov else a * lr)


@register("apply_keras_momentum")
def apply_keras_momentum(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """(var, accum; lr, grad, momentum): accum = accum*m - g*lr; var += accum
    (nesterov: var += accum*m - g*lr)."""
    var, accum = ctx.variables[:2]
    lr, grad, mom = _s(inputs[0], var), inputs[1], _s(inputs[2], var)
    accum[...] = accum * mom - grad * lr
    if attrs.get("use_nesterov"):
        var += accum * mom - grad * lr
    else:
        var += accum
    return []


@register("sparse_apply_momentum")
def sparse_apply_momentum(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """(var, accum; lr, grad, indices, momentum): apply_momentum on rows var[indices[i]] with grad[i];
    duplicate indices apply one after another, as TF's loop. An index outside [0, rows) raises
    KernelInputError with TF's message ("Index 7 at offset 1 in indices is out of range") before anything is
    written (TF's CPU kernel updates the rows before it)."""
    var, accum = ctx.variables[:2]
    lr, grad, idx, mom = _s(inputs[0], var), np.asarray(inputs[1]), np.asarray(inputs[2]).reshape(-1), \
        _s(inputs[3], var)
    check_sparse_apply_indices(idx, var.shape[0])
    nesterov = bool(attrs.get("use_nesterov"))
    groups = [np.arange(len(idx))] if len(np.unique(idx)) == len(idx) else [np.array([i]) for i in range(len(idx))]
    for rows in groups:
        ix, g = idx[rows], grad[rows]
        a = accum[ix] * mom + g
        accum[ix] = a
        var[ix] = var[ix] - (g * lr + a * mom * lr if nesterov else a * lr)
    return []


@register("apply_adam")
def apply_adam(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """(var, m, v; beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad), TF's ApplyAdam:
    alpha = lr*sqrt(1-beta2^t)/(1-beta1^t); m += (g-m)*(1-b1); v += (g^2-v)*(1-b2);
    var -= m*alpha/(sqrt(v)+eps)  (nesterov: (g*(1-b1) + b1*m)*alpha/(sqrt(v)+eps))."""
    var, m, v = ctx.variables[:3]
    b1p, b2p, lr, b1, b2, eps = (_s(x, var) for x in inputs[:6])
    one = var.dtype.type(1)
    alpha = lr * np.sqrt(one - b2p) / (one - b1p)
    grad = np.ascontiguousarray(inputs[6], dtype=var.dtype)
    nesterov = bool(attrs.get("use_nesterov"))
    if not all(a.flags.c_contiguous for a in (var, m, v)):
        _adam_update(var, m, v, grad, alpha, b1, b2, eps, nesterov)
        return []
    fv, fm, fvv, fg = (a.reshape(-1) for a in (var, m, v, grad))  # views: the update lands in the variables
    if _jit.enabled() and _flat_together(var, m, v, grad):
        c1, c2 = one - b1, one - b2
        split_range(var.size, lambda lo, hi: _adam(fv[lo:hi], fm[lo:hi], fvv[lo:hi], fg[lo:hi], alpha, b1, c1, c2, eps,
                                                   nesterov), STREAMING)
        return []
    split_range(var.size, lambda lo, hi: _adam_update(fv[lo:hi], fm[lo:hi], fvv[lo:hi], fg[lo:hi], alpha, b1, b2, eps,
                                                      nesterov))
    return []


@_jit.jit
def _adam(var: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray, alpha: Any, b1: Any, c1: Any, c2: Any,
          eps: Any, nesterov: bool) -> None:  # pragma: no cover - compiled by numba
    """_adam_update's numpy operations, element by element in the same order (c1 = 1 - b1, c2 = 1 - b2)."""
    for i in range(var.size):
        gi = g[i]
        mi = m[i] + (gi - m[i]) * c1
        m[i] = mi
        vi = v[i] + (gi * gi - v[i]) * c2
        v[i] = vi
        denom = np.sqrt(vi) + eps
        step = ((gi * c1 + b1 * mi) * alpha if nesterov else mi * alpha) / denom
        var[i] = var[i] - step


def _adam_update(var: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray, alpha: Any, b1: Any, b2: Any,
                 eps: Any, nesterov: bool) -> None:
    """ApplyAdam on (slices of) the arrays, in place, with TF's operation order."""
    one = var.dtype.type(1)
    t1 = np.subtract(g, m)
    t1 *= one - b1
    m += t1
    t2 = np.square(g)
    t2 -= v
    t2 *= one - b2
    v += t2
    denom = np.sqrt(v, out=t2)
    denom += eps
    if nesterov:
        np.multiply(g, one - b1, out=t1)
        t1 += b1 * m
        t1 *= alpha
    else:
        np.multiply(m, alpha, out=t1)
    t1 /= denom
    var -= t1


@register("apply_rms_prop")
def apply_rms_prop(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """(var, ms, mom; lr, rho, momentum, epsilon, grad): ms += (g^2-ms)*(1-rho);
    mom = mom*momentum + g*lr/sqrt(ms+eps); var -= mom."""
    var, ms, mom = ctx.variables[:3]
    lr, rho, momentum, eps = (_s(x, var) for x in inputs[:4])
    grad = inputs[4]
    ms += (np.square(grad) - ms) * (var.dtype.type(1) - rho)
    mom[...] = mom * momentum + (grad * lr) / np.sqrt(ms + eps)
    var -= mom
    return []


@register("apply_adagrad")
def apply_adagrad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """(var, accum; lr, grad): accum += g^2 (if update_slots); var -= g*lr*rsqrt(accum)."""
    var, accum = ctx.variables[:2]
    lr, grad = _s(inputs[0], var), inputs[1]
    if attrs.get("update_slots", True):
        accum += np.square(grad)
    var -= grad * lr * (1 / np.sqrt(accum))
    return []


@register("apply_adagrad_v2")
def apply_adagrad_v2(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """(var, accum; lr, epsilon, grad): accum += g^2 (if update_slots); var -= g*lr/(sqrt(accum)+eps)."""
    var, accum = ctx.variables[:2]
    lr, eps, grad = _s(inputs[0], var), _s(inputs[1], var), inputs[2]
    if attrs.get("update_slots", True):
        accum += np.square(grad)
    var -= grad * lr / (np.sqrt(accum) + eps)
    return []
