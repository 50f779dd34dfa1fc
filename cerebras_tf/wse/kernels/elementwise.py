"""Element-wise kernels: unary, binary (numpy broadcasting), comparisons, logic, select, cast.

Semantics follow the TF op of the same name; float math is done in the input
dtype (float32 stays float32, no float64 detours except where noted).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

from cerebras_tf.amp import get_half_dtype
from cerebras_tf.wse.kernels import _jit, eigen_erfc, eigen_tanh
from cerebras_tf.wse.kernels._registry import KernelContext, KernelFn, np_dtype, register
from cerebras_tf.wse.kernels.eigen_erf import erf_float32
from cerebras_tf.wse.kernels.half import round_half
from cerebras_tf.wse.memory import empty_aligned
from cerebras_tf.wse.threads import STREAMING_MIN_ELEMENTS_PER_THREAD, map_elementwise

try:  # scipy ships with the test extras; fall back to math.erf/erfc (exact, slower) without it
    from scipy.special import erf as _erf
    from scipy.special import erfc as _erfc
except ImportError:  # pragma: no cover
    _erf_vec = np.frompyfunc(math.erf, 1, 1)
    _erfc_vec = np.frompyfunc(math.erfc, 1, 1)

    def _erf(x: np.ndarray) -> np.ndarray:
        return np.asarray(_erf_vec(np.asarray(x, np.float64)), np.float64)

    def _erfc(x: np.ndarray) -> np.ndarray:  # not 1 - erf(x): that loses every digit for large x
        return np.asarray(_erfc_vec(np.asarray(x, np.float64)), np.float64)

SELU_SCALE = 1.0507009873554804934193349852946
SELU_ALPHA = 1.6732632423543772848170429916717


def _same(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """Wrap `fn` so the result keeps the input's dtype."""
    def wrapped(x: np.ndarray) -> np.ndarray:
        return np.asarray(fn(x)).astype(x.dtype, copy=False)
    return wrapped


def _softplus(x: np.ndarray) -> np.ndarray:
    # TF: threshold = log(eps) + 2; x > -threshold -> x; x < threshold -> exp(x); else log1p(exp(x)).
    thr = np.log(np.finfo(x.dtype).eps) + 2 if x.dtype.kind == "f" else np.log(np.finfo(np.float32).eps) + 2
    with np.errstate(over="ignore"):
        return np.where(x > -thr, x, np.where(x < thr, np.exp(x), np.log1p(np.exp(x))))


def _sign(x: np.ndarray) -> np.ndarray:
    return np.sign(x)


