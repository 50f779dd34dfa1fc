"""Compute kernels: matmul, batch_matmul, einsum, conv2d (+ both backprops), depthwise conv (+ backprops).

Everything multiplies in float32 with float32 accumulation (BLAS sgemm): inputs
arrive already rounded to the half dtype when the compiler inserted precision
casts; float16 arrays are upcast and the result cast back to the input dtype.
Convolutions are NHWC (NCHW is transposed to NHWC and back) and use im2col:
one strided copy of the patches, then one matmul; the input gradient runs one
2-D matmul per filter tap, added into place (never a loop over pixels). Padding: SAME, VALID or EXPLICIT
(explicit_paddings in data_format order).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from cerebras_tf.wse.kernels._registry import KernelContext, register
from cerebras_tf.wse.kernels._scratch import scratch


def _f32(x: np.ndarray) -> np.ndarray:
    """float32 operand (integer operands are kept: they multiply exactly in their own dtype)."""
    x = np.asarray(x)
    return x if x.dtype == np.float32 or x.dtype.kind in "iu" else x.astype(np.float32)


def _back(out: np.ndarray, like: np.ndarray) -> np.ndarray:
    return out if out.dtype == like.dtype or like.dtype.kind != "f" else out.astype(like.dtype)


@register("matmul")
def matmul(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    a, b = inputs
    a32, b32 = _f32(a), _f32(b)
    if attrs.get("transpose_a"):
        a32 = a32.T
    if attrs.get("transpose_b"):
        b32 = b32.T
    return [_back(a32 @ b32, a)]


@register("batch_matmul")
def batch_matmul(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    a, b = inputs
    a32, b32 = _f32(a), _f32(b)
    if attrs.get("adj_x"):
        a32 = np.swapaxes(a32, -1, -2)
    if attrs.get("adj_y"):
        b32 = np.swapaxes(b32, -1, -2)
    return [_back(np.matmul(a32, b32), a)]


@register("einsum")
def einsum(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    eq = str(attrs["equation"]).replace(" ", "")
    out = np.einsum(eq, *[_f32(x) for x in inputs], optimize=True)
    return [_back(np.asarray(out, np.float32), inputs[0])]


# ---- convolution geometry ----------------------------------------------------------------

def _hw(values: Sequence[int] | None, fmt: str, default: int = 1) -> tuple[int, int]:
    if not values:
        return default, default
    values = list(values)
    if len(values) == 2:
        return int(values[0]), int(values[1])
    return (int(values[2]), int(values[3])) if fmt.startswith("NC") else (int(values[1]), int(values[2]))


def _pads(attrs: Mapping[str, Any], in_hw: tuple[int, int], k_hw: tuple[int, int],
          strides: tuple[int, int], dil: tuple[int, int],
          fmt: str) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """((pad_top, pad_bottom), (pad_left, pad_right), (out_h, out_w)) as TF computes them."""
    padding = attrs.get("padding", "VALID")
    padding = padding.decode() if isinstance(padding, bytes) else str(padding)
    result = []
    for d in range(2):
        n, k, s, r = in_hw[d], k_hw[d], strides[d], dil[d]
        keff = (k - 1) * r + 1
        if padding == "SAME":
            out = -(-n // s)
            total = max((out - 1) * s + keff - n, 0)
            before, after = total // 2, total - total // 2
        elif padding == "VALID":
            before = after = 0
            out = (n - keff) // s + 1
        elif padding == "EXPLICIT":
            ex = list(attrs["explicit_paddings"])
            dim = (2 + d) if fmt.startswith("NC") else (1 + d)
            before, after = int(ex[2 * dim]), int(ex[2 * dim + 1])
            out = (n + before + after - keff) // s + 1
        else:
            raise ValueError(f"unknown padding {padding!r}")
        result.append((before, after, out))
    (t, b, oh), (l, r_, ow) = result
    return (t, b), (l, r_), (oh, ow)


class _Geom:
    """Shapes of one NHWC 2-D convolution."""

    def __init__(self, attrs: Mapping[str, Any], x_shape: Sequence[int], k_hw: Sequence[int]):
        fmt = str(attrs.get("data_format", "NHWC"))
        self.nchw = fmt.startswith("NC")
        nhwc = (x_shape[0], x_shape[2], x_shape[3], x_shape[1]) if self.nchw else tuple(x_shape)
        self.n, self.h, self.w, self.c = nhwc
        self.kh, self.kw = k_hw
        self.sh, self.sw = _hw(attrs.get("strides"), fmt)
        self.dh, self.dw = _hw(attrs.get("dilations"), fmt)
        (self.pt, self.pb), (self.pl, self.pr), (self.oh, self.ow) = _pads(
            attrs, (self.h, self.w), (self.kh, self.kw), (self.sh, self.sw), (self.dh, self.dw), fmt)

    def taps(self):
        """(i, j, row slice, col slice) into the padded input, one per filter tap."""
        for i in range(self.kh):
            for j in range(self.kw):
                r0, c0 = i * self.dh, j * self.dw
                yield i, j, slice(r0, r0 + (self.oh - 1) * self.sh + 1, self.sh), \
                    slice(c0, c0 + (self.ow - 1) * self.sw + 1, self.sw)

    def pad(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """x with the padding (zeros; negative explicit paddings crop), written to `out` when given
        (an array of padded_shape(), e.g. scratch memory)."""
        if not (self.pt or self.pb or self.pl or self.pr):
            return x
        x = x[:, max(-self.pt, 0): x.shape[1] - max(-self.pb, 0), max(-self.pl, 0): x.shape[2] - max(-self.pr, 0)]
        t, b, l, r = max(self.pt, 0), max(self.pb, 0), max(self.pl, 0), max(self.pr, 0)
        if out is None:
            return np.pad(x, ((0, 0), (t, b), (l, r), (0, 0)))
        rows, cols = out.shape[1] - b, out.shape[2] - r
        out[:, :t] = 0
        out[:, rows:] = 0
        out[:, t:rows, :l] = 0
        out[:, t:rows, cols:] = 0
        out[:, t:rows, l:cols] = x
        return out

    def tap_ranges(self, i: int, j: int) -> tuple[slice, slice, slice, slice]:
        """(output rows, input rows, output cols, input cols) where filter tap (i, j) reads the input
        itself rather than its padding (input index = out * stride + tap * dilation - pad_before)."""
        ranges = []
        for tap, s, d, p, n_in, n_out in ((i, self.sh, self.dh, self.pt, self.h, self.oh),
                                          (j, self.sw, self.dw, self.pl, self.w, self.ow)):
            a = p - tap * d  # input index = out * s - a
            lo, hi = max(0, -(-a // s)), min(n_out - 1, (n_in - 1 + a) // s)
            count = max(hi - lo + 1, 0)
            start = lo * s - a
            ranges += [slice(lo, lo + count), slice(start, start + (count - 1) * s + 1 if count else start, s)]
        return ranges[0], ranges[1], ranges[2], ranges[3]

    def padded_shape(self) -> tuple[int, int, int, int]:
        return self.n, self.h + self.pt + self.pb, self.w + self.pl + self.pr, self.c

    def unpad(self, xp: np.ndarray) -> np.ndarray:
        return xp[:, self.pt: self.pt + self.h, self.pl: self.pl + self.w]

    def is_pointwise(self) -> bool:
        return self.kh == self.kw == 1 and self.sh == self.sw == 1 and not (self.pt or self.pb or self.pl or self.pr)


def im2col(x: np.ndarray, g: _Geom, reuse: bool = False) -> np.ndarray:
    """[N, OH, OW, KH, KW, C] patches of the NHWC input (float32): one strided copy of a sliding-window
    view. With `reuse`, the patches (and the padded input) live in this thread's scratch memory, valid
    until the next reusing call: for patches that never leave the kernel."""
    xp = g.pad(x, scratch("conv_padded", g.padded_shape(), x.dtype) if reuse else None)
    window = ((g.kh - 1) * g.dh + 1, (g.kw - 1) * g.dw + 1)
    # numpy 1.26's stubs type `axis` as one index (numpy 2's do not); a tuple of axes is documented and works.
    view = sliding_window_view(xp, window, axis=(1, 2))  # type: ignore[call-overload, unused-ignore]
    view = view[:, : (g.oh - 1) * g.sh + 1: g.sh, : (g.ow - 1) * g.sw + 1: g.sw, :, ::g.dh, ::g.dw]
    view = view.transpose(0, 1, 2, 4, 5, 3)
    if not reuse:
        return np.ascontiguousarray(view, dtype=np.float32)
    cols = scratch("conv_patches", view.shape)
    np.copyto(cols, view)
    return cols


def col2im(cols: np.ndarray, g: _Geom) -> np.ndarray:
    """Adjoint of im2col: scatter-add [N, OH, OW, KH, KW, C] patches into an NHWC input."""
    xp = np.zeros(g.padded_shape(), np.float32)
    for i, j, rs, cs in g.taps():
        xp[:, rs, cs, :] += cols[:, :, :, i, j, :]
    if min(g.pt, g.pb, g.pl, g.pr) < 0:  # negative explicit padding: re-grow the cropped border
        full = np.zeros((g.n, g.h, g.w, g.c), np.float32)
        full[:, max(-g.pt, 0): g.h - max(-g.pb, 0), max(-g.pl, 0): g.w - max(-g.pr, 0)] = \
            xp[:, max(g.pt, 0): xp.shape[1] - max(g.pb, 0), max(g.pl, 0): xp.shape[2] - max(g.pr, 0)]
        return full
    return g.unpad(xp)


def _to_nhwc(x: np.ndarray, g: _Geom) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if g.nchw else x


def _from_nhwc(x: np.ndarray, g: _Geom) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if g.nchw else x


@register("conv2d")
def conv2d(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """Conv2D(input, filter[kh, kw, cin, cout])."""
    x, f = inputs
    g = _Geom(attrs, x.shape, f.shape[:2])
    x32, f32 = _to_nhwc(_f32(x), g), _f32(f)
    cout = f.shape[3]
    if g.is_pointwise():
        y = x32.reshape(-1, g.c) @ f32.reshape(g.c, cout)
    else:
        y = im2col(x32, g, reuse=True).reshape(-1, g.kh * g.kw * g.c) @ f32.reshape(-1, cout)
    return [_back(_from_nhwc(y.reshape(g.n, g.oh, g.ow, cout), g), x)]


@register("conv2d_backprop_input")
def conv2d_backprop_input(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """Conv2DBackpropInput(filter, out_backprop) with attr input_sizes."""
    f, dy = inputs
    g = _Geom(attrs, list(attrs["input_sizes"]), f.shape[:2])
    dy32, f32 = _to_nhwc(_f32(dy), g), _f32(f)
    cout = f.shape[3]
    if g.is_pointwise():
        dx = (dy32.reshape(-1, cout) @ f32.reshape(g.c, cout).T).reshape(g.n, g.h, g.w, g.c)
    else:
        dx = _scatter_taps(dy32.reshape(-1, cout), f32, g)
    return [_back(_from_nhwc(dx, g), dy)]


def _scatter_taps(dy2: np.ndarray, f32: np.ndarray, g: _Geom) -> np.ndarray:
    """Input gradient as one 2-D BLAS matmul per filter tap (dy2 @ f[tap].T), each added where that tap
    reads the input (numpy's batched matmul over a broadcast operand does not reach BLAS)."""
    dx = np.zeros((g.n, g.h, g.w, g.c), np.float32)
    part = scratch("conv_tap", (dy2.shape[0], g.c))
    for i in range(g.kh):
        for j in range(g.kw):
            out_rows, in_rows, out_cols, in_cols = g.tap_ranges(i, j)
            np.matmul(dy2, f32[i, j].T, out=part)
            dx[:, in_rows, in_cols] += part.reshape(g.n, g.oh, g.ow, g.c)[:, out_rows, out_cols]
    return dx


@register("conv2d_backprop_filter")
def conv2d_backprop_filter(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """Conv2DBackpropFilter(input, out_backprop) with attr filter_sizes."""
    x, dy = inputs
    fs = [int(v) for v in attrs["filter_sizes"]]
    g = _Geom(attrs, x.shape, (fs[0], fs[1]))
    x32, dy32 = _to_nhwc(_f32(x), g), _to_nhwc(_f32(dy), g)
    cout = fs[3]
    if g.is_pointwise():
        df = x32.reshape(-1, g.c).T @ dy32.reshape(-1, cout)
    else:
        df = im2col(x32, g, reuse=True).reshape(-1, g.kh * g.kw * g.c).T @ dy32.reshape(-1, cout)
    return [_back(df.reshape(fs), x)]


@register("depthwise_conv2d")
def depthwise_conv2d(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """DepthwiseConv2dNative(input, filter[kh, kw, cin, multiplier]) -> cin*multiplier channels."""
    x, f = inputs
    g = _Geom(attrs, x.shape, f.shape[:2])
    cols = im2col(_to_nhwc(_f32(x), g), g).reshape(g.n * g.oh * g.ow, g.kh * g.kw, g.c)
    fk = _f32(f).reshape(g.kh * g.kw, g.c, -1)
    # per channel c: [P, K] @ [K, M]
    y = np.matmul(cols.transpose(2, 0, 1), fk.transpose(1, 0, 2))  # [C, P, M]
    y = y.transpose(1, 0, 2).reshape(g.n, g.oh, g.ow, -1)
    return [_back(_from_nhwc(np.ascontiguousarray(y), g), x)]


@register("depthwise_conv2d_backprop_input")
def depthwise_conv2d_backprop_input(inputs: list[np.ndarray], attrs: Mapping[str, Any],
                                    ctx: KernelContext) -> list[np.ndarray]:
    """DepthwiseConv2dNativeBackpropInput(filter, out_backprop) with attr input_sizes."""
    f, dy = inputs
    g = _Geom(attrs, list(attrs["input_sizes"]), f.shape[:2])
    m = f.shape[3]
    dy32 = _to_nhwc(_f32(dy), g).reshape(-1, g.c, m)  # [P, C, M]
    fk = _f32(f).reshape(g.kh * g.kw, g.c, m)
    dcols = np.matmul(dy32.transpose(1, 0, 2), fk.transpose(1, 2, 0))  # [C, P, K]
    dcols = dcols.transpose(1, 2, 0).reshape(g.n, g.oh, g.ow, g.kh, g.kw, g.c)
    return [_back(_from_nhwc(col2im(dcols, g), g), dy)]


@register("depthwise_conv2d_backprop_filter")
def depthwise_conv2d_backprop_filter(inputs: list[np.ndarray], attrs: Mapping[str, Any],
                                     ctx: KernelContext) -> list[np.ndarray]:
    """DepthwiseConv2dNativeBackpropFilter(input, out_backprop) with attr filter_sizes."""
    x, dy = inputs
    fs = [int(v) for v in attrs["filter_sizes"]]
    g = _Geom(attrs, x.shape, (fs[0], fs[1]))
    cols = im2col(_to_nhwc(_f32(x), g), g).reshape(-1, g.kh * g.kw, g.c)  # [P, K, C]
    dy32 = _to_nhwc(_f32(dy), g).reshape(-1, g.c, fs[3])  # [P, C, M]
    df = np.matmul(cols.transpose(2, 1, 0), dy32.transpose(1, 0, 2))  # [C, K, M]
    return [_back(np.ascontiguousarray(df.transpose(1, 0, 2)).reshape(fs), x)]
