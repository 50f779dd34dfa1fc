"""Data-movement kernels. Static shapes/axes/indices come in attrs (see compiler.kernels.LIBRARY).

Results may be views of an input (reshape, squeeze, slices): kernels never write
their inputs, and variables are only exposed through read_variable's copy, so a
view can never observe a later variable write.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from cerebras_tf.wse.kernels import _jit
from cerebras_tf.wse.kernels._indices import check_indices, check_segment_ids, clamped
from cerebras_tf.wse.kernels._registry import KernelContext, attr_ints, register

_ints = attr_ints


def _int(v: Any) -> int:
    return int(np.asarray(v).reshape(-1)[0])


def _norm(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


def _value_dtype(v: Any) -> np.dtype:
    """The dtype of a static scalar attr: numpy values keep theirs; Python float -> float32, int -> int32."""
    if isinstance(v, (np.ndarray, np.generic)):
        return np.asarray(v).dtype
    if isinstance(v, bool):
        return np.dtype(bool)
    if isinstance(v, int):
        return np.dtype(np.int32)
    return np.dtype(np.float32)


@register("reshape")
def reshape(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    return [np.reshape(inputs[0], _ints(attrs["shape"]) if np.size(attrs["shape"]) else ())]


@register("squeeze")
def squeeze(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x = inputs[0]
    axes = _ints(attrs.get("axis") or [])
    if not axes:
        return [np.squeeze(x)]
    return [np.squeeze(x, axis=tuple(_norm(a, x.ndim) for a in axes))]


@register("expand_dims")
def expand_dims(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x = inputs[0]
    axis = _int(attrs["axis"])
    return [np.expand_dims(x, axis + x.ndim + 1 if axis < 0 else axis)]


@register("transpose")
def transpose(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """A C-contiguous transpose: no copy where the input is laid out for it (fusion.transposed_outputs)."""
    return [np.ascontiguousarray(np.transpose(inputs[0], _ints(attrs["perm"])))]


def transpose_view(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """The transpose as a view of the input, for readers that take strided operands (fusion.lazy_transposes)."""
    return [np.transpose(inputs[0], _ints(attrs["perm"]))]


@register("concat")
def concat(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    return [np.concatenate(inputs, axis=_norm(_int(attrs["axis"]), np.ndim(inputs[0])))]


@register("stack")
def stack(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    axis = int(attrs.get("axis", 0))
    return [np.stack(inputs, axis=axis + np.ndim(inputs[0]) + 1 if axis < 0 else axis)]


@register("unstack")
def unstack(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x = inputs[0]
    axis = _norm(int(attrs.get("axis", 0)), x.ndim)
    return [np.take(x, i, axis=axis) for i in range(x.shape[axis])]


@register("split")
def split(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x = inputs[0]
    return list(np.split(x, int(attrs["num_split"]), axis=_norm(_int(attrs["axis"]), x.ndim)))


@register("split_v")
def split_v(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x = inputs[0]
    axis = _norm(_int(attrs["axis"]), x.ndim)
    sizes = _ints(attrs["size_splits"])
    if -1 in sizes:
        sizes[sizes.index(-1)] = x.shape[axis] - (sum(sizes) + 1)
    return list(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


@register("slice")
def slice_(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x = inputs[0]
    begin, size = _ints(attrs["begin"]), _ints(attrs["size"])
    return [x[tuple(slice(b, x.shape[d] if s == -1 else b + s) for d, (b, s) in enumerate(zip(begin, size)))]]


def strided_index(attrs: Mapping[str, Any]) -> tuple:
    """The numpy index equivalent to a StridedSlice's begin/end/strides and masks."""
    begin, end, strides = _ints(attrs["begin"]), _ints(attrs["end"]), _ints(attrs["strides"])
    bm, em = int(attrs.get("begin_mask", 0)), int(attrs.get("end_mask", 0))
    ell, new, shrink = (int(attrs.get(k, 0)) for k in ("ellipsis_mask", "new_axis_mask", "shrink_axis_mask"))
    index: list[Any] = []
    for i, (b, e, s) in enumerate(zip(begin, end, strides)):
        bit = 1 << i
        if ell & bit:
            index.append(Ellipsis)
        elif new & bit:
            index.append(None)
        elif shrink & bit:
            index.append(b)
        else:
            index.append(slice(None if bm & bit else b, None if em & bit else e, s))
    return tuple(index)