@_jit.jit
def _relu_loop(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    zero = x.dtype.type(0)
    for i in range(x.size):
        out[i] = x[i] if x[i] > 0 or x[i] != x[i] else zero


@register("relu")
def relu(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """max(x, 0) as np.maximum gives it: NaN kept, -0 -> +0; one numba pass (on one thread
    below threads.STREAMING_MIN_ELEMENTS_PER_THREAD)."""
    x = inputs[0]
    if _jit.enabled() and x.dtype in (np.float32, np.float64):
        return [map_elementwise(_relu_loop, x, min_per_thread=STREAMING_MIN_ELEMENTS_PER_THREAD)]
    return [np.maximum(x, np.zeros((), x.dtype))]


_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "neg": np.negative,
    "exp": np.exp,
    "log": np.log,
    "log1p": np.log1p,
    "sigmoid": lambda x: _same(lambda y: 1.0 / (1.0 + np.exp(-y.astype(np.float64))))(x),
    "relu6": lambda x: np.minimum(np.maximum(x, np.zeros((), x.dtype)), np.asarray(6, x.dtype)),
    "elu": lambda x: np.where(x < 0, np.expm1(x), x),
    "selu": lambda x: np.where(x < 0, (SELU_SCALE * SELU_ALPHA * np.expm1(x)).astype(x.dtype),
                               (SELU_SCALE * x).astype(x.dtype)),
    "softplus": _softplus,
    "rsqrt": lambda x: np.reciprocal(np.sqrt(x)),
    "sqrt": np.sqrt,
    "square": np.square,
    "abs": np.abs,
    "sign": _sign,
    "reciprocal": np.reciprocal,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,  # half to even, as tf.raw_ops.Round
    "sin": np.sin,
    "cos": np.cos,
    "logical_not": np.logical_not,
    "is_finite": np.isfinite,
    "is_nan": np.isnan,
    "zeros_like": np.zeros_like,
    "ones_like": np.ones_like,
}


def _make_unary(fn: Callable[[np.ndarray], np.ndarray]) -> KernelFn:
    def kernel(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
        x = np.asarray(inputs[0])
        with np.errstate(all="ignore"):
            return [np.asarray(fn(x))]
    return kernel


for _kind, _unary_fn in _UNARY.items():
    register(_kind)(_make_unary(_unary_fn))


def _float32_or(x: np.ndarray, float32_fn: Callable[[np.ndarray], np.ndarray] | None,
                fallback: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """float32_fn(x) for float32 x (when there is one), else fallback through float64, rounded back."""
    x = np.asarray(x)
    if x.dtype == np.float32 and float32_fn is not None:
        return float32_fn(x)
    with np.errstate(all="ignore"):
        return _same(fallback)(x)


@register("tanh")
def tanh(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """tf.math.tanh: on float32 TF's own Eigen approximation, bit for bit (eigen_tanh); other dtypes numpy's
    tanh."""
    return [_float32_or(inputs[0], eigen_tanh.tanh_float32, np.tanh)]


@register("erf")
def erf(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """tf.math.erf: on float32 TF's own Eigen approximation, bit for bit (eigen_erf); other dtypes through
    float64 (scipy) rounded back."""
    return [_float32_or(inputs[0], erf_float32, _erf)]


@register("erfc")
def erfc(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """tf.math.erfc (tf.nn.gelu's exact form on TF >= 2.16: 0.5 * x * erfc(-x / sqrt(2))): on float32 TF's
    bits (eigen_erfc: libm's erfcf or Eigen's approximation, by TF version); other dtypes, and float32 where
    eigen_erfc has no form (Eigen's off x86-64), through float64 (scipy) rounded back."""
    return [_float32_or(inputs[0], eigen_erfc.erfc_float32 if eigen_erfc.FORM else None, _erfc)]


@register("leaky_relu")
def leaky_relu(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x = inputs[0]
    alpha = np.asarray(attrs.get("alpha", 0.2), x.dtype)
    return [np.where(x > 0, x, x * alpha)]


@register("cast")
def cast(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """tf.cast. to="half" rounds to the selected half dtype (held as float32); "bfloat16" and
    "cbfloat16" round to that format (held as float32); "float16" gives a real numpy float16."""
    x = np.asarray(inputs[0])
    to = str(attrs["to"])
    if to == "half":
        return [round_half(x, get_half_dtype())]
    if to in ("bfloat16", "cbfloat16"):
        return [round_half(x, to)]
    dtype = np_dtype(to)
    if dtype == np.bool_:
        return [x != 0]
    with np.errstate(invalid="ignore", over="ignore"):
        return [x.astype(dtype)]


# ---- binary ------------------------------------------------------------------------------

def _floor_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.result_type(x, y).kind == "f":
        return np.floor(np.true_divide(x, y))
    return np.floor_divide(x, y)


def _floor_mod(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.result_type(x, y).kind == "f":
        trunc = np.fmod(x, y)
        return np.where((trunc != 0) & ((y < 0) != (trunc < 0)), trunc + y, trunc)
    return np.mod(x, y)


def _div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.result_type(x, y).kind in "iu":  # tf.raw_ops.Div on integers truncates toward zero
        q = np.floor_divide(x, y)
        return np.where((q < 0) & (q * y != x), q + 1, q)
    return np.true_divide(x, y)


# Pow with a scalar exponent in the forms TF's graph optimizer (Grappler's ConvertPowStage) gives a constant one:
# products and roots instead of a powf call per element (x**3 on [1024, 1024]: 27 ms as np.power).
# Not Rsqrt for -0.5: 1/sqrt(-0) is -inf where pow(-0, -0.5) is +inf.
_POW_REWRITES: dict[float, Callable[[np.ndarray], np.ndarray]] = {
    0.5: np.sqrt,
    2.0: np.square,
    3.0: lambda x: np.square(x) * x,  # Mul(Square(x), x)
    -1.0: np.reciprocal,
}


def _pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """tf.pow; a scalar exponent of 0.5, 2, 3 or -1 on a float x takes the rewritten form."""
    if x.dtype.kind == "f" and y.dtype == x.dtype and y.size == 1 and np.broadcast_shapes(x.shape, y.shape) == x.shape:
        rewrite = _POW_REWRITES.get(float(y.reshape(-1)[0]))
        if rewrite is not None:
            return rewrite(x)
    return np.power(x, y)


_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "sub": np.subtract,
    "mul": np.multiply,
    "mul_no_nan": lambda x, y: np.where(y == 0, np.zeros((), np.result_type(x, y)), x * y),
    "div": _div,
    "div_no_nan": lambda x, y: np.where(y == 0, np.zeros((), np.result_type(x, y)), x / np.where(y == 0, 1, y)),
    "floor_div": _floor_div,
    "floor_mod": _floor_mod,
    "pow": _pow,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "squared_difference": lambda x, y: np.square(x - y),
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
}


def _make_binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> KernelFn:
    def kernel(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
        x, y = np.asarray(inputs[0]), np.asarray(inputs[1])
        dtype = x.dtype
        with np.errstate(all="ignore"):
            out = np.asarray(fn(x, y))
        if out.dtype != np.bool_ and out.dtype != dtype and x.dtype == y.dtype:
            out = out.astype(dtype)  # e.g. float32 ** float32 stays float32
        return [out]
    return kernel


for _kind, _binary_fn in _BINARY.items():
    register(_kind)(_make_binary(_binary_fn))


@register("add")
def add(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """AddV2 with numpy broadcasting; two floats of one dtype are added straight into a 64-byte aligned
    array (one pass, no temporary: IEEE addition gives the same bits in any loop order)."""
    x, y = np.asarray(inputs[0]), np.asarray(inputs[1])
    if x.dtype == y.dtype and x.dtype.kind == "f" and max(x.size, y.size) >= _SMALL:
        if x.shape == y.shape or y.ndim == 0:
            shape = x.shape
        else:
            shape = y.shape if x.ndim == 0 else np.broadcast_shapes(x.shape, y.shape)
        out = empty_aligned(shape, x.dtype)
        with np.errstate(all="ignore"):
            np.add(x, y, out=out)
        return [out]
    return _binary_add(inputs, attrs, ctx)


_binary_add = _make_binary(np.add)


@register("bias_add")
def bias_add(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """value + bias along the channel axis (last for NHWC, 1 for NCHW); into value's own array where the
    executor says nothing else reads it (attrs["reuse"], its `_reuse_dead_inputs`) and it is writable."""
    x, b = inputs
    if str(attrs.get("data_format", "NHWC")).startswith("NC") and x.ndim >= 3:
        b = b.reshape((-1,) + (1,) * (x.ndim - 2))
    if attrs.get("reuse") and x.flags.writeable and np.result_type(x, b) == x.dtype:
        return [np.add(x, b, out=x)]
    return [x + b]


# Below this many elements the plain numpy code is taken (the same bits): a numba call with a tuple, or an
# aligned allocation, costs a few microseconds more than such an operation itself.
_SMALL = 1 << 14
_ADD_N_BLOCK = 2048  # elements summed over all inputs at a time: a block of each stays in L1


@_jit.jit
def _add_n_loop(arrays: Any, out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    """out = ((arrays[0] + arrays[1]) + arrays[2]) + ... for flat same-sized arrays (a tuple), a block at a
    time: one pass over memory."""
    size = out.size
    first, second = arrays[0], arrays[1]
    for lo in range(0, size, _ADD_N_BLOCK):
        hi = min(lo + _ADD_N_BLOCK, size)
        dst, a, b = out[lo:hi], first[lo:hi], second[lo:hi]
        for i in range(hi - lo):
            dst[i] = a[i] + b[i]
        for k in range(2, len(arrays)):
            c = arrays[k][lo:hi]
            for i in range(hi - lo):
                dst[i] = dst[i] + c[i]


@register("add_n")
def add_n(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """inputs[0] + inputs[1] + ... in that order; same-shaped float32/float64 inputs in one blocked numba
    pass into a 64-byte aligned array."""
    first = inputs[0]
    if (_jit.enabled() and len(inputs) >= 2 and first.size >= _SMALL and first.dtype in (np.float32, np.float64)
            and all(x.shape == first.shape and x.dtype == first.dtype for x in inputs)):
        out = empty_aligned(first.shape, first.dtype)
        _add_n_loop(tuple(np.ascontiguousarray(x).reshape(-1) for x in inputs), out.reshape(-1))
        return [out]
    out = np.array(first, copy=True)
    with np.errstate(all="ignore"):
        for x in inputs[1:]:
            out += x
    return [out]


@register("clip_by_value")
def clip_by_value(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x, lo, hi = inputs
    return [np.maximum(np.minimum(x, hi), lo).astype(x.dtype, copy=False)]


@_jit.jit
def _select_loop(cond: np.ndarray, x: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """out[i] = x[i] if cond[i] else y[i] over flat same-sized arrays."""
    for i in range(out.size):
        out[i] = x[i] if cond[i] else y[i]


@_jit.jit
def _select_scalar_loop(cond: np.ndarray, full: np.ndarray, scalar: Any, full_where: bool,
                        out: np.ndarray) -> None:  # pragma: no cover - compiled by numba
    """out[i] = full[i] where cond[i] == full_where, else the scalar."""
    for i in range(out.size):
        out[i] = full[i] if cond[i] == full_where else scalar


def _select_fast(cond: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    """SelectV2 by a numba loop when cond has the result's shape and x, y each have it or are scalars (same
    float/int dtype); None otherwise."""
    if not (_jit.enabled() and cond.dtype == np.bool_ and x.dtype == y.dtype and x.dtype.kind in "fiu"
            and cond.size >= _SMALL):
        return None
    shape = cond.shape
    if not all(a.shape == shape or a.ndim == 0 for a in (x, y)) or (x.ndim == 0 and y.ndim == 0):
        return None
    out = empty_aligned(shape, x.dtype)
    c = np.ascontiguousarray(cond).reshape(-1)
    if x.ndim and y.ndim:
        _select_loop(c, np.ascontiguousarray(x).reshape(-1), np.ascontiguousarray(y).reshape(-1), out.reshape(-1))
    elif x.ndim:
        _select_scalar_loop(c, np.ascontiguousarray(x).reshape(-1), y[()], True, out.reshape(-1))
    else:
        _select_scalar_loop(c, np.ascontiguousarray(y).reshape(-1), x[()], False, out.reshape(-1))
    return out


@register("select")
def select(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """Select (broadcast="v1": a vector condition picks rows of x/y) or SelectV2 ("numpy", default); a
    condition of the result's shape with full or scalar x and y takes a numba loop."""
    cond, x, y = (np.asarray(a) for a in inputs)
    if attrs.get("broadcast", "numpy") == "v1" and cond.ndim == 1 and x.ndim > 1:
        cond = cond.reshape((-1,) + (1,) * (x.ndim - 1))
    fast = _select_fast(cond, x, y)
    if fast is not None:
        return [fast]
    return [np.where(cond, x, y)]
