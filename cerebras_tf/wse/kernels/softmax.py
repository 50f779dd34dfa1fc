"""softmax, log_softmax, softmax_cross_entropy, sparse_softmax_cross_entropy, l2_loss (TF formulas).

The cross-entropy kinds return (loss[batch], backprop[batch, classes]) with
backprop = softmax(logits) - labels. An out-of-range sparse label raises
KernelInputError with the message of TF's CPU kernel (TF's GPU kernel gives a
NaN row instead; a run on CPU stops there, so does a run on the system).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from cerebras_tf.wse.kernels import _jit
from cerebras_tf.wse.kernels._registry import KernelContext, KernelInputError, register
from cerebras_tf.wse.kernels._split import split_units
from cerebras_tf.wse.kernels._scratch import scratch
from cerebras_tf.wse.memory import empty_aligned

F = np.float32
_PAIRWISE_BLOCK = 128  # numpy's PW_BLOCKSIZE
_NUMPY_REDUCE_BUFFER = 8192  # numpy 1.x sums a longer row in chunks of its iterator buffer: not replicated
_BLOCK_BYTES = 1 << 20  # rows are done in blocks of about this much, which stay in cache between passes
# Rows are split across threads from this many elements a thread: log_softmax 160x8000 1.56 -> 1.05 ms and
# softmax 4096x128 0.61 -> 0.45 ms on two, but 1024x128 0.16 -> 0.24 (the hand-off costs more than it saves).
_SPLIT_MIN_ELEMENTS = 1 << 18


@_jit.jit
def _block_sum(a: np.ndarray, lo: int, n: int) -> np.float32:  # pragma: no cover - compiled by numba
    """sum(a[lo:lo + n]) for n <= 128 in numpy's order: sequential below 8, else eight running sums."""
    if n < 8:
        res = F(0)
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    end = lo + n - n % 8
    i = lo + 8
    while i < end:
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < lo + n:
        res += a[i]
        i += 1
    return res


@_jit.jit
def _pairwise_sum(a: np.ndarray, n: int, tasks: np.ndarray, values: np.ndarray) -> np.float32:  # pragma: no cover
    """sum(a[:n]) in numpy's order for a contiguous float32 row (pairwise_sum in numpy's loops_utils.h:
    blocks of at most 128, halves rounded down to a multiple of 8 above that), without recursion: a stack
    of tasks (tasks[t] = (lo, n), n = -1 for "add the top two values") and one of partial sums."""
    if n <= _PAIRWISE_BLOCK:
        return _block_sum(a, 0, n)
    top, vtop = 1, 0
    tasks[0, 0], tasks[0, 1] = 0, n
    while top > 0:
        top -= 1
        lo, m = tasks[top, 0], tasks[top, 1]
        if m < 0:
            vtop -= 1
            values[vtop - 1] = values[vtop - 1] + values[vtop]
        elif m <= _PAIRWISE_BLOCK:
            values[vtop] = _block_sum(a, lo, m)
            vtop += 1
        else:
            half = m // 2
            half -= half % 8
            tasks[top, 0], tasks[top, 1] = 0, -1
            tasks[top + 1, 0], tasks[top + 1, 1] = lo + half, m - half
            tasks[top + 2, 0], tasks[top + 2, 1] = lo, half
            top += 3
    return values[0]


_STACK = 64  # rows up to 8192 long: seven halvings, three tasks a level


