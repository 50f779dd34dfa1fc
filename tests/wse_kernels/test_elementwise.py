"""Element-wise kernels and their gradients against tf.raw_ops."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf.amp.dtypes import round_to_half, set_half_dtype
from cerebras_tf.wse.kernels import eigen_erfc
from kernel_helpers import check, run, tf_op

R = tf.raw_ops
F = np.float32

UNARY = {
    "neg": R.Neg, "exp": R.Exp, "log": R.Log, "log1p": R.Log1p, "erf": R.Erf, "erfc": R.Erfc, "tanh": R.Tanh,
    "sigmoid": R.Sigmoid, "relu": R.Relu, "relu6": R.Relu6, "elu": R.Elu, "selu": R.Selu,
    "softplus": R.Softplus, "rsqrt": R.Rsqrt, "sqrt": R.Sqrt, "square": R.Square, "abs": R.Abs,
    "sign": R.Sign, "reciprocal": R.Reciprocal, "floor": R.Floor, "ceil": R.Ceil, "round": R.Round,
    "sin": R.Sin, "cos": R.Cos, "is_finite": R.IsFinite, "is_nan": R.IsNan, "zeros_like": R.ZerosLike,
    "ones_like": R.OnesLike,
}
POSITIVE = {"log", "rsqrt", "sqrt"}


def _x(rng, kind):
    x = (rng.normal(size=(7, 33)) * 4).astype(F)
    x[0, :6] = [0.5, -0.5, 1.5, 2.5, -2.5, 20.0]  # rounding ties, softplus threshold
    x[1, :3] = [-20.0, 6.5, 0.0]
    return np.abs(x) + F(0.1) if kind in POSITIVE else x


# Kinds whose float32 results are TF's bits here (eigen_erfc: the installed TF's form, where it has one;
# eigen_tanh).
EXACT = ({"erfc"} if eigen_erfc.FORM else set()) | {"tanh"}


@pytest.mark.parametrize("kind", sorted(UNARY))
def test_unary(kind, rng):
    x = _x(rng, kind)
    tol = 0.0 if kind in EXACT else 1e-6
    check(run(kind, [x])[0], tf_op(UNARY[kind], x), rtol=tol, atol=tol)


def test_unary_special_values(jit):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30], F)
    for kind in ("is_finite", "is_nan", "relu", "abs", "exp", "tanh"):
        check(run(kind, [x])[0], tf_op(UNARY[kind], x))


def test_leaky_relu_and_logical_not(rng):
    x = rng.normal(size=(5, 6)).astype(F)
    check(run("leaky_relu", [x], {"alpha": 0.3})[0], R.LeakyRelu(features=x, alpha=0.3))
    b = x > 0
    check(run("logical_not", [b])[0], R.LogicalNot(x=b))


BINARY = {
    "add": R.AddV2, "sub": R.Sub, "mul": R.Mul, "mul_no_nan": R.MulNoNan, "div": R.RealDiv,
    "div_no_nan": R.DivNoNan, "floor_div": R.FloorDiv, "floor_mod": R.FloorMod, "pow": R.Pow,
    "maximum": R.Maximum, "minimum": R.Minimum, "squared_difference": R.SquaredDifference,
    "equal": R.Equal, "not_equal": R.NotEqual, "less": R.Less, "less_equal": R.LessEqual,
    "greater": R.Greater, "greater_equal": R.GreaterEqual,
}


@pytest.mark.parametrize("kind", sorted(BINARY))
@pytest.mark.parametrize("shapes", [((4, 5), (4, 5)), ((3, 1, 5), (4, 1)), ((), (2, 3))])
def test_binary_float(kind, shapes, rng):
    x = (rng.normal(size=shapes[0]) * 3).astype(F)
    y = (rng.normal(size=shapes[1]) * 3).astype(F)
    if kind == "pow":
        x = np.abs(x) + F(0.5)
    if kind in ("mul_no_nan", "div_no_nan", "equal") and y.ndim:
        y.reshape(-1)[0] = 0
        x.reshape(-1)[-1] = y.reshape(-1)[-1] if kind == "equal" and x.size >= y.size else x.reshape(-1)[-1]
    check(run(kind, [x, y])[0], BINARY[kind](x=x, y=y))


@pytest.mark.parametrize("kind", ["add", "sub", "mul", "floor_div", "floor_mod", "maximum", "minimum",
                                  "pow", "squared_difference", "less", "equal"])
def test_binary_int(kind, rng):
    x = rng.integers(-20, 20, size=(6, 7)).astype(np.int32)
    y = rng.integers(1, 6, size=(6, 7)).astype(np.int32) * rng.choice([-1, 1], size=(6, 7)).astype(np.int32)
    if kind == "pow":
        x, y = np.clip(x, -3, 3), np.abs(y)
    check(run(kind, [x, y])[0], BINARY[kind](x=x, y=y))


def test_int_div_truncates(rng):
    x = np.array([7, -7, 7, -7], np.int32)
    y = np.array([2, 2, -2, -2], np.int32)
    check(run("div", [x, y])[0], R.Div(x=x, y=y))


def test_logical_binary(rng):
    a, b = rng.random((4, 5)) > 0.5, rng.random((1, 5)) > 0.5
    check(run("logical_and", [a, b])[0], R.LogicalAnd(x=a, y=b))
    check(run("logical_or", [a, b])[0], R.LogicalOr(x=a, y=b))


def test_bias_add_add_n_clip(rng):
    x = rng.normal(size=(2, 3, 4, 5)).astype(F)
    b5, b3 = rng.normal(size=5).astype(F), rng.normal(size=3).astype(F)
    check(run("bias_add", [x, b5], {"data_format": "NHWC"})[0], R.BiasAdd(value=x, bias=b5))
    check(run("bias_add", [x, b3], {"data_format": "NCHW"})[0], R.BiasAdd(value=x, bias=b3, data_format="NCHW"))
    xs = [rng.normal(size=(3, 4)).astype(F) for _ in range(5)]
    check(run("add_n", xs)[0], R.AddN(inputs=xs))
    lo, hi = F(-0.5), F(0.7)
    check(run("clip_by_value", [x, lo, hi])[0], R.ClipByValue(t=x, clip_value_min=lo, clip_value_max=hi))


def test_select_both_modes(rng):
    x, y = rng.normal(size=(4, 3)).astype(F), rng.normal(size=(4, 3)).astype(F)
    rows = np.array([True, False, True, False])
    check(run("select", [rows, x, y], {"broadcast": "v1"})[0], R.Select(condition=rows, x=x, y=y))
    full = rng.random((4, 3)) > 0.5
    check(run("select", [full, x, y], {"broadcast": "v1"})[0], R.Select(condition=full, x=x, y=y))
    cond = rng.random((3,)) > 0.5  # numpy broadcasting: along the last axis
    check(run("select", [cond, x, y], {"broadcast": "numpy"})[0], R.SelectV2(condition=cond, t=x, e=y))
    check(run("select", [np.array(True), x, F(2)])[0], R.SelectV2(condition=True, t=x, e=F(2)))


@pytest.mark.parametrize("to,tf_dtype", [("int32", tf.int32), ("int64", tf.int64), ("bool", tf.bool),
                                         ("float32", tf.float32), ("float16", tf.float16)])
def test_cast(to, tf_dtype, rng):
    x = (rng.normal(size=(6, 7)) * 5).astype(F)
    x[0, :3] = [0.0, -0.0, 2.5]
    check(run("cast", [x], {"to": to})[0], tf.cast(x, tf_dtype), rtol=0, atol=0)
    i = rng.integers(-5, 5, size=(3, 4)).astype(np.int32)
    check(run("cast", [i], {"to": to})[0], tf.cast(i, tf_dtype), rtol=0, atol=0)


@pytest.mark.parametrize("half,tf_dtype", [("float16", tf.float16), ("bfloat16", tf.bfloat16)])
def test_cast_to_half_matches_tf(half, tf_dtype, rng, jit):
    x = (rng.normal(size=(64, 64)) * np.exp(rng.normal(size=(64, 64)) * 4)).astype(F)
    x[0, :4] = [70000.0, -1e-8, 3e-5, np.nan]
    want = tf.cast(tf.cast(x, tf_dtype), tf.float32).numpy()
    set_half_dtype(half)
    try:
        got = run("cast", [x], {"to": "half"})[0]
    finally:
        set_half_dtype("float16")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run("cast", [x], {"to": half})[0].astype(F), want)


def test_cast_to_cbfloat16_rounds(jit):
    x = np.array([1.0 + 2.0 ** -10, 1.0 + 3 * 2.0 ** -10, 1.0], F)
    np.testing.assert_array_equal(run("cast", [x], {"to": "cbfloat16"})[0], round_to_half(x, "cbfloat16"))
    assert run("cast", [x], {"to": "cbfloat16"})[0][0] == 1.0  # tie rounds to even


# ---- gradients --------------------------------------------------------------------------

GRAD_GF = {"relu_grad": R.ReluGrad, "relu6_grad": R.Relu6Grad, "softplus_grad": R.SoftplusGrad}
GRAD_GY = {"elu_grad": (R.EluGrad, R.Elu), "selu_grad": (R.SeluGrad, R.Selu)}
GRAD_YDY = {"tanh_grad": (R.TanhGrad, R.Tanh), "sigmoid_grad": (R.SigmoidGrad, R.Sigmoid),
            "rsqrt_grad": (R.RsqrtGrad, R.Rsqrt), "sqrt_grad": (R.SqrtGrad, R.Sqrt),
            "reciprocal_grad": (R.ReciprocalGrad, R.Reciprocal)}


@pytest.mark.parametrize("kind", sorted(GRAD_GF))
def test_grad_of_features(kind, rng, jit):
    f = (rng.normal(size=(6, 9)) * 4).astype(F)
    f[0, :3] = [0.0, 6.0, -0.0]
    g = rng.normal(size=(6, 9)).astype(F)
    check(run(kind, [g, f])[0], GRAD_GF[kind](gradients=g, features=f))


def test_leaky_relu_grad(rng):
    f, g = rng.normal(size=(6, 9)).astype(F), rng.normal(size=(6, 9)).astype(F)
    check(run("leaky_relu_grad", [g, f], {"alpha": 0.1})[0], R.LeakyReluGrad(gradients=g, features=f, alpha=0.1))


@pytest.mark.parametrize("kind", sorted(GRAD_GY))
def test_grad_of_outputs(kind, rng):
    op, fwd = GRAD_GY[kind]
    y = tf_op(fwd, rng.normal(size=(6, 9)).astype(F) * 3).numpy()
    g = rng.normal(size=(6, 9)).astype(F)
    check(run(kind, [g, y])[0], op(gradients=g, outputs=y))


@pytest.mark.parametrize("kind", sorted(GRAD_YDY))
def test_grad_y_dy(kind, rng):
    op, fwd = GRAD_YDY[kind]
    y = tf_op(fwd, np.abs(rng.normal(size=(6, 9))).astype(F) + F(0.2)).numpy()
    dy = rng.normal(size=(6, 9)).astype(F)
    check(run(kind, [y, dy])[0], op(y=y, dy=dy))


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_bias_add_grad(fmt, rng, jit):
    g = rng.normal(size=(3, 4, 5, 6)).astype(F)
    check(run("bias_add_grad", [g], {"data_format": fmt})[0], R.BiasAddGrad(out_backprop=g, data_format=fmt),
          rtol=1e-5)


@pytest.mark.parametrize("shape", [(4096, 2), (64, 9, 9, 3), (7, 300), (5, 1), (2, 3, 1000)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bias_add_grad_loop_gives_numpys_sums_bit_for_bit(shape, dtype, rng):
    from cerebras_tf.wse.kernels import _jit
    g = rng.normal(size=shape).astype(dtype)
    with _jit.use_jit(True):
        ours = run("bias_add_grad", [g])[0]
    with _jit.use_jit(False):
        reference = run("bias_add_grad", [g])[0]
    assert ours.dtype == reference.dtype == dtype
    np.testing.assert_array_equal(ours, reference)


@pytest.mark.parametrize("half_dtype", ["float16", "bfloat16", "cbfloat16"])
@pytest.mark.parametrize("fmt,shape", [("NHWC", (3, 5, 6, 4)), ("NCHW", (3, 4, 5, 6)), ("NHWC", (40, 7)),
                                       ("NHWC", (9, 1))])
def test_bias_add_grad_beside_a_rounding_of_its_input_is_the_two_kernels_bit_for_bit(half_dtype, fmt, shape, rng,
                                                                                     jit):
    """elementwise_grad.bias_add_grad_and_rounding (a to_half beside bias_add_grad, fused.ROUNDED_BESIDE): the
    bias gradient and the input rounded in one pass (numba, channels last, float16 and bfloat16) or by the two
    kernels have the bits of bias_add_grad and round_half, NaN, inf, -0, values past the format's range, values
    below its smallest and exact ties of both formats included."""
    from cerebras_tf.wse.kernels.elementwise_grad import bias_add_grad_and_rounding
    from cerebras_tf.wse.kernels.half import round_half
    g = (rng.standard_normal(shape) * 3).astype(F)
    flat = g.reshape(-1)
    flat[:9] = [np.nan, np.inf, -np.inf, -0.0, 1e6,  # overflow
                1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8]  # ties to even: 10 and 7 bits
    flat[9:30] *= F(2.0 ** -20)  # near and below the formats' smallest values
    flat[-1] = -0.0
    attrs = {"data_format": fmt}
    with np.errstate(invalid="ignore", over="ignore"):
        want_sums = run("bias_add_grad", [g], attrs)[0]
        want = round_half(g, half_dtype)
        got_sums, got = bias_add_grad_and_rounding(half_dtype)([g, g], attrs, None)
    assert not np.array_equal(want, g, equal_nan=True)  # the rounding changed values: the check can fail
    for a, b in ((got_sums, want_sums), (got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("exponent", [0.5, 2.0, 3.0, -0.5, -1.0, 1.7])
def test_pow_with_a_scalar_exponent(exponent, rng):
    """The rewritten forms (x**3 as Square(x) * x, ...) agree with TF's Pow within an ulp or two (TF's own CPU
    pow is a vectorised approximation, so neither form is TF's bit for bit)."""
    x = (rng.normal(size=(64, 33)) * 3).astype(F)
    x[0, :4] = [0.0, -0.0, np.inf, np.nan]
    with np.errstate(all="ignore"):
        got = run("pow", [x, F(exponent)])[0]
    check(got, R.Pow(x=x, y=F(exponent)), rtol=3e-7, atol=0)


@pytest.mark.parametrize("shape,data_format", [((6, 5), "NHWC"), ((2, 3, 4, 5), "NHWC"), ((2, 5, 3, 4), "NCHW")])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_bias_add_relu_is_the_two_kernels_bit_for_bit(shape, data_format, dtype, rng, jit):
    from cerebras_tf.wse.kernels.fused import FUSED
    x = rng.standard_normal(shape).astype(dtype)
    x.flat[:3] = [np.nan, -0.0, np.inf]
    b = rng.standard_normal(shape[1] if data_format == "NCHW" else shape[-1]).astype(dtype)
    b[1] = 0.0
    attrs = {"data_format": data_format}
    fused = FUSED[("bias_add", "relu")].fn([x, b], attrs, None)[0]
    expected = run("relu", run("bias_add", [x, b], attrs))[0]
    assert fused.dtype == expected.dtype
    np.testing.assert_array_equal(fused, expected)
    assert not np.signbit(fused[~np.isnan(fused)]).any()
