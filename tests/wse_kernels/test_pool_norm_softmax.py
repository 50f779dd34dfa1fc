"""Pooling, fused batch norm, softmax and losses against tf.raw_ops."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf.wse import threads
from cerebras_tf.wse.kernels import KernelInputError, _jit
from cerebras_tf.wse.kernels._split import split_units
from kernel_helpers import check, run

R = tf.raw_ops
F = np.float32


POOLS = [((2, 8, 8, 3), 2, 2, "VALID"), ((2, 9, 7, 3), 3, 2, "SAME"), ((1, 6, 6, 2), 3, 1, "SAME"),
         ((2, 7, 7, 2), 3, 2, "VALID")]


@pytest.mark.parametrize("case", POOLS, ids=range(len(POOLS)))
def test_max_pool_and_grad(case, rng, jit):
    shape, k, s, padding = case
    x = rng.normal(size=shape).astype(F)
    attrs = {"ksize": [1, k, k, 1], "strides": [1, s, s, 1], "padding": padding, "data_format": "NHWC"}
    kw = dict(ksize=[1, k, k, 1], strides=[1, s, s, 1], padding=padding)
    y = R.MaxPool(input=x, **kw)
    check(run("max_pool", [x], attrs)[0], y, rtol=0, atol=0)
    g = rng.normal(size=y.shape).astype(F)
    check(run("max_pool_grad", [x, y.numpy(), g], attrs)[0],
          R.MaxPoolGrad(orig_input=x, orig_output=y, grad=g, **kw), rtol=1e-6, atol=1e-6)


def test_pool_geometry_is_kept_per_attrs_object_and_shape(rng, jit):
    """pool._geom keeps a kernel's geometry per attrs object and input shape; an entry left by another attrs
    object whose id this one now has (a freed dict's) is not taken, and results follow the attrs at hand."""
    from cerebras_tf.wse.kernels import pool
    x = rng.normal(size=(2, 8, 8, 3)).astype(F)
    valid = {"ksize": [1, 2, 2, 1], "strides": [1, 2, 2, 1], "padding": "VALID", "data_format": "NHWC"}
    same = {**valid, "ksize": [1, 3, 3, 1], "padding": "SAME"}
    g = pool._geom(valid, x.shape)
    assert pool._geom(valid, x.shape) is g and pool._geom(valid, (4, 8, 8, 3)) is not g
    pool._KEPT[(id(same), x.shape)] = (valid, g)  # as if `valid` had been freed and `same` got its id
    assert (pool._geom(same, x.shape).kh, pool._geom(same, x.shape).oh) == (3, 4)
    for attrs in (valid, same, valid):
        kw = {key: attrs[key] for key in ("ksize", "strides", "padding")}
        check(run("avg_pool", [x], attrs)[0], R.AvgPool(value=x, **kw), rtol=1e-6, atol=1e-6)
        check(run("max_pool", [x], attrs)[0], R.MaxPool(input=x, **kw), rtol=0, atol=0)


def test_max_pool_grad_ties_go_to_first_max(rng, jit):
    x = np.round(rng.normal(size=(2, 6, 6, 2))).astype(F)  # many ties
    x[0, :4, :4, 0] = 1.0
    attrs = {"ksize": [1, 3, 3, 1], "strides": [1, 1, 1, 1], "padding": "SAME"}
    kw = dict(ksize=[1, 3, 3, 1], strides=[1, 1, 1, 1], padding="SAME")
    y = R.MaxPool(input=x, **kw)
    g = rng.normal(size=y.shape).astype(F)
    check(run("max_pool_grad", [x, y.numpy(), g], attrs)[0],
          R.MaxPoolGrad(orig_input=x, orig_output=y, grad=g, **kw), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape,padding", [((3, 9, 7, 4), "VALID"), ((3, 9, 7, 4), "SAME"), ((2, 8, 8, 5), "SAME")])
def test_max_pool_grad_relu_ties_and_nonfinite_grads(shape, padding, rng, jit):
    """After ReLU most 2x2 windows are all zero (ties); odd sizes crop (VALID) or pad (SAME);
    non-finite gradients are routed unchanged and never leak into other positions."""
    x = np.maximum(np.round(rng.normal(size=shape) * 2), 0).astype(F)
    kw = dict(ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding=padding)
    y = R.MaxPool(input=x, **kw)
    g = rng.normal(size=y.shape).astype(F)
    g.flat[:3] = [np.inf, -np.inf, np.nan]
    ours = run("max_pool_grad", [x, y.numpy(), g], kw)[0]
    theirs = R.MaxPoolGrad(orig_input=x, orig_output=y, grad=g, **kw).numpy()
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("case", POOLS, ids=range(len(POOLS)))
def test_avg_pool_and_grad(case, rng, jit):
    shape, k, s, padding = case
    x = rng.normal(size=shape).astype(F)
    attrs = {"ksize": [1, k, k, 1], "strides": [1, s, s, 1], "padding": padding}
    kw = dict(ksize=[1, k, k, 1], strides=[1, s, s, 1], padding=padding)
    y = R.AvgPool(value=x, **kw)
    ours = run("avg_pool", [x], attrs)[0]
    check(ours, y)
    if jit == "numba":  # on a 64-byte boundary: TF's convolutions (the "tensorflow" provider) copy it otherwise
        assert ours.ctypes.data % 64 == 0
    g = rng.normal(size=y.shape).astype(F)
    check(run("avg_pool_grad", [g], {**attrs, "orig_input_shape": list(shape)})[0],
          R.AvgPoolGrad(orig_input_shape=list(shape), grad=g, **kw))


def test_pool_nchw(rng, jit):
    x = rng.normal(size=(2, 3, 6, 6)).astype(F)
    a = {"ksize": [1, 1, 2, 2], "strides": [1, 1, 2, 2], "padding": "VALID", "data_format": "NCHW"}
    nhwc = run("max_pool", [x.transpose(0, 2, 3, 1)], {"ksize": [1, 2, 2, 1], "strides": [1, 2, 2, 1],
                                                       "padding": "VALID"})[0]
    np.testing.assert_array_equal(run("max_pool", [x], a)[0], nhwc.transpose(0, 3, 1, 2))


@pytest.mark.parametrize("factor", [1.0, 0.1])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_fused_batch_norm_training_and_grad(factor, fmt, rng, jit):
    x = (rng.normal(size=(4, 5, 6, 3)) * 2 + 1).astype(F)
    if fmt == "NCHW":
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    scale, offset = rng.normal(size=3).astype(F), rng.normal(size=3).astype(F)
    mean, var = rng.normal(size=3).astype(F), np.abs(rng.normal(size=3)).astype(F)
    attrs = {"epsilon": 1e-3, "exponential_avg_factor": factor, "data_format": fmt, "is_training": True}
    ours = run("fused_batch_norm", [x, scale, offset, mean, var], attrs)
    theirs = R.FusedBatchNormV3(x=x, scale=scale, offset=offset, mean=mean, variance=var, epsilon=1e-3,
                                exponential_avg_factor=factor, data_format=fmt, is_training=True)
    assert len(ours) == 6 and ours[5].shape == (0,)
    for o, t in zip(ours[:5], theirs[:5]):
        check(o, t, rtol=1e-5, atol=1e-5)
    dy = rng.normal(size=x.shape).astype(F)
    g_ours = run("fused_batch_norm_grad", [dy, x, scale, ours[3], ours[4], ours[5]], attrs)
    g_tf = R.FusedBatchNormGradV3(y_backprop=dy, x=x, scale=scale, reserve_space_1=theirs[3],
                                  reserve_space_2=theirs[4], reserve_space_3=theirs[5], epsilon=1e-3,
                                  data_format=fmt, is_training=True)
    assert len(g_ours) == 5
    for o, t in zip(g_ours[:3], g_tf[:3]):
        check(o, t, rtol=2e-5, atol=2e-5)


def test_fused_batch_norm_inference_and_grad(rng, jit):
    x = rng.normal(size=(4, 5, 6, 3)).astype(F)
    scale, offset = rng.normal(size=3).astype(F), rng.normal(size=3).astype(F)
    mean, var = rng.normal(size=3).astype(F), np.abs(rng.normal(size=3)).astype(F)
    attrs = {"epsilon": 1e-3, "is_training": False}
    ours = run("fused_batch_norm", [x, scale, offset, mean, var], attrs)
    theirs = R.FusedBatchNormV3(x=x, scale=scale, offset=offset, mean=mean, variance=var, epsilon=1e-3,
                                is_training=False)
    for o, t in zip(ours[:3], theirs[:3]):
        check(o, t, rtol=1e-5, atol=1e-5)
    dy = rng.normal(size=x.shape).astype(F)
    g_ours = run("fused_batch_norm_grad", [dy, x, scale, mean, var, ours[5]], attrs)
    g_tf = R.FusedBatchNormGradV3(y_backprop=dy, x=x, scale=scale, reserve_space_1=mean, reserve_space_2=var,
                                  reserve_space_3=theirs[5], epsilon=1e-3, is_training=False)
    for o, t in zip(g_ours[:3], g_tf[:3]):
        check(o, t, rtol=2e-5, atol=2e-5)


def _pool_attrs(k: tuple[int, int], s: tuple[int, int], padding: str, fmt: str) -> dict:
    if fmt == "NCHW":
        return {"ksize": [1, 1, *k], "strides": [1, 1, *s], "padding": padding, "data_format": fmt}
    return {"ksize": [1, *k, 1], "strides": [1, *s, 1], "padding": padding, "data_format": fmt}


def _both_ways(kind: str, inputs: list, attrs: dict) -> tuple[list[np.ndarray], list[np.ndarray]]:
    with np.errstate(invalid="ignore"):  # inf - inf in the numpy code's gradient sums
        with _jit.use_jit(True):
            jitted = run(kind, inputs, attrs)
        with _jit.use_jit(False):
            plain = run(kind, inputs, attrs)
    return jitted, plain


def _assert_bits_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    words = np.dtype(f"u{a.dtype.itemsize}")
    np.testing.assert_array_equal(np.ascontiguousarray(a).view(words), np.ascontiguousarray(b).view(words))


POOL_GEOMETRIES = [((2, 2), (2, 2)), ((3, 3), (1, 1)), ((3, 3), (2, 2)), ((3, 2), (2, 1)), ((2, 3), (3, 3)),
                   ((1, 1), (2, 2))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("geometry", POOL_GEOMETRIES, ids=[f"k{k[0]}x{k[1]}s{s[0]}x{s[1]}" for k, s in POOL_GEOMETRIES])
def test_pool_numba_loops_are_bit_identical_to_numpy(geometry, padding, fmt, dtype, rng):
    """Ties (rounded values, +0 and -0), NaN and infinities in x, non-finite and -0 gradients,
    overlapping windows (stride < kernel), gaps (stride > kernel), padding, NCHW: the numba loops
    give the numpy code's bits (float16 keeps the numpy code)."""
    k, s = geometry
    x = np.round(rng.normal(size=(3, 9, 8, 5)) * 1.5).astype(dtype)
    zeros = np.flatnonzero(x == 0)
    x.flat[zeros] = np.where(rng.random(zeros.size) < 0.5, -0.0, 0.0).astype(dtype)
    x.flat[rng.choice(x.size, 6, replace=False)] = [np.nan, np.nan, -np.inf, -np.inf, np.inf, -np.inf]
    if fmt == "NCHW":
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    attrs = _pool_attrs(k, s, padding, fmt)
    y, y_plain = _both_ways("max_pool", [x], attrs)
    _assert_bits_equal(y[0], y_plain[0])
    g = rng.normal(size=y[0].shape).astype(dtype)
    g.flat[:4] = [-0.0, np.inf, np.nan, -np.inf]
    for kind, inputs, extra in (("max_pool_grad", [x, y[0], g], {}), ("avg_pool", [x], {}),
                                ("avg_pool_grad", [g], {"orig_input_shape": list(x.shape)})):
        jitted, plain = _both_ways(kind, inputs, {**attrs, **extra})
        _assert_bits_equal(jitted[0], plain[0])


TILINGS = [((3, 32, 32, 8), 2, "VALID"), ((3, 33, 33, 8), 2, "VALID"), ((3, 33, 33, 8), 2, "SAME"),
           ((2, 7, 7, 5), 3, "SAME"), ((2, 9, 8, 5), 3, "VALID")]


@pytest.mark.parametrize("shape,k,padding", TILINGS, ids=[f"{s[1]}x{s[2]}k{k}{p}" for s, k, p in TILINGS])
def test_max_pool_grad_non_overlapping_windows(shape, k, padding, rng):
    """Stride = kernel: windows that tile the input (32x32 VALID; SAME, padded on one side or both), that
    leave its last row and column out (33x33 VALID, 9x8 VALID); ties (rounded values, +0 and -0),
    infinities and non-finite gradients: the numba loop gives the numpy code's bits and TF's; with NaN
    in the input and a -0 gradient, the numpy code's bits."""
    x = np.round(rng.normal(size=shape) * 1.5).astype(F)
    zeros = np.flatnonzero(x == 0)
    x.flat[zeros] = np.where(rng.random(zeros.size) < 0.5, -0.0, 0.0).astype(F)
    x.flat[rng.choice(x.size, 4, replace=False)] = [np.inf, -np.inf, np.inf, -np.inf]
    attrs = _pool_attrs((k, k), (k, k), padding, "NHWC")
    kw = dict(ksize=[1, k, k, 1], strides=[1, k, k, 1], padding=padding)
    y = R.MaxPool(input=x, **kw)
    g = rng.normal(size=y.shape).astype(F)
    g.flat[:3] = [np.inf, np.nan, -np.inf]
    jitted, plain = _both_ways("max_pool_grad", [x, y.numpy(), g], attrs)
    _assert_bits_equal(jitted[0], plain[0])
    _assert_bits_equal(jitted[0], R.MaxPoolGrad(orig_input=x, orig_output=y, grad=g, **kw).numpy())
    x.flat[rng.choice(x.size, 6, replace=False)] = np.nan
    g.flat[3] = -0.0  # routed as is (TF adds it to a zero: +0)
    jitted, plain = _both_ways("max_pool_grad", [x, y.numpy(), g], attrs)
    _assert_bits_equal(jitted[0], plain[0])


@pytest.mark.parametrize("shape,k,padding", TILINGS, ids=[f"{s[1]}x{s[2]}k{k}{p}" for s, k, p in TILINGS])
def test_avg_pool_grad_of_non_overlapping_windows_writes_each_element_once(shape, k, padding, rng):
    """Stride = kernel (and a stride above the kernel: gaps no window covers): avg_pool_grad's write-once
    loop gives the numpy code's bits and TF's, -0 gradients (+0 out, as a sum onto zero gives) and
    non-finite ones included."""
    for stride in (k, k + 1):
        attrs = {**_pool_attrs((k, k), (stride, stride), padding, "NHWC"), "orig_input_shape": list(shape)}
        kw = dict(ksize=[1, k, k, 1], strides=[1, stride, stride, 1], padding=padding)
        g = rng.normal(size=R.AvgPool(value=np.zeros(shape, F), **kw).shape).astype(F)
        g.flat[:4] = [-0.0, np.inf, np.nan, -np.inf]
        jitted, plain = _both_ways("avg_pool_grad", [g], attrs)
        _assert_bits_equal(jitted[0], plain[0])
        _assert_bits_equal(jitted[0], R.AvgPoolGrad(orig_input_shape=list(shape), grad=g, **kw).numpy())


@pytest.mark.parametrize("shape,ksize,strides,padding,data_format", [
    ((2, 8, 8, 3), 2, 2, "VALID", "NHWC"),   # tiles the input
    ((2, 9, 9, 3), 2, 3, "VALID", "NHWC"),   # gaps between the windows
    ((2, 7, 7, 3), 3, 3, "SAME", "NHWC"),    # padded
    ((2, 7, 7, 3), 3, 2, "SAME", "NHWC"),    # overlapping: avg_pool_grad, then relu_grad
    ((2, 3, 8, 8), 2, 2, "VALID", "NCHW"),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_avg_pool_grad_relu_grad_is_the_two_kernels_bit_for_bit(shape, ksize, strides, padding, data_format,
                                                                      dtype, rng, jit):
    """relu_grad(avg_pool_grad(g), features) in one walk (kernels/fused.py): features of a relu's output (zeros,
    -0.0, NaN, inf, negatives where a relu's input would be) and gradients with -0.0, inf and NaN."""
    from cerebras_tf.wse.kernels.fused import FUSED
    nchw = data_format == "NCHW"
    features = np.maximum(rng.standard_normal(shape), 0).astype(dtype)
    flat = features.reshape(-1)
    flat[:6] = [-0.0, np.nan, np.inf, -1.0, 0.0, -np.inf]
    window = [1, 1, ksize, ksize] if nchw else [1, ksize, ksize, 1]
    step = [1, 1, strides, strides] if nchw else [1, strides, strides, 1]
    attrs = {"ksize": window, "strides": step, "padding": padding, "data_format": data_format,
             "orig_input_shape": list(shape)}
    pooled = run("avg_pool", [features], {k: v for k, v in attrs.items() if k != "orig_input_shape"})[0]
    g = rng.standard_normal(pooled.shape).astype(dtype)
    g.reshape(-1)[:4] = [-0.0, np.inf, np.nan, -np.inf]
    fused = FUSED[("avg_pool_grad", "relu_grad")].fn([g, features], attrs, None)[0]
    expected = run("relu_grad", [run("avg_pool_grad", [g], attrs)[0], features])[0]
    bits = np.uint32 if dtype == np.float32 else np.uint64
    assert fused.dtype == expected.dtype and fused.shape == expected.shape
    np.testing.assert_array_equal(fused.view(bits), expected.view(bits))


@pytest.mark.parametrize("shape,ksize,strides,padding,data_format", [
    ((2, 8, 8, 3), 2, 2, "VALID", "NHWC"),   # tiles the input
    ((2, 9, 9, 3), 2, 3, "VALID", "NHWC"),   # gaps between the windows
    ((2, 7, 7, 3), 3, 3, "SAME", "NHWC"),    # padded
    ((2, 7, 7, 3), 3, 2, "SAME", "NHWC"),    # overlapping: the gradient composes the kernels
    ((2, 3, 8, 8), 2, 2, "VALID", "NCHW"),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_avg_pool_and_its_gradient_of_a_bias_relu_are_the_kernels_bit_for_bit(shape, ksize, strides, padding,
                                                                              data_format, dtype, rng, jit):
    """A conv block's bias_add -> relu folded into its average pool and the pool's gradient
    (fusion.bias_relu_pools): avg_pool_of_bias_relu(x, b) is avg_pool(relu(bias_add(x, b))), and
    avg_pool_grad_of_bias_relu(g, x, b) is relu_grad(avg_pool_grad(g), relu(bias_add(x, b))), bit for bit, with
    -0.0, NaN, inf and sums that cancel to zero in x + b, and -0.0, NaN, inf in the gradient."""
    from cerebras_tf.wse.kernels.pool import avg_pool_grad_of_bias_relu, avg_pool_of_bias_relu
    nchw = data_format == "NCHW"
    x = rng.standard_normal(shape).astype(dtype)
    channels = shape[1] if nchw else shape[-1]
    b = rng.standard_normal(channels).astype(dtype)
    b[0] = -0.0
    flat = x.reshape(-1)
    flat[:8] = [-0.0, np.nan, np.inf, -1.0, 0.0, -np.inf, 0.0, 1e-30]
    flat[6] = -b[0 if nchw else 6 % channels]  # x + b == +0: not > 0
    window = [1, 1, ksize, ksize] if nchw else [1, ksize, ksize, 1]
    step = [1, 1, strides, strides] if nchw else [1, strides, strides, 1]
    pool_attrs = {"ksize": window, "strides": step, "padding": padding, "data_format": data_format}
    attrs = {**pool_attrs, "orig_input_shape": list(shape)}
    y = run("relu", [run("bias_add", [x, b], {"data_format": data_format})[0]])[0]
    expected_pool = run("avg_pool", [y], pool_attrs)[0]
    g = rng.standard_normal(expected_pool.shape).astype(dtype)
    g.reshape(-1)[:4] = [-0.0, np.inf, np.nan, -np.inf]
    expected_grad = run("relu_grad", [run("avg_pool_grad", [g], attrs)[0], y])[0]
    with np.errstate(invalid="ignore"):  # inf - inf in x + b
        _assert_bits_equal(avg_pool_of_bias_relu([x, b], pool_attrs, None)[0], expected_pool)
        _assert_bits_equal(avg_pool_grad_of_bias_relu([g, x, b], attrs, None)[0], expected_grad)


@pytest.mark.parametrize("kind", ["max_pool", "max_pool_grad", "avg_pool", "avg_pool_grad"])
def test_pool_numba_loops_split_across_threads_are_bit_identical(kind, rng, monkeypatch):
    """Big enough to be split by image across several threads (three here, whatever the host has)."""
    monkeypatch.setattr(threads, "host_threads", lambda: 3)
    x = np.maximum(np.round(rng.normal(size=(5, 40, 40, 16))), 0).astype(F)  # ReLU-like: many ties
    attrs = _pool_attrs((3, 3), (2, 2), "SAME", "NHWC")
    y = run("max_pool", [x], attrs)[0]
    g = rng.normal(size=y.shape).astype(F)
    inputs = {"max_pool": [x], "max_pool_grad": [x, y, g], "avg_pool": [x], "avg_pool_grad": [g]}[kind]
    jitted, plain = _both_ways(kind, inputs, {**attrs, "orig_input_shape": list(x.shape)})
    _assert_bits_equal(jitted[0], plain[0])


def test_split_units_covers_every_unit_once(monkeypatch):
    monkeypatch.setattr(threads, "host_threads", lambda: 3)
    monkeypatch.setattr(threads, "MIN_ELEMENTS_PER_THREAD", 1)
    for units, size in ((0, 5), (1, 5), (2, 1), (7, 3), (100, 1), (5, 1000)):
        seen: list[int] = []
        split_units(units, size, lambda lo, hi, seen=seen: seen.extend(range(lo, hi)))
        assert sorted(seen) == list(range(units))


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape,fmt,dtype", [((4, 5, 6, 3), "NHWC", F), ((3, 7, 4, 5), "NCHW", F),
                                             ((16, 24, 24, 32), "NHWC", F), ((9, 700), "NHWC", F),
                                             ((4, 5, 6, 3), "NHWC", np.float16)])
def test_batch_norm_numba_loops_match_numpy(shape, fmt, dtype, training, rng, monkeypatch):
    """The numba path sums in blocks of rows (another order than numpy's): equal within float32
    rounding, relative to each output's magnitude; split across threads or not, the same bits."""
    c = shape[1] if fmt == "NCHW" else shape[-1]
    x = (rng.normal(size=shape) * 2 + 1).astype(dtype)
    dy = rng.normal(size=shape).astype(dtype)
    scale, offset = rng.normal(size=c).astype(F), rng.normal(size=c).astype(F)
    mean, var = rng.normal(size=c).astype(F), np.abs(rng.normal(size=c)).astype(F)
    attrs = {"epsilon": 1e-3, "exponential_avg_factor": 0.1, "data_format": fmt, "is_training": training}
    fwd, fwd_plain = _both_ways("fused_batch_norm", [x, scale, offset, mean, var], attrs)
    bwd, bwd_plain = _both_ways("fused_batch_norm_grad", [dy, x, scale, fwd[3], fwd[4], fwd[5]], attrs)
    tol = 1e-6 if dtype == F else 1e-3  # float16 outputs: one half ulp may round either way
    for ours, numpy_ in zip(fwd[:5] + bwd[:3], fwd_plain[:5] + bwd_plain[:3]):
        assert ours.dtype == numpy_.dtype and ours.shape == numpy_.shape
        o, n = ours.astype(np.float64), numpy_.astype(np.float64)
        assert np.max(np.abs(o - n)) <= tol * np.max(np.abs(n)), np.max(np.abs(o - n)) / np.max(np.abs(n))
    monkeypatch.setattr(threads, "host_threads", lambda: 3)
    monkeypatch.setattr(threads, "MIN_ELEMENTS_PER_THREAD", 1)
    with _jit.use_jit(True):
        split = run("fused_batch_norm", [x, scale, offset, mean, var], attrs)
        split += run("fused_batch_norm_grad", [dy, x, scale, fwd[3], fwd[4], fwd[5]], attrs)
    for a, b in zip(split[:5] + split[6:9], fwd[:5] + bwd[:3]):
        _assert_bits_equal(a, b)


def test_softmax_family(rng):
    x = (rng.normal(size=(16, 10)) * 5).astype(F)
    check(run("softmax", [x])[0], R.Softmax(logits=x))
    check(run("log_softmax", [x])[0], R.LogSoftmax(logits=x), rtol=1e-6, atol=2e-6)
    labels = R.Softmax(logits=rng.normal(size=(16, 10)).astype(F)).numpy()
    ours = run("softmax_cross_entropy", [x, labels])
    theirs = R.SoftmaxCrossEntropyWithLogits(features=x, labels=labels)
    check(ours[0], theirs[0], rtol=1e-6, atol=2e-6)
    check(ours[1], theirs[1])
    sparse = rng.integers(0, 10, size=16).astype(np.int32)
    ours = run("sparse_softmax_cross_entropy", [x, sparse])
    theirs = R.SparseSoftmaxCrossEntropyWithLogits(features=x, labels=sparse)
    check(ours[0], theirs[0], rtol=1e-6, atol=2e-6)
    check(ours[1], theirs[1])
    check(run("l2_loss", [x])[0], R.L2Loss(t=x), rtol=1e-5)


@pytest.mark.parametrize("size", [7, 65536, 65537, 65536 + 8193, 300001, 1 << 20])
def test_l2_loss_by_blocks_gives_the_bits_of_numpys_square_and_sum(size, rng):
    """numpy's order, which differs between numpy 1.x (a sum over more than 8192 elements goes in chunks of
    its buffer) and 2.x (one pairwise sum); the blocks follow the installed numpy."""
    x = (rng.normal(size=size) * 30).astype(F)
    expected = np.asarray(np.square(x).sum(dtype=F) / F(2), F)
    _assert_bits_equal(run("l2_loss", [x])[0], expected)
    _assert_bits_equal(run("l2_loss", [x.reshape(-1, 1)])[0], expected)
    x[::97] = np.nan
    assert np.isnan(run("l2_loss", [x])[0])


def test_l2_loss_keeps_no_reference_to_its_input():
    """No reference cycle holds the input (a gradient, for a global norm) until the garbage collector runs: a
    recursive closure did, and a transformer step's gradients piled up, 12 MB a step."""
    import gc
    import sys

    x = np.ones(300001, F)
    gc.disable()
    try:
        before = sys.getrefcount(x)
        run("l2_loss", [x])
        assert sys.getrefcount(x) == before
    finally:
        gc.enable()


@pytest.mark.parametrize("shape", [(64, 10), (7, 33), (3, 1), (160, 8000), (300, 1000)])
def test_sparse_xent_loops_give_the_numpy_codes_bits(shape, rng):
    """softmax._sparse_xent_loops (float32 rows up to 8192 long: blocks of rows, split across threads when big)
    gives the loss and gradient of the numpy code bit for bit: padding rows (-1, and out-of-range labels
    where the kernel does not check them), infinities, rows of ties; a row with a NaN is all NaN either way."""
    from cerebras_tf.wse.kernels import _jit
    rows, n = shape
    x = (rng.normal(size=shape) * 6).astype(F)
    x[0, :] = 2.5  # ties
    x[1 % rows, 0] = np.inf
    x[2 % rows, -1] = -np.inf
    labels = rng.integers(0, n, size=rows).astype(np.int32)
    labels[rng.random(rows) < 0.2] = -1
    unchecked = labels.copy()
    unchecked[rng.random(rows) < 0.1] = n + 3
    if rows > 4:
        x[4, n // 2] = np.nan
    for ys, checked in ((labels, True), (unchecked, False)):
        with _jit.use_jit(True):
            ours = run("sparse_softmax_cross_entropy", [x, ys], check=checked)
        with _jit.use_jit(False):
            reference = run("sparse_softmax_cross_entropy", [x, ys], check=checked)
        for a, b in zip(ours, reference):
            assert a.dtype == b.dtype == F and a.shape == b.shape
            np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
            both = ~np.isnan(a)
            np.testing.assert_array_equal(a[both].view(np.uint32), b[both].view(np.uint32))
        if rows > 4:
            assert np.isnan(ours[1][4]).all() == (ys[4] != -1 and ys[4] < n)


@pytest.mark.parametrize("labels", [[0, 4, 1], [0, -3, 5], [-2, 3, -1]])
def test_sparse_xent_out_of_range_label_raises_what_tfs_cpu_kernel_raises(rng, labels):
    x = rng.normal(size=(3, 4)).astype(F)
    labels = np.array(labels, np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError) as theirs:
        R.SparseSoftmaxCrossEntropyWithLogits(features=x, labels=labels)
    with pytest.raises(KernelInputError) as ours:
        run("sparse_softmax_cross_entropy", [x, labels])
    assert str(ours.value) == theirs.value.message.split("}} ", 1)[-1].split(" [Op:")[0]


def test_sparse_xent_label_minus_one_is_padding_with_no_loss_and_no_gradient(rng):
    """The CS system skips the padding label -1 (the zoo's variable-sequence-length mlm_pad_id); every other row
    is TF's, and an out-of-range label next to the padding still raises, naming it (as TF would)."""
    x = rng.normal(size=(5, 4)).astype(F)
    labels = np.array([2, -1, 0, -1, 3], np.int32)
    loss, grad = run("sparse_softmax_cross_entropy", [x, labels])
    kept = labels != -1
    theirs = R.SparseSoftmaxCrossEntropyWithLogits(features=x[kept], labels=labels[kept])
    check(loss[kept], theirs[0], rtol=1e-6, atol=2e-6)
    check(grad[kept], theirs[1])
    assert not loss[~kept].any() and not grad[~kept].any()
    with pytest.raises(KernelInputError, match=r"label value of 4 .* Label values: 2 -1 4"):
        run("sparse_softmax_cross_entropy", [x[:3], np.array([2, -1, 4], np.int32)])


@pytest.mark.parametrize("training", [True, False])
def test_fused_batch_norm_relu_is_the_two_kernels_bit_for_bit(training, rng, jit):
    from cerebras_tf.wse.kernels.fused import FUSED
    x = rng.standard_normal((4, 5, 6, 3)).astype(np.float32)
    x[0, 0, 0] = [np.nan, -0.0, 0.0]
    inputs = [x, rng.random(3).astype(np.float32) + 0.5, rng.standard_normal(3).astype(np.float32),
              rng.standard_normal(3).astype(np.float32), rng.random(3).astype(np.float32) + 0.5]
    attrs = {"epsilon": 1e-3, "is_training": training}
    separate = run("fused_batch_norm", inputs, attrs)
    fused = FUSED[("fused_batch_norm", "relu")].fn(inputs, attrs, None)
    np.testing.assert_array_equal(fused[0], run("relu", [separate[0]])[0])
    assert not np.signbit(fused[0][~np.isnan(fused[0])]).any()
    for a, b in zip(fused[1:], separate[1:]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape,ksize,strides,padding", [
    ((2, 8, 8, 3), 2, 2, "VALID"),   # tiles the input
    ((2, 9, 9, 3), 2, 2, "VALID"),   # a row and column in no window
    ((2, 7, 7, 3), 3, 3, "SAME"),    # padded
    ((2, 7, 7, 3), 3, 2, "SAME"),    # overlapping: max_pool_grad, then relu_grad
])
def test_fused_max_pool_grad_relu_grad_is_the_two_kernels_bit_for_bit(shape, ksize, strides, padding, rng, jit):
    from cerebras_tf.wse.kernels.fused import FUSED
    x = np.maximum(rng.standard_normal(shape), 0).astype(np.float32)  # a relu's output: many zeros, ties
    x[0, :2, :2, 0] = 0.0
    x[1, 0, 0, 1] = np.inf
    attrs = {"ksize": [1, ksize, ksize, 1], "strides": [1, strides, strides, 1], "padding": padding}
    y = run("max_pool", [x], attrs)[0]
    g = rng.standard_normal(y.shape).astype(np.float32)
    g[0, 0, 0, 2] = -0.0
    inputs = [x, y, g]
    fused = FUSED[("max_pool_grad", "relu_grad")].fn(inputs, attrs, None)[0]
    expected = run("relu_grad", [run("max_pool_grad", inputs, attrs)[0], x])[0]
    assert fused.dtype == expected.dtype
    np.testing.assert_array_equal(fused.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("shape,ksize,strides,padding", [
    ((2, 8, 8, 3), 2, 2, "VALID"),   # tiles the input
    ((2, 9, 9, 3), 2, 2, "VALID"),   # a row and column in no window
    ((2, 7, 7, 3), 3, 3, "SAME"),    # padded
    ((2, 7, 7, 3), 3, 2, "SAME"),    # overlapping
    ((2, 6, 6, 3), 3, 1, "SAME"),    # overlapping, stride 1
])
@pytest.mark.parametrize("relu", [False, True])
def test_max_pool_grad_with_known_maxima_is_max_pool_grad_bit_for_bit(shape, ksize, strides, padding, relu, rng, jit):
    """Reading the window maxima from orig_output (the executor's choice where the program shows it is
    max_pool(orig_input): wse/fusion.py's known_maxima) routes every gradient as taking them again does:
    ties, NaN and inf windows, -0.0 against 0.0, all -inf windows, non-finite gradients."""
    from cerebras_tf.wse.fusion import WITH_KNOWN_MAXIMA
    from cerebras_tf.wse.kernels.fused import FUSED
    x = np.maximum(np.round(rng.standard_normal(shape) * 2), 0).astype(F)  # a relu's output: ties
    x[0, :2, :2, 0] = 0.0
    x[0, 0, 1, 0] = -0.0
    x[1, 0, 0, 1] = np.inf
    x[1, 2, 2, 2] = np.nan
    x[1, 3:6, 3:6, 0] = -np.inf
    attrs = {"ksize": [1, ksize, ksize, 1], "strides": [1, strides, strides, 1], "padding": padding}
    y = run("max_pool", [x], attrs)[0]
    g = rng.standard_normal(y.shape).astype(F)
    g.flat[:3] = [np.inf, -np.inf, np.nan]
    inputs = [x, y, g]
    if relu:
        expected = FUSED[("max_pool_grad", "relu_grad")].fn(inputs, attrs, None)[0]
    else:
        expected = run("max_pool_grad", inputs, attrs)[0]
    known = WITH_KNOWN_MAXIMA["relu_grad" if relu else ""](inputs, attrs, None)[0]
    assert known.dtype == expected.dtype
    np.testing.assert_array_equal(known.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("shape,ksize,strides,padding,data_format", [
    ((2, 8, 8, 3), 2, 2, "VALID", "NHWC"),   # tiles the input
    ((2, 9, 9, 3), 2, 2, "VALID", "NHWC"),   # a row and column in no window
    ((2, 7, 7, 3), 3, 3, "SAME", "NHWC"),    # padded
    ((2, 9, 9, 3), 2, 3, "VALID", "NHWC"),   # gaps between the windows
    ((2, 3, 8, 8), 2, 2, "VALID", "NCHW"),
])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_max_pool_keeping_its_winning_taps_gives_max_pool_and_its_gradient_bit_for_bit(
        shape, ksize, strides, padding, data_format, relu, dtype, rng, jit):
    """WinningTaps (the executor's pool and gradient sharing each window's winning tap: fusion.winning_taps):
    the pool's output is max_pool's, and the gradient from its taps is max_pool_grad's (relu_grad'ed with
    relu), which reads the pooled input again: ties, NaN and inf windows, -0.0 against 0.0, all -inf windows,
    windows of no positive value, non-finite gradients. The pool's input is then changed, so a gradient that
    read it would differ. Without numba both fall back to the kernels that take the maxima again."""
    from cerebras_tf.wse.kernels.fused import FUSED
    from cerebras_tf.wse.kernels.pool import WinningTaps, keeps_winning_taps
    nchw = data_format == "NCHW"
    x = np.maximum(np.round(rng.standard_normal(shape) * 2), 0).astype(dtype)  # a relu's output: ties
    nhwc = x.transpose(0, 2, 3, 1) if nchw else x
    nhwc[0, :2, :2, 0] = 0.0
    nhwc[0, 0, 1, 0] = -0.0
    nhwc[1, 0, 0, 1] = np.inf
    nhwc[1, 2, 2, 2] = np.nan
    nhwc[1, 3:6, 3:6, 0] = -np.inf
    nhwc[0, 4:6, 4:6, 1] = -1.0  # a window of no positive value
    window = [1, ksize, ksize, 1] if not nchw else [1, 1, ksize, ksize]
    step = [1, strides, strides, 1] if not nchw else [1, 1, strides, strides]
    attrs = {"ksize": window, "strides": step, "padding": padding, "data_format": data_format}
    assert keeps_winning_taps(attrs, shape, np.dtype(dtype)) == (jit == "numba")
    y = run("max_pool", [x], attrs)[0]
    g = rng.standard_normal(y.shape).astype(dtype)
    g.flat[:3] = [np.inf, -np.inf, np.nan]
    if relu:
        expected = FUSED[("max_pool_grad", "relu_grad")].fn([x, y, g], attrs, None)[0]
    else:
        expected = run("max_pool_grad", [x, y, g], attrs)[0]
    taps = WinningTaps(relu_grad=relu)
    pooled = taps.max_pool([x], attrs, None)[0]
    bits = np.uint32 if dtype == np.float32 else np.uint64
    np.testing.assert_array_equal(pooled.view(bits), y.view(bits))
    x_then = x.copy()
    if jit == "numba":
        x[...] = 7.0  # the gradient does not read the pooled input again
    dx = taps.max_pool_grad([x, y, g], attrs, None)[0]
    assert dx.dtype == expected.dtype and dx.shape == x_then.shape
    np.testing.assert_array_equal(dx.view(bits), expected.view(bits))


@pytest.mark.parametrize("shape,ksize,strides,padding", [
    ((2, 8, 8, 3), 2, 2, "VALID"),   # tiles the input
    ((2, 9, 9, 3), 2, 2, "VALID"),   # a row and column in no window
    ((2, 7, 7, 3), 3, 3, "SAME"),    # padded
    ((2, 9, 9, 3), 2, 3, "VALID"),   # gaps between the windows
])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("half_dtype", [None, "float16", "bfloat16", "cbfloat16"])
def test_a_batch_norm_relu_max_pool_gives_the_kernels_outputs_and_gradient_bit_for_bit(
        shape, ksize, strides, padding, training, half_dtype, rng, jit):
    """fused.batch_norm_relu_max_pool (fusion.batch_norm_relu_pools): the batch norm's outputs, its relu'd y
    max-pooled (never stored: the pool takes the normalized values at its taps), and the gradient from the
    taps alone (WinningTaps.max_pool_grad_of_taps) that of max_pool_grad -> relu_grad on y: with NaN, inf and
    -0.0 inputs, windows of no positive value, and a channel whose every value is the same (normalized to the
    offset: ties). The input is then changed, so a gradient that read it would differ. Without numba the pool
    keeps y for the gradient. With a half dtype the pooled output is round_half's of it (maxima that overflow
    float16, ties kept), and the gradient still routed by the unrounded maxima."""
    from cerebras_tf.wse.kernels.half import round_half
    from cerebras_tf.wse.kernels.fused import FUSED, batch_norm_relu_max_pool
    from cerebras_tf.wse.kernels.norm import batch_norm
    from cerebras_tf.wse.kernels.pool import WinningTaps
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, 0, :3, 0] = [np.nan, np.inf, -0.0]
    x[1, 2:4, 2:4, 1] = -50.0  # far below the mean: a window of no positive value
    x[..., 2] = 0.25  # one value: (x - mean) is 0, y is the offset's relu
    channels = shape[-1]
    inputs = [x, rng.standard_normal(channels).astype(np.float32), np.array([0.5, -0.25, 0.0], np.float32),
              rng.standard_normal(channels).astype(np.float32), rng.random(channels).astype(np.float32)]
    if half_dtype is not None:
        inputs[1][1] = 1e6  # channel 1's scale: maxima past float16's range (channel 0 holds a NaN)
    bn_attrs = {"epsilon": 1e-3, "is_training": training, "data_format": "NHWC"}
    pool_attrs = {"ksize": [1, ksize, ksize, 1], "strides": [1, strides, strides, 1], "padding": padding,
                  "data_format": "NHWC"}
    with np.errstate(invalid="ignore", over="ignore"):
        y, *statistics = batch_norm(inputs, bn_attrs, relu=True)
        pooled = run("max_pool", [y], pool_attrs)[0]
        g = rng.standard_normal(pooled.shape).astype(np.float32)
        g.flat[:3] = [np.inf, -np.inf, np.nan]
        expected = FUSED[("max_pool_grad", "relu_grad")].fn([y, pooled, g], pool_attrs, None)[0]
        taps = WinningTaps(relu_grad=True)
        outputs = batch_norm_relu_max_pool(taps, pool_attrs, half_dtype)(inputs, bn_attrs, None)
        rounded = pooled if half_dtype is None else round_half(pooled, half_dtype)
        if half_dtype == "float16":
            assert np.isinf(rounded).any() and not np.array_equal(rounded, pooled)
        for got, want in zip(outputs, [rounded, *statistics]):
            _assert_bits_equal(got, want)
        x[...] = 7.0  # the gradient reads neither the pool's input nor what it pooled
        dx = taps.max_pool_grad_of_taps(shape, np.float32)([g], pool_attrs, None)[0]
    _assert_bits_equal(dx, expected)
    assert taps._taps is None and taps._pooled is None  # nothing outlives the gradient


@pytest.mark.parametrize("half_dtype", ["float16", "bfloat16", "cbfloat16"])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_a_batch_norm_gradient_rounding_dx_as_it_writes_it_is_the_kernel_then_round_half_bit_for_bit(
        half_dtype, training, data_format, rng, jit):
    """norm.rounded_batch_norm_grad (a to_half after fused_batch_norm_grad, fused.ROUNDED_AS_WRITTEN): dx
    rounded in the loop that writes it (half.rounded: float16 and bfloat16) or by round_half after (cbfloat16,
    no numba) has the bits of the kernel then round_half, NaN, inf, -0, values halfway between two halves and
    values past the format's range included; the other outputs are the kernel's."""
    from cerebras_tf.wse.kernels.half import round_half
    from cerebras_tf.wse.kernels.norm import fused_batch_norm_grad, rounded_batch_norm_grad
    shape = (3, 4, 5, 6) if data_format == "NCHW" else (3, 5, 6, 4)
    channels = shape[1] if data_format == "NCHW" else shape[-1]
    dy = (rng.standard_normal(shape) * 3).astype(np.float32)
    flat = dy.reshape(-1)
    flat[:9] = [np.nan, np.inf, -np.inf, -0.0, 1e6,  # overflow
                1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8]  # ties to even: 10 and 7 bits
    flat[9:40] *= np.float32(2.0 ** -20)  # dx near and below the formats' smallest values
    x = rng.standard_normal(shape).astype(np.float32)
    scale = np.ones(channels, np.float32)  # with variance + epsilon 1, inference's dx is dy itself: the ties land
    inputs = [dy, x, scale, rng.standard_normal(channels).astype(np.float32), np.full(channels, 0.75, np.float32),
              np.zeros(0, np.float32)]
    attrs = {"epsilon": 0.25, "is_training": training, "data_format": data_format}
    with np.errstate(invalid="ignore", over="ignore"):
        dx, *others = fused_batch_norm_grad(inputs, attrs, None)
        want = round_half(dx, half_dtype)
        got, *got_others = rounded_batch_norm_grad(half_dtype)(inputs, attrs, None)
    _assert_bits_equal(got, want)
    assert not np.array_equal(want, dx, equal_nan=True)  # the rounding changed values: the check can fail
    for a, b in zip(got_others, others):
        _assert_bits_equal(a, b)