@_jit.jit
def _shift_rows(x: np.ndarray, out: np.ndarray, n: int) -> None:  # pragma: no cover - compiled by numba
    """out[r] = x[r] - max(x[r]) over the rows of n elements of flat x and out. A NaN never wins the max here
    (numpy's max is NaN then): either way such a row's softmax and log_softmax come out all NaN, through
    the sum."""
    for r in range(x.size // n):
        row, dst = x[r * n:(r + 1) * n], out[r * n:(r + 1) * n]
        m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = row[0]
        j = 1
        while j + 8 <= n:
            m0 = row[j] if row[j] > m0 else m0
            m1 = row[j + 1] if row[j + 1] > m1 else m1
            m2 = row[j + 2] if row[j + 2] > m2 else m2
            m3 = row[j + 3] if row[j + 3] > m3 else m3
            m4 = row[j + 4] if row[j + 4] > m4 else m4
            m5 = row[j + 5] if row[j + 5] > m5 else m5
            m6 = row[j + 6] if row[j + 6] > m6 else m6
            m7 = row[j + 7] if row[j + 7] > m7 else m7
            j += 8
        while j < n:
            m0 = row[j] if row[j] > m0 else m0
            j += 1
        m0 = m1 if m1 > m0 else m0
        m2 = m3 if m3 > m2 else m2
        m4 = m5 if m5 > m4 else m4
        m6 = m7 if m7 > m6 else m6
        m0 = m2 if m2 > m0 else m0
        m4 = m6 if m6 > m4 else m4
        m = m4 if m4 > m0 else m0
        for k in range(n):
            dst[k] = row[k] - m


@_jit.jit
def _divide_by_row_sums(e: np.ndarray, n: int) -> None:  # pragma: no cover - compiled by numba
    """e[r] /= sum(e[r]) (numpy's order) over the rows of n elements of flat e, in place."""
    tasks, values = np.empty((_STACK, 2), np.int64), np.empty(_STACK, np.float32)
    for r in range(e.size // n):
        row = e[r * n:(r + 1) * n]
        total = _pairwise_sum(row, n, tasks, values)
        for k in range(n):
            row[k] = row[k] / total


@_jit.jit
def _row_sums(e: np.ndarray, n: int, out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    tasks, values = np.empty((_STACK, 2), np.int64), np.empty(_STACK, np.float32)
    for r in range(out.size):
        out[r] = _pairwise_sum(e[r * n:(r + 1) * n], n, tasks, values)


@_jit.jit
def _subtract_per_row(s: np.ndarray, n: int, v: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    for r in range(v.size):
        row = s[r * n:(r + 1) * n]
        vr = v[r]
        for k in range(n):
            row[k] = row[k] - vr


def _rows_for_loops(x: np.ndarray) -> np.ndarray | None:
    """x as contiguous float32 [rows, n] when the loops take it (else None: the numpy code)."""
    if not _jit.enabled() or x.dtype != F or x.ndim == 0 or x.size == 0 or not 0 < x.shape[-1] <= _NUMPY_REDUCE_BUFFER:
        return None
    return np.ascontiguousarray(x).reshape(-1, x.shape[-1])


def _softmax_rows(x2: np.ndarray) -> np.ndarray:
    """softmax over the rows of x2 [rows, n], as the numpy code computes it (the same bits): per block of
    rows, max and shift (numba), numpy's exp in place, then the sums in numpy's order and the division. Rows
    are split across the host's threads when the kernel runs alone (each row's bits are its own)."""
    rows, n = x2.shape
    out = empty_aligned(x2.shape, F)
    step = max(1, _BLOCK_BYTES // (4 * n))

    def work(first: int, end: int) -> None:
        with np.errstate(all="ignore"):
            for lo in range(first, end, step):
                hi = min(lo + step, end)
                block = out[lo:hi].reshape(-1)
                _shift_rows(x2[lo:hi].reshape(-1), block, n)
                np.exp(block, out=block)
                _divide_by_row_sums(block, n)
    split_units(rows, n, work, _SPLIT_MIN_ELEMENTS)
    return out


def _log_softmax_rows(x2: np.ndarray) -> np.ndarray:
    """log_softmax over the rows of x2: s = x - max, s - log(sum(exp(s))) as the numpy code (the same bits);
    rows split across threads as softmax's."""
    rows, n = x2.shape
    out = empty_aligned(x2.shape, F)
    step = max(1, _BLOCK_BYTES // (4 * n))

    def work(first: int, end: int) -> None:
        e = scratch("log_softmax_exp", (min(step, end - first) * n,), F)  # per thread
        sums = scratch("log_softmax_sums", (min(step, end - first),), F)
        with np.errstate(all="ignore"):
            for lo in range(first, end, step):
                k = min(step, end - lo)
                block = out[lo:lo + k].reshape(-1)
                _shift_rows(x2[lo:lo + k].reshape(-1), block, n)
                np.exp(block, out=e[:k * n])
                _row_sums(e, n, sums[:k])
                np.log(sums[:k], out=sums[:k])
                _subtract_per_row(block, n, sums[:k])
    split_units(rows, n, work, _SPLIT_MIN_ELEMENTS)
    return out


@_jit.jit
def _sparse_xent_rows(s: np.ndarray, e: np.ndarray, n: int, sums: np.ndarray, logs: np.ndarray, index: np.ndarray,
                      padding: np.ndarray, loss: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    """Per row r of n elements of flat s (x - max) and e (exp(s), turned into the gradient in place):
    loss[r] = logs[r] - s[r, index[r]] and e[r] / sums[r] with 1 off at index[r]; a padding row all 0."""
    zero = s.dtype.type(0)
    for r in range(loss.size):
        row = e[r * n:(r + 1) * n]
        if padding[r]:
            loss[r] = zero
            for k in range(n):
                row[k] = zero
            continue
        i = index[r]
        loss[r] = logs[r] - s[r * n + i]
        total = sums[r]
        for k in range(n):
            row[k] = row[k] / total
        row[i] = row[i] - s.dtype.type(1)


def _sparse_xent_loops(x2: np.ndarray, index: np.ndarray, padding: np.ndarray) -> list[np.ndarray]:
    """sparse_softmax_cross_entropy's (loss, backprop) of float32 logits x2 [rows, n] as its numpy code computes
    them (the same bits): per block of rows, max and shift (numba), numpy's exp and log, the sums in numpy's
    order, then each row's loss and gradient in one loop; rows split across threads as softmax's. The zoo
    transformer's [160, 8000] 1.08 -> 0.67 ms hot (the zoo CNN's [64, 10] still about 0.1 ms in its step: cold
    between convolutions, 0.02 hot either way)."""
    rows, n = x2.shape
    loss, back = np.empty(rows, F), empty_aligned(x2.shape, F)
    step = max(1, _BLOCK_BYTES // (4 * n))

    def work(first: int, end: int) -> None:
        most = min(step, end - first)
        shifted = scratch("sparse_xent_shifted", (most * n,), F)  # per thread
        sums, logs = scratch("sparse_xent_sums", (most,), F), scratch("sparse_xent_logs", (most,), F)
        with np.errstate(all="ignore"):
            for lo in range(first, end, step):
                k = min(step, end - lo)
                s, e = shifted[:k * n], back[lo:lo + k].reshape(-1)
                _shift_rows(x2[lo:lo + k].reshape(-1), s, n)
                np.exp(s, out=e)
                _row_sums(e, n, sums[:k])
                np.log(sums[:k], out=logs[:k])
                _sparse_xent_rows(s, e, n, sums[:k], logs[:k], index[lo:lo + k], padding[lo:lo + k], loss[lo:lo + k])
    split_units(rows, n, work, _SPLIT_MIN_ELEMENTS)
    return [loss, back]


def _shifted(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return x - x.max(axis=-1, keepdims=True)


@register("softmax")
def softmax(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """exp(x - max) / sum over the last axis; float32 rows up to 8192 long take the blocked loops (the
    same bits as the numpy code)."""
    x2 = _rows_for_loops(inputs[0])
    if x2 is not None:
        return [_softmax_rows(x2).reshape(inputs[0].shape)]
    e = np.exp(_shifted(inputs[0]))
    return [e / e.sum(axis=-1, keepdims=True)]


@register("log_softmax")
def log_softmax(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """(x - max) - log(sum(exp(x - max))) over the last axis; float32 rows up to 8192 long take the blocked
    loops (the same bits as the numpy code)."""
    x2 = _rows_for_loops(inputs[0])
    if x2 is not None:
        return [_log_softmax_rows(x2).reshape(inputs[0].shape)]
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

    Float32 logits take the blocked loops (_sparse_xent_loops: the numpy code's bits). A label of -1 is
    padding, as on the CS system (the Model Zoo's variable sequence length pads masked-LM
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
    index = np.where(padding, 0, labels).astype(np.int64)
    x2 = _rows_for_loops(logits) if logits.ndim == 2 else None
    if x2 is not None:
        return _sparse_xent_loops(x2, index, padding)
    s = _shifted(logits)
    e = np.exp(s)
    total = e.sum(axis=-1, keepdims=True)
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


_NUMPY_1 = int(np.__version__.split(".")[0]) < 2
_SQUARES_BLOCK = 8 * _NUMPY_REDUCE_BUFFER  # elements squared at a time, into a scratch array that stays in cache


def _sum_of_squares(x: np.ndarray) -> np.float32:
    """np.square(x).sum() for flat contiguous float32 x, the same bits, without a squared copy of x: block by
    block, squared into a scratch array and summed by numpy. numpy 2 sums a whole array pairwise: the same
    halving here down to blocks, each numpy's own pairwise sum of its part (the same tree). numpy 1.x sums
    chunks of its iterator buffer (8192), each pairwise, one after another: the rows of a block."""
    n = x.size
    block = scratch("sum_of_squares", (min(n, _SQUARES_BLOCK),), F)
    if _NUMPY_1:
        total = F(0)
        for lo in range(0, n, _SQUARES_BLOCK):
            m = min(_SQUARES_BLOCK, n - lo)
            squares = np.square(x[lo:lo + m], out=block[:m])
            rows = m // _NUMPY_REDUCE_BUFFER
            sums = list(squares[:rows * _NUMPY_REDUCE_BUFFER].reshape(rows, -1).sum(axis=1, dtype=F)) if rows else []
            if m % _NUMPY_REDUCE_BUFFER:
                sums.append(squares[rows * _NUMPY_REDUCE_BUFFER:].sum(dtype=F))
            for part in sums:
                total = F(total + part)
        return total
    return _pairwise_squares(x, block, 0, n)


def _pairwise_squares(x: np.ndarray, block: np.ndarray, lo: int, m: int) -> np.float32:
    """numpy 2's pairwise sum of x[lo:lo + m] squared: halves (rounded down to a multiple of 8) down to blocks."""
    if m <= _SQUARES_BLOCK:
        return F(np.square(x[lo:lo + m], out=block[:m]).sum(dtype=F))
    half = m // 2
    half -= half % 8
    return F(_pairwise_squares(x, block, lo, half) + _pairwise_squares(x, block, lo + half, m - half))


@register("l2_loss")
def l2_loss(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """sum(x ** 2) / 2 as numpy computes it; float32 without a squared copy of x (`_sum_of_squares`: the zoo
    transformer's weight decay on its 8000x256 embedding, 0.89 -> 0.66 ms), the same bits."""
    x = inputs[0]
    if x.dtype == F and x.size > _SQUARES_BLOCK:
        with np.errstate(over="ignore", invalid="ignore"):
            total = _sum_of_squares(np.ascontiguousarray(x).reshape(-1))
        return [np.asarray(total / F(2), F)]
    return [np.asarray(np.square(x).sum(dtype=x.dtype) / x.dtype.type(2), x.dtype)]
