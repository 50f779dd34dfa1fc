"""The geometry of a 2-D convolution or pooling window as TensorFlow defines it, and im2col/col2im.

Shared by the numpy host kernels (host_numpy.py) and the pooling kernels
(pool.py): TF's output sizes and SAME/VALID/EXPLICIT paddings (explicit
paddings in data_format order; negative ones crop, which TF itself refuses),
NHWC internally with NCHW transposed in and out.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from cerebras_tf.wse.kernels._scratch import scratch


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


class Geom:
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


def im2col(x: np.ndarray, g: Geom, reuse: bool = False) -> np.ndarray:
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


def col2im(cols: np.ndarray, g: Geom) -> np.ndarray:
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


def to_nhwc(x: np.ndarray, g: Geom) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if g.nchw else x


def from_nhwc(x: np.ndarray, g: Geom) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if g.nchw else x