@register("strided_slice")
def strided_slice(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    return [np.asarray(inputs[0][strided_index(attrs)])]


@register("strided_slice_grad")
def strided_slice_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """StridedSliceGrad(dy) with attr shape: dy scattered into zeros of the input's shape."""
    dy = inputs[0]
    out = np.zeros(_ints(attrs["shape"]), dy.dtype)
    out[strided_index(attrs)] = dy
    return [out]


@register("tile")
def tile(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    return [np.tile(inputs[0], _ints(attrs["multiples"]))]


@register("pad")
def pad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x = inputs[0]
    paddings = np.asarray(attrs["paddings"], np.int64).reshape(-1, 2).tolist()
    value = attrs.get("constant_value", 0)
    return [np.pad(x, paddings, constant_values=np.asarray(value).astype(x.dtype))]


@register("broadcast_to")
def broadcast_to(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    return [np.ascontiguousarray(np.broadcast_to(inputs[0], _ints(attrs["shape"]) if np.size(attrs["shape"]) else ()))]


@register("fill")
def fill(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """Fill(value) with attr shape."""
    value = np.asarray(inputs[0])
    return [np.full(_ints(attrs["shape"]) if np.size(attrs["shape"]) else (), value, value.dtype)]


@register("one_hot")
def one_hot(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """OneHot(indices) with attrs depth, on_value, off_value, axis (-1 = last): on_value written straight into
    an output of off_value (zeros: calloc'd), at each index in [0, depth) (any other index gives an all-off
    row, as TF's).

    The output dtype is on_value's (numpy scalars keep theirs; a Python float is float32, an int int32).
    """
    idx = np.asarray(inputs[0])
    depth = _int(attrs["depth"])
    on, off = attrs.get("on_value", 1.0), attrs.get("off_value", 0.0)
    dtype = _value_dtype(on)
    off_value = np.asarray(off, dtype)
    if not any(off_value.tobytes()):  # all-zero bits (not -0.0)
        out = np.zeros(idx.shape + (depth,), dtype)
    else:
        out = np.full(idx.shape + (depth,), off_value, dtype)
    if out.size:
        flat_idx = idx.reshape(-1)
        hit = (flat_idx >= 0) & (flat_idx < depth)
        out.reshape(-1, depth)[np.flatnonzero(hit), flat_idx[hit]] = np.asarray(on, dtype)
    axis = int(attrs.get("axis", -1))
    if axis != -1 and axis != idx.ndim:
        out = np.ascontiguousarray(np.moveaxis(out, -1, axis))
    return [out]


def gather(params: np.ndarray, indices: np.ndarray, axis: int, batch_dims: int, check: bool = True) -> np.ndarray:
    """tf.gather(params, indices, axis, batch_dims); an index outside [0, params.shape[axis]) raises
    KernelInputError with the message of TF's CPU kernel ("indices[1,2] = 7 is not in [0, 5)"), or, unless
    `check` (an untaken tf.cond branch: KernelContext.check), is clamped into range."""
    indices = np.asarray(indices)
    axis = _norm(axis, params.ndim)
    if check:
        check_indices(indices, params.shape[axis])
    else:
        if params.shape[axis] == 0:  # nothing to clamp to: gather zeros
            params = np.zeros(params.shape[:axis] + (1,) + params.shape[axis + 1:], params.dtype)
        indices = clamped(indices, params.shape[axis])
    batch_dims = batch_dims + indices.ndim if batch_dims < 0 else batch_dims
    if batch_dims == 0:
        return np.take(params, indices, axis=axis)
    bshape = params.shape[:batch_dims]
    b = int(np.prod(bshape, dtype=np.int64))
    p = params.reshape((b,) + params.shape[batch_dims:])
    ax = axis - batch_dims + 1
    pre, post = params.shape[batch_dims:axis], params.shape[axis + 1:]
    ishape = indices.shape[batch_dims:]
    pm = np.moveaxis(p, ax, 1)  # [B, A, pre..., post...]
    g = pm[np.arange(b)[:, None], indices.reshape(b, -1)]  # [B, K, pre..., post...]
    g = g.reshape(bshape + ishape + pre + post)
    nb, ni, npre = len(bshape), len(ishape), len(pre)
    order = (list(range(nb)) + list(range(nb + ni, nb + ni + npre)) + list(range(nb, nb + ni))
             + list(range(nb + ni + npre, g.ndim)))
    return np.ascontiguousarray(g.transpose(order))


@register("gather")
def gather_kernel(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """GatherV2(params, indices) with attrs axis, batch_dims."""
    params, indices = inputs
    return [gather(params, indices, _int(attrs.get("axis", 0)), int(attrs.get("batch_dims", 0)), ctx.check)]


@_jit.jit
def _segment_sum_loop(rows: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - numba
    """out[ids[i]] += rows[i] for i in order (ids outside [0, len(out)) skipped): np.add.at's order."""
    n, width = out.shape
    for i in range(ids.size):
        s = ids[i]
        if s < 0 or s >= n:
            continue
        src, dst = rows[i], out[s]
        for j in range(width):
            dst[j] = dst[j] + src[j]


@register("unsorted_segment_sum")
def unsorted_segment_sum(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """UnsortedSegmentSum(data, segment_ids) with attr num_segments; negative ids are dropped, as TF does, and an
    id >= num_segments raises KernelInputError with TF's message ("segment_ids[2] = 7 is out of range [0, 5)"), or,
    unless ctx.check (an untaken tf.cond branch), is dropped too. Each segment sums its rows in data order
    (one numba pass over data for float32/float64, else np.add.at: the same order)."""
    data, ids = np.asarray(inputs[0]), np.asarray(inputs[1])
    n = _int(attrs["num_segments"])
    if ctx.check:
        check_segment_ids(ids, n)
    rest = data.shape[ids.ndim:]
    flat_ids = ids.reshape(-1)
    rows = data.reshape((flat_ids.size,) + rest)
    out = np.zeros((n,) + rest, data.dtype)
    if _jit.enabled() and data.dtype in (np.float32, np.float64) and flat_ids.dtype.kind in "iu":
        width = int(np.prod(rest, dtype=np.int64))
        if width > 0 and flat_ids.size > 0:
            _segment_sum_loop(np.ascontiguousarray(rows).reshape(flat_ids.size, width), flat_ids,
                              out.reshape(n, width))
        return [out]
    keep = flat_ids >= 0 if ctx.check else (flat_ids >= 0) & (flat_ids < n)
    np.add.at(out, flat_ids[keep], rows[keep])
    return [out]


@register("range")
def range_(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """Range with attrs start, limit, delta: start + i * delta computed in the output dtype."""
    start, limit, delta = attrs["start"], attrs["limit"], attrs["delta"]
    dtype = np.result_type(*(_value_dtype(v) for v in (start, limit, delta)))
    if dtype.kind in "iu":
        size = max(0, -(-(int(limit) - int(start)) // int(delta)))
        return [(int(start) + np.arange(size, dtype=np.int64) * int(delta)).astype(dtype)]
    s, l, d = (dtype.type(v) for v in (start, limit, delta))
    size = max(0, int(np.ceil(abs((float(l) - float(s)) / float(d)))))
    return [s + np.arange(size).astype(dtype) * d]
