"""matmul / batch_matmul / einsum / conv2d family against tf.raw_ops (float32 accumulation), on every
host-kernel provider (the `host_kernels` fixture: numpy/OpenBLAS and TensorFlow's own kernels)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from kernel_helpers import check, run

R = tf.raw_ops
F = np.float32
TOL = dict(rtol=1e-5, atol=1e-5)

pytestmark = pytest.mark.usefixtures("host_kernels")


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul(ta, tb, rng):
    a = rng.normal(size=(64, 40) if not ta else (40, 64)).astype(F)
    b = rng.normal(size=(40, 24) if not tb else (24, 40)).astype(F)
    check(run("matmul", [a, b], {"transpose_a": ta, "transpose_b": tb})[0],
          R.MatMul(a=a, b=b, transpose_a=ta, transpose_b=tb), **TOL)


def test_matmul_float16_inputs_accumulate_in_float32(rng):
    a = rng.normal(size=(8, 300)).astype(np.float16)
    b = rng.normal(size=(300, 5)).astype(np.float16)
    got = run("matmul", [a, b])[0]
    assert got.dtype == np.float16
    exact = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)
    np.testing.assert_array_equal(got, exact)


@pytest.mark.parametrize("adj", [(False, False), (True, False), (False, True)])
def test_batch_matmul(adj, rng):
    a = rng.normal(size=(3, 1, 5, 6) if not adj[0] else (3, 1, 6, 5)).astype(F)
    b = rng.normal(size=(4, 6, 7) if not adj[1] else (4, 7, 6)).astype(F)
    check(run("batch_matmul", [a, b], {"adj_x": adj[0], "adj_y": adj[1]})[0],
          R.BatchMatMulV2(x=a, y=b, adj_x=adj[0], adj_y=adj[1]), **TOL)


@pytest.mark.parametrize("eq,shapes", [("ij,jk->ik", [(5, 6), (6, 7)]), ("bij,bjk->bik", [(2, 5, 6), (2, 6, 3)]),
                                       ("...ij,jk->...ik", [(2, 3, 4), (4, 5)]), ("bhd,bd->bh", [(2, 3, 4), (2, 4)])])
def test_einsum(eq, shapes, rng):
    xs = [rng.normal(size=s).astype(F) for s in shapes]
    check(run("einsum", xs, {"equation": eq})[0], R.Einsum(inputs=xs, equation=eq), **TOL)


CONV_CASES = [
    # (x shape NHWC, filter shape, strides, padding, dilations, explicit)
    ((2, 9, 9, 3), (3, 3, 3, 4), (1, 1), "SAME", (1, 1), None),
    ((2, 9, 8, 3), (3, 2, 3, 4), (2, 2), "SAME", (1, 1), None),
    ((2, 10, 10, 3), (5, 5, 3, 2), (2, 3), "VALID", (1, 1), None),
    ((1, 11, 11, 2), (3, 3, 2, 3), (1, 1), "SAME", (2, 2), None),
    ((2, 8, 8, 3), (3, 3, 3, 2), (1, 1), "EXPLICIT", (1, 1), [0, 0, 1, 2, 0, 1, 0, 0]),
    ((3, 6, 6, 5), (1, 1, 5, 4), (1, 1), "VALID", (1, 1), None),
    ((2, 7, 7, 3), (2, 2, 3, 4), (2, 2), "VALID", (1, 1), None),
]


def _attrs(strides, padding, dil, explicit):
    a = {"strides": [1, *strides, 1], "padding": padding, "dilations": [1, *dil, 1], "data_format": "NHWC"}
    if explicit:
        a["explicit_paddings"] = explicit
    return a


def _tf_kw(strides, padding, dil, explicit):
    kw = dict(strides=[1, *strides, 1], padding=padding, dilations=[1, *dil, 1])
    if explicit:
        kw["explicit_paddings"] = explicit
    return kw


@pytest.mark.parametrize("case", CONV_CASES, ids=range(len(CONV_CASES)))
def test_conv2d_and_backprops(case, rng):
    xs, fs, strides, padding, dil, explicit = case
    x, f = rng.normal(size=xs).astype(F), rng.normal(size=fs).astype(F)
    attrs, kw = _attrs(strides, padding, dil, explicit), _tf_kw(strides, padding, dil, explicit)
    y_tf = R.Conv2D(input=x, filter=f, **kw)
    check(run("conv2d", [x, f], attrs)[0], y_tf, **TOL)
    dy = rng.normal(size=y_tf.shape).astype(F)
    if dil != (1, 1):  # TF's CPU backprops refuse dilations > 1: check the adjoint identities instead
        dx = run("conv2d_backprop_input", [f, dy], {**attrs, "input_sizes": list(xs)})[0]
        df = run("conv2d_backprop_filter", [x, dy], {**attrs, "filter_sizes": list(fs)})[0]
        lhs = float(np.sum(y_tf.numpy().astype(np.float64) * dy))
        np.testing.assert_allclose(float(np.sum(x.astype(np.float64) * dx)), lhs, rtol=1e-5)
        np.testing.assert_allclose(float(np.sum(f.astype(np.float64) * df)), lhs, rtol=1e-5)
        return
    check(run("conv2d_backprop_input", [f, dy], {**attrs, "input_sizes": list(xs)})[0],
          R.Conv2DBackpropInput(input_sizes=list(xs), filter=f, out_backprop=dy, **kw), **TOL)
    check(run("conv2d_backprop_filter", [x, dy], {**attrs, "filter_sizes": list(fs)})[0],
          R.Conv2DBackpropFilter(input=x, filter_sizes=list(fs), out_backprop=dy, **kw), rtol=2e-5, atol=2e-5)


# (x shape, filter shape, strides, dilations, explicit paddings): negative paddings crop, which TF refuses
ADJOINT_CASES = [
    ((2, 9, 8, 3), (3, 3, 3, 4), (1, 1), (1, 1), [0, 0, -1, 2, 1, -2, 0, 0]),
    ((2, 11, 10, 2), (3, 2, 2, 3), (2, 3), (2, 1), [0, 0, 3, -1, -1, 4, 0, 0]),
    ((1, 7, 7, 2), (5, 5, 2, 2), (3, 1), (1, 2), [0, 0, 4, 4, 5, 0, 0, 0]),
]


@pytest.mark.parametrize("case", ADJOINT_CASES, ids=range(len(ADJOINT_CASES)))
def test_conv2d_input_gradient_is_the_adjoint_with_cropping_paddings(case, rng):
    """Per-tap input gradients (only where a tap reads the input) and padding into reused scratch
    memory against the dense im2col/col2im formulation, for crops, strides and dilations."""
    from cerebras_tf.wse.kernels.conv_geometry import Geom as _Geom, col2im, im2col
    xs, fs, strides, dil, explicit = case
    attrs = _attrs(strides, "EXPLICIT", dil, explicit)
    x, f = rng.normal(size=xs).astype(F), rng.normal(size=fs).astype(F)
    g = _Geom(attrs, xs, fs[:2])
    cols = im2col(x, g).reshape(-1, fs[0] * fs[1] * fs[2])
    y = run("conv2d", [x, f], attrs)[0]
    np.testing.assert_allclose(y, (cols @ f.reshape(-1, fs[3])).reshape(y.shape), rtol=1e-6, atol=1e-6)
    dy = rng.normal(size=y.shape).astype(F)
    dx = run("conv2d_backprop_input", [f, dy], {**attrs, "input_sizes": list(xs)})[0]
    dcols = (dy.reshape(-1, fs[3]) @ f.reshape(-1, fs[3]).T).reshape(g.n, g.oh, g.ow, *fs[:3])
    np.testing.assert_allclose(dx, col2im(dcols, g), rtol=1e-5, atol=1e-5)
    df = run("conv2d_backprop_filter", [x, dy], {**attrs, "filter_sizes": list(fs)})[0]
    np.testing.assert_allclose(df, (cols.T @ dy.reshape(-1, fs[3])).reshape(fs), rtol=1e-5, atol=1e-5)


def test_conv2d_nchw_layout_matches_nhwc(rng):
    x, f = rng.normal(size=(2, 7, 7, 3)).astype(F), rng.normal(size=(3, 3, 3, 4)).astype(F)
    nhwc = run("conv2d", [x, f], {"strides": [1, 2, 2, 1], "padding": "SAME"})[0]
    nchw = run("conv2d", [x.transpose(0, 3, 1, 2), f], {"strides": [1, 1, 2, 2], "padding": "SAME",
                                                        "data_format": "NCHW"})[0]
    np.testing.assert_allclose(nchw.transpose(0, 2, 3, 1), nhwc, rtol=1e-6)


DW_CASES = [((2, 8, 8, 3), (3, 3, 3, 2), (1, 1), "SAME"), ((2, 9, 9, 4), (3, 3, 4, 1), (2, 2), "VALID")]


@pytest.mark.parametrize("case", DW_CASES, ids=range(len(DW_CASES)))
def test_depthwise_conv2d_and_backprops(case, rng):
    xs, fs, strides, padding = case
    x, f = rng.normal(size=xs).astype(F), rng.normal(size=fs).astype(F)
    attrs = {"strides": [1, *strides, 1], "padding": padding}
    kw = dict(strides=[1, *strides, 1], padding=padding)
    y_tf = R.DepthwiseConv2dNative(input=x, filter=f, **kw)
    check(run("depthwise_conv2d", [x, f], attrs)[0], y_tf, **TOL)
    dy = rng.normal(size=y_tf.shape).astype(F)
    check(run("depthwise_conv2d_backprop_input", [f, dy], {**attrs, "input_sizes": list(xs)})[0],
          R.DepthwiseConv2dNativeBackpropInput(input_sizes=list(xs), filter=f, out_backprop=dy, **kw), **TOL)
    check(run("depthwise_conv2d_backprop_filter", [x, dy], {**attrs, "filter_sizes": list(fs)})[0],
          R.DepthwiseConv2dNativeBackpropFilter(input=x, filter_sizes=list(fs), out_backprop=dy, **kw), **TOL)


@pytest.mark.parametrize("half,tf_dtype", [("float16", tf.float16), ("bfloat16", tf.bfloat16)])
def test_half_mode_matmul_and_conv_within_half_rounding(half, tf_dtype, rng):
    """Half numerics: inputs rounded by cast-to-half, float32 accumulation, result rounded to half:
    within one half ulp-ish of TF computing the same op in that dtype."""
    from cerebras_tf.amp.dtypes import half_format, set_half_dtype
    set_half_dtype(half)
    try:
        a, b = rng.normal(size=(32, 64)).astype(F), rng.normal(size=(64, 16)).astype(F)
        ah, bh = (run("cast", [v], {"to": "half"})[0] for v in (a, b))
        ours = run("cast", [run("matmul", [ah, bh])[0]], {"to": "half"})[0]
        x, f = rng.normal(size=(2, 6, 6, 3)).astype(F), rng.normal(size=(3, 3, 3, 4)).astype(F)
        xh, fh = (run("cast", [v], {"to": "half"})[0] for v in (x, f))
        conv = run("cast", [run("conv2d", [xh, fh], {"strides": [1, 1, 1, 1], "padding": "SAME"})[0]],
                   {"to": "half"})[0]
    finally:
        set_half_dtype("float16")
    eps = half_format(half).epsilon
    theirs = tf.cast(tf.matmul(tf.cast(a, tf_dtype), tf.cast(b, tf_dtype)), tf.float32).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=4 * eps, atol=4 * eps * np.abs(theirs).max())
    theirs = tf.cast(tf.nn.conv2d(tf.cast(x, tf_dtype), tf.cast(f, tf_dtype), 1, "SAME"), tf.float32).numpy()
    np.testing.assert_allclose(conv, theirs, rtol=4 * eps, atol=4 * eps * np.abs(theirs).max())


def test_integer_matmul_is_exact(rng):
    a = rng.integers(-1000, 1000, size=(6, 9)).astype(np.int32)
    b = rng.integers(-1000, 1000, size=(9, 4)).astype(np.int32)
    check(run("matmul", [a, b])[0], R.MatMul(a=a, b=b))
