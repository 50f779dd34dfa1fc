"""Reductions and data movement against tf.raw_ops."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from kernel_helpers import check, run

R = tf.raw_ops
F = np.float32

REDUCE = {"sum": R.Sum, "mean": R.Mean, "max": R.Max, "min": R.Min, "prod": R.Prod}


@pytest.mark.parametrize("kind", sorted(REDUCE))
@pytest.mark.parametrize("axis", [[1], [0, 2], [-1], [], [0, 1, 2], 1, (0, 2), np.array([0, -1], np.int64)],
                         ids=["[1]", "[0,2]", "[-1]", "[]", "[0,1,2]", "int", "tuple", "ndarray"])  # attr forms
@pytest.mark.parametrize("keep", [False, True])
def test_reductions(kind, axis, keep, rng):
    x = rng.normal(size=(4, 5, 6)).astype(F)
    if kind == "prod":
        x = (F(1) + x * F(0.1)).astype(F)
    check(run(kind, [x], {"axis": axis, "keep_dims": keep})[0],
          REDUCE[kind](input=x, axis=axis, keep_dims=keep), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,axis", [((64, 8, 8, 64), [0, 1, 2]), ((4096, 64), [0]), ((300, 2), [0]),
                                        ((8, 128, 3, 5), [0, 1]), ((1000, 1), [0]), ((7, 9, 16), [1, 2]),
                                        ((7, 9, 16), [-3, -2]), ((5, 6), None)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("strided", [False, True])
def test_sum_and_mean_over_outer_axes_have_numpys_bits(shape, axis, dtype, strided, rng, jit):
    """Summed over its leading axes, a C-contiguous float array's rows are added in numpy's own order by one
    numba loop (reduce.outer_sum): numpy's bits, however many values each row keeps (one column numpy sums
    pairwise: numpy's code); other axes and strided arrays keep numpy's code."""
    x = (rng.standard_normal(shape) * 1e3).astype(dtype)
    x.reshape(-1)[:3] = [np.inf, -0.0, 1e-40]
    if strided:
        x = np.repeat(x, 2, axis=-1)[..., ::2]
    axes = tuple(range(len(shape))) if axis is None else tuple(sorted(a % len(shape) for a in axis))
    words = np.uint32 if dtype == np.float32 else np.uint64
    for kind, expected in [("sum", x.sum(axis=axes, dtype=dtype)),
                           ("mean", x.sum(axis=axes, dtype=dtype) / dtype(np.prod([shape[a] for a in axes])))]:
        ours = run(kind, [x], {"axis": axis})[0]
        assert ours.dtype == expected.dtype and ours.shape == expected.shape, kind
        np.testing.assert_array_equal(np.asarray(ours).view(words), np.asarray(expected).view(words), err_msg=kind)


@pytest.mark.parametrize("kind", ["sum", "mean", "max", "prod"])
def test_int_reductions(kind, rng):
    x = rng.integers(-7, 7, size=(4, 6)).astype(np.int32)
    check(run(kind, [x], {"axis": [1]})[0], REDUCE[kind](input=x, axis=[1]))


def test_all_any(rng):
    b = rng.random((4, 5)) > 0.3
    for kind, op in (("all", R.All), ("any", R.Any)):
        for axis in ([0], [1], [0, 1]):
            check(run(kind, [b], {"axis": axis, "keep_dims": True})[0], op(input=b, axis=axis, keep_dims=True))


@pytest.mark.parametrize("kind,op", [("argmax", R.ArgMax), ("argmin", R.ArgMin)])
def test_arg_reductions(kind, op, rng, jit):
    x = np.round(rng.normal(size=(5, 7)) * 2).astype(F)  # ties: first index
    for axis in (0, 1, -1):
        for out in (tf.int32, tf.int64):
            check(run(kind, [x], {"axis": axis, "output_type": out.name})[0],
                  op(input=x, dimension=axis, output_type=out))


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum(exclusive, reverse, rng):
    x = rng.normal(size=(4, 6)).astype(F)
    for axis in (0, 1):
        check(run("cumsum", [x], {"axis": axis, "exclusive": exclusive, "reverse": reverse})[0],
              R.Cumsum(x=x, axis=axis, exclusive=exclusive, reverse=reverse), rtol=1e-5, atol=1e-6)


def test_band_part(rng):
    x = rng.normal(size=(2, 5, 6)).astype(F)
    for lo, up in ((0, 0), (-1, 0), (1, -1), (2, 1)):
        check(run("band_part", [x], {"num_lower": lo, "num_upper": up})[0],
              R.MatrixBandPart(input=x, num_lower=lo, num_upper=up))


# ---- data movement --------------------------------------------------------------------------

def test_shape_ops(rng):
    x = rng.normal(size=(2, 1, 3, 1)).astype(F)
    check(run("reshape", [x], {"shape": [3, -1]})[0], R.Reshape(tensor=x, shape=[3, -1]))
    check(run("squeeze", [x], {"axis": []})[0], R.Squeeze(input=x))
    check(run("squeeze", [x], {"axis": [-1]})[0], R.Squeeze(input=x, axis=[-1]))
    for axis in (0, 2, -1):
        check(run("expand_dims", [x], {"axis": axis})[0], R.ExpandDims(input=x, axis=axis))
    check(run("transpose", [x], {"perm": [3, 2, 0, 1]})[0], R.Transpose(x=x, perm=[3, 2, 0, 1]))


def test_concat_stack_unstack_split(rng):
    xs = [rng.normal(size=(2, k, 3)).astype(F) for k in (1, 2, 3)]
    check(run("concat", xs, {"axis": 1})[0], R.ConcatV2(values=xs, axis=1))
    check(run("concat", xs, {"axis": -2})[0], R.ConcatV2(values=xs, axis=-2))
    ys = [rng.normal(size=(2, 3)).astype(F) for _ in range(4)]
    for axis in (0, 1, -1):
        check(run("stack", ys, {"axis": axis})[0], R.Pack(values=ys, axis=axis))
    x = rng.normal(size=(4, 6)).astype(F)
    for o, t in zip(run("unstack", [x], {"axis": 1, "num": 6}), R.Unpack(value=x, num=6, axis=1)):
        check(o, t)
    for o, t in zip(run("split", [x], {"axis": 1, "num_split": 3}), R.Split(axis=1, value=x, num_split=3)):
        check(o, t)
    outs = run("split_v", [x], {"size_splits": [1, -1, 2], "axis": -1})
    for o, t in zip(outs, R.SplitV(value=x, size_splits=[1, -1, 2], axis=-1, num_split=3)):
        check(o, t)
    assert len(outs) == 3


def test_slice(rng):
    x = rng.normal(size=(4, 5, 6)).astype(F)
    check(run("slice", [x], {"begin": [1, 0, 2], "size": [2, -1, 3]})[0], R.Slice(input=x, begin=[1, 0, 2],
                                                                                  size=[2, -1, 3]))


STRIDED = [
    dict(begin=[1, 0, 0], end=[3, 5, 6], strides=[1, 2, 1]),
    dict(begin=[-1, 4, 0], end=[0, 0, 6], strides=[-1, -2, 3], begin_mask=1),
    dict(begin=[0, 0], end=[0, 2], strides=[1, 1], begin_mask=1, end_mask=1),
    dict(begin=[1, 0], end=[2, 0], strides=[1, 1], shrink_axis_mask=1, ellipsis_mask=2),
    dict(begin=[0, 1, 0], end=[0, 3, 0], strides=[1, 1, 1], new_axis_mask=1, ellipsis_mask=4),
    dict(begin=[0, -2, 0], end=[0, 0, 0], strides=[1, 1, 1], shrink_axis_mask=5, end_mask=2, begin_mask=0),
    dict(begin=[2], end=[0], strides=[1], shrink_axis_mask=1),
    dict(begin=[0, 0, 0, 0], end=[4, 1, 5, 6], strides=[1, 1, 1, 1], new_axis_mask=2),
    dict(begin=[-100, 1], end=[100, -1], strides=[1, 1]),
]


@pytest.mark.parametrize("spec", STRIDED, ids=range(len(STRIDED)))
def test_strided_slice_and_grad(spec, rng):
    x = rng.normal(size=(4, 5, 6)).astype(F)
    masks = {k: spec.get(k, 0) for k in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
                                         "shrink_axis_mask")}
    attrs = {"begin": spec["begin"], "end": spec["end"], "strides": spec["strides"], **masks}
    y = R.StridedSlice(input=x, begin=spec["begin"], end=spec["end"], strides=spec["strides"], **masks)
    check(run("strided_slice", [x], attrs)[0], y)
    dy = rng.normal(size=y.shape).astype(F)
    check(run("strided_slice_grad", [dy], {**attrs, "shape": [4, 5, 6]})[0],
          R.StridedSliceGrad(shape=[4, 5, 6], begin=spec["begin"], end=spec["end"], strides=spec["strides"],
                             dy=dy, **masks))


def test_tile_pad_broadcast_fill(rng):
    x = rng.normal(size=(2, 3)).astype(F)
    check(run("tile", [x], {"multiples": [2, 3]})[0], R.Tile(input=x, multiples=[2, 3]))
    check(run("pad", [x], {"paddings": [[1, 0], [2, 3]]})[0], R.Pad(input=x, paddings=[[1, 0], [2, 3]]))
    check(run("pad", [x], {"paddings": [[1, 2], [0, 1]], "constant_value": 1.5})[0],
          R.PadV2(input=x, paddings=[[1, 2], [0, 1]], constant_values=F(1.5)))
    check(run("broadcast_to", [x[:1]], {"shape": [4, 2, 3]})[0], R.BroadcastTo(input=x[:1], shape=[4, 2, 3]))
    check(run("fill", [F(2.5)], {"shape": [2, 4]})[0], R.Fill(dims=[2, 4], value=F(2.5)))
    check(run("fill", [np.int32(7)], {"shape": [3]})[0], R.Fill(dims=[3], value=np.int32(7)))


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis, rng):
    idx = rng.integers(-1, 6, size=(3, 4)).astype(np.int32)  # -1 and 5 are out of range: all off
    check(run("one_hot", [idx], {"depth": 5, "on_value": 2.0, "off_value": -1.0, "axis": axis})[0],
          R.OneHot(indices=idx, depth=5, on_value=F(2.0), off_value=F(-1.0), axis=axis))
    check(run("one_hot", [idx], {"depth": 5, "on_value": 1, "off_value": 0, "axis": axis})[0],
          R.OneHot(indices=idx, depth=5, on_value=np.int32(1), off_value=np.int32(0), axis=axis))


@pytest.mark.parametrize("pshape,ishape,axis,bd", [((5, 4), (3,), 0, 0), ((5, 4), (2, 3), 1, 0),
                                                   ((3, 5, 4), (3, 2), 1, 1), ((2, 3, 5, 4), (2, 3, 6), 2, 2),
                                                   ((3, 4, 5, 6), (3, 2, 2), 2, 1), ((3, 4, 5), (3, 2), -1, 1)])
def test_gather(pshape, ishape, axis, bd, rng):
    params = rng.normal(size=pshape).astype(F)
    idx = rng.integers(0, pshape[axis], size=ishape).astype(np.int32)
    check(run("gather", [params, idx], {"axis": axis, "batch_dims": bd})[0],
          R.GatherV2(params=params, indices=idx, axis=axis, batch_dims=bd))


def test_unsorted_segment_sum(rng):
    data = rng.normal(size=(6, 3)).astype(F)
    ids = np.array([0, 2, -1, 2, 4, 0], np.int32)
    check(run("unsorted_segment_sum", [data, ids], {"num_segments": 5})[0],
          R.UnsortedSegmentSum(data=data, segment_ids=ids, num_segments=5))
    data2 = rng.normal(size=(2, 3, 4)).astype(F)
    ids2 = np.array([[1, 0, 1], [2, 2, 0]], np.int32)
    check(run("unsorted_segment_sum", [data2, ids2], {"num_segments": 3})[0],
          R.UnsortedSegmentSum(data=data2, segment_ids=ids2, num_segments=3))


@pytest.mark.parametrize("start,limit,delta", [(0, 10, 3), (5, -4, -2), (0.0, 1.0, 0.1), (1.5, -2.0, -0.3),
                                               (0, 0, 1)])
def test_range(start, limit, delta):
    dt = np.float32 if isinstance(start, float) else np.int32
    check(run("range", [], {"start": start, "limit": limit, "delta": delta})[0],
          R.Range(start=dt(start), limit=dt(limit), delta=dt(delta)), rtol=0, atol=0)


def test_argmax_skips_nan(jit):
    x = np.array([[np.nan, 1, 3], [2, 2, -1], [4, np.nan, 0], [np.nan, np.nan, np.nan], [-np.inf, np.nan, -np.inf]],
                 F)
    for axis in (0, 1):
        check(run("argmax", [x], {"axis": axis, "output_type": "int64"})[0], R.ArgMax(input=x, dimension=axis))
        check(run("argmin", [x], {"axis": axis, "output_type": "int64"})[0], R.ArgMin(input=x, dimension=axis))


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
@pytest.mark.parametrize("shape", [(64, 10), (3, 4, 9), (17,), (5, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_last_axis_arg_loop_picks_the_numpy_codes_indices(kind, shape, dtype, rng):
    """reduce._arg_rows (numba, along the last axis) picks what the numpy code picks: the first of tied values
    (+0 and -0 alike), never a NaN unless a line is all NaN (then its first index), infinities as values."""
    from cerebras_tf.wse.kernels import _jit
    x = np.round(rng.normal(size=shape) * 2).astype(dtype)
    flat = x.reshape(-1)
    flat[rng.random(flat.size) < 0.2] = np.nan
    flat[rng.random(flat.size) < 0.1] = np.inf
    flat[rng.random(flat.size) < 0.1] = -np.inf
    flat[rng.random(flat.size) < 0.1] = -0.0
    if x.ndim > 1:
        x[(0,) * (x.ndim - 1)] = np.nan  # a line of NaN alone
    for output_type in ("int32", "int64"):
        attrs = {"axis": -1 if x.ndim > 1 else 0, "output_type": output_type}
        with _jit.use_jit(True):
            ours = run(kind, [x], attrs)[0]
        with _jit.use_jit(False):
            reference = run(kind, [x], attrs)[0]
        assert ours.dtype == reference.dtype == np.dtype(output_type) and ours.shape == reference.shape
        np.testing.assert_array_equal(ours, reference)
