"""softmax, log_softmax, softmax_cross_entropy, sparse_softmax_cross_entropy, l2_loss (TF formulas).

The cross-entropy kinds return (loss[batch], backprop[batch, classes]) with
backprop = softmax(logits) - labels. An out-of-range sparse label raises
KernelInputError with the message of TF's CPU kernel (TF's GPU kernel gives a
NaN row instead; a run on CPU stops there, so does a run on the system).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from cerebras_tf.wse.kernels._registry import KernelContext, KernelInputError, register


def _shifted(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return x - x.max(axis=-1, keepdims=True)


@register("softmax")
def softmax(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    e = np.exp(_shifted(inputs[0]))
    return [e / e.sum(axis=-1, keepdims=True)]


@register("log_softmax")
def log_softmax(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    s = _shifted(inputs[0])
    return [s - np.log(np.exp(s).sum(axis=-1, keepdims=True))]


def _xent(logits: np.ndarray, labels: np.ndarray) -> list[np.ndarray]:
    s = _shifted(logits)
    e = np.exp(s)
    total = e.sum(axis=-1, keepdims=True)
    loss = (labels * (np.log(total) - s)).sum(axis=-1)
    return [loss.astype(logits.dtype, copy=False), (e / total - labels).astype(logits.dtype, copy=False)]


@register("softmax_cross_entropy")
def softmax_cross_entropy(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """SoftmaxCrossEntropyWithLogits(features, labels); labels broadcast against features."""
    logits, labels = inputs
    logits = np.atleast_2d(logits)
    return _xent(logits, np.broadcast_to(labels, logits.shape))


@register("sparse_softmax_cross_entropy")
def sparse_softmax_cross_entropy(inputs: list[np.ndarray], attrs: Mapping[str, Any],
                                 ctx: KernelContext) -> list[np.ndarray]:
    """SparseSoftmaxCrossEntropyWithLogits(features[batch, classes], labels[batch] int).

    A label of -1 is padding, as on the CS system (the Model Zoo's variable sequence length pads masked-LM
    labels with -1, ``mlm_pad_id``): its row's loss and gradient are 0. Any other label outside
    [0, classes) raises KernelInputError, as TF's CPU kernel raises InvalidArgumentError, or, unless ctx.check
    (an untaken tf.cond branch), is taken as padding too.
    """
    logits, labels = inputs
    k = logits.shape[-1]
    padding = labels == PADDING_LABEL
    if ctx.check:
        _check_labels(labels, k, counted=~padding)
    else:
        padding |= (labels < 0) | (labels >= k)
    s = _shifted(logits)
    e = np.exp(s)
    total = e.sum(axis=-1, keepdims=True)
    index = np.where(padding, 0, labels).astype(np.int64)
    picked = np.take_along_axis(s, index[:, None], axis=-1)[:, 0]
    loss = np.log(total[:, 0]) - picked
    back = e / total
    back[np.arange(len(index)), index] -= 1
    if padding.any():
        loss[padding] = 0
        back[padding] = 0
    return [loss.astype(logits.dtype, copy=False), back.astype(logits.dtype, copy=False)]


PADDING_LABEL = -1  # the label the CS system skips (the zoo's mlm_pad_id for variable sequence length)


def _check_labels(labels: np.ndarray, classes: int, counted: np.ndarray | None = None) -> None:
    """TF's CheckInvalidLabelIndex: the smallest label if it is negative, else the largest if it is >= classes,
    reported with every label value; only the `counted` labels are checked (all by default)."""
    checked = labels if counted is None else labels[counted]
    if checked.size == 0:
        return
    low, high = int(checked.min()), int(checked.max())
    if low < 0 or high >= classes:
        bad = low if low < 0 else high
        values = " ".join(str(int(v)) for v in labels.ravel())
        raise KernelInputError(f"Received a label value of {bad} which is outside the valid range of "
                               f"[0, {classes}).  Label values: {values}")


@register("l2_loss")
def l2_loss(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x = inputs[0]
    return [np.asarray(np.square(x).sum(dtype=x.dtype) / x.dtype.type(2), x.dtype)]
