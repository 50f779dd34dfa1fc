"""The numpy/OpenBLAS host kernels (the default provider, host_kernels.NUMPY_HOST_KERNELS).

Operands arrive as float32 (or integer, for matmul), results are float32: the caller
(linalg.py) does the dtype contract. Convolutions are NHWC (NCHW is transposed to NHWC
and back) and use im2col: one strided copy of the patches, then one sgemm; the input
gradient runs one 2-D matmul per filter tap, added into place (never a loop over pixels).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from cerebras_tf.wse import threads
from cerebras_tf.wse.memory import empty_aligned
from cerebras_tf.wse.kernels._scratch import scratch
from cerebras_tf.wse.kernels.conv_geometry import Geom, col2im, from_nhwc, im2col, to_nhwc


# Products below this many multiply-adds run whole: splitting them costs more than it saves.
MIN_SPLIT_PRODUCTS = 1 << 22
# A bigger product (OpenBLAS held to one thread) is cut into blocks of rows or columns of about BLOCK_PRODUCTS
# multiply-adds each, at least two and at most MAX_SPLIT_BLOCKS, the same on any machine and however the threads
# run them (threads.split_blocks): with some of OpenBLAS's kernels a block sums in another order than the whole
# product (Haswell's on an AVX-512 CPU), so the cut is part of the bits. A block of 2^27 (one to two ms of one
# core's sgemm here): the zoo transformer's products (10M-330M multiply-adds) in two blocks, not the four of
# 2^24-2^26 each they were cut into before, take 2-3% less of its step on this project's 2-core VM (each block
# packs its operand again and is one more hand-off between the executor's threads); a product of 2^30 and more
# still spreads over 8-16 cores.
BLOCK_PRODUCTS = 1 << 27
MAX_SPLIT_BLOCKS = 16


def matmul(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
    """MatMul(a, b) with transpose_a / transpose_b. While OpenBLAS is held to one thread (the executor's
    steps), a big float product is cut into fixed row (or column) blocks (`_blocks`) that the host's
    threads share (threads.split_blocks); each block is a single-threaded sgemm on a slice, so the bits are
    those of the same blocks one after another on one thread, on any machine (OpenBLAS's own threads sum some
    shapes in another order: 256x784x500 differs)."""
    a, b = inputs
    a = a.T if attrs.get("transpose_a") else a
    b = b.T if attrs.get("transpose_b") else b
    m, k = a.shape
    n = b.shape[1]
    if not (threads.blas_held() and a.dtype == b.dtype and a.dtype.kind == "f" and m * n * k >= MIN_SPLIT_PRODUCTS):
        return a @ b
    out = empty_aligned((m, n), a.dtype)
    if m >= n:
        threads.split_blocks(_blocks(m, n * k), lambda lo, hi: np.matmul(a[lo:hi], b, out=out[lo:hi]))
    else:
        threads.split_blocks(_blocks(n, m * k), lambda lo, hi: np.matmul(a, b[:, lo:hi], out=out[:, lo:hi]))
    return out


def _blocks(size: int, products_per_unit: int) -> list[int]:
    """The bounds of `size` rows (or columns) of `products_per_unit` multiply-adds each (a product of at least
    MIN_SPLIT_PRODUCTS) cut into blocks of about BLOCK_PRODUCTS, at least two, at most MAX_SPLIT_BLOCKS (and
    `size`): fixed by the shape alone."""
    blocks = max(1, min(MAX_SPLIT_BLOCKS, size, max(2, size * products_per_unit // BLOCK_PRODUCTS)))
    return [size * i // blocks for i in range(blocks + 1)]


def batch_matmul(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
    """BatchMatMulV2(x, y) with adj_x / adj_y, broadcasting the batch dimensions; while OpenBLAS is held to
    one thread, big batches are split across the host's threads by whole matrices (as matmul).

    Operands may be strided views (a transpose the executor hands on uncopied, fusion.lazy_transposes): each
    matrix is read in place (sgemm's leading dimension), never copied. attrs["out_perm"] (the executor's,
    fusion.transposed_outputs) lays the result out for the transpose by that permutation that reads it: the
    result is a view of a C-contiguous array of the transposed shape. The bits are those of contiguous
    operands and result either way (sgemm packs its operands the same)."""
    a, b = inputs
    if attrs.get("adj_x"):
        a = np.swapaxes(a, -1, -2)
    if attrs.get("adj_y"):
        b = np.swapaxes(b, -1, -2)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    shape = (*batch, a.shape[-2], b.shape[-1])
    perm = attrs.get("out_perm")
    out = _laid_out(shape, a.dtype, perm) if perm is not None and a.dtype == b.dtype else None
    count = math.prod(batch)
    products = count * a.shape[-2] * a.shape[-1] * b.shape[-1]
    if not (threads.blas_held() and count > 1 and a.dtype == b.dtype and a.dtype.kind == "f"
            and products >= MIN_SPLIT_PRODUCTS):
        return np.matmul(a, b) if out is None else np.matmul(a, b, out=out)
    a_all, b_all = np.broadcast_to(a, (*batch, *a.shape[-2:])), np.broadcast_to(b, (*batch, *b.shape[-2:]))
    if out is None:
        out = empty_aligned(shape, a.dtype)
    fa, fb, fo = (_flat_batch(v, count) for v in (a_all, b_all, out))
    if fa is None or fb is None or fo is None:  # flattening the batch would copy: split its first axis
        x, y, z, units = a_all, b_all, out, batch[0]
    else:  # whole matrices of the flattened batch
        x, y, z, units = fa, fb, fo, count
    threads.split_range(units, lambda lo, hi: np.matmul(x[lo:hi], y[lo:hi], out=z[lo:hi]),
                        max(1, MIN_SPLIT_PRODUCTS * units // (2 * products)))
    return out


def _flat_batch(x: np.ndarray, count: int) -> np.ndarray | None:
    """x [..., m, n] as a view [count, m, n], or None where that takes a copy."""
    shape = (count, *x.shape[-2:])
    if _RESHAPE_TAKES_COPY:
        try:
            return np.reshape(x, shape, copy=False)
        except ValueError:
            return None
    view = x.view()  # numpy < 2.1: setting the shape raises where a copy is needed (deprecated from 2.5)
    try:
        view.shape = shape
    except AttributeError:
        return None
    return view


_RESHAPE_TAKES_COPY = tuple(int(v) for v in np.__version__.split(".")[:2]) >= (2, 1)


def _laid_out(shape: Sequence[int], dtype: np.dtype, perm: Sequence[int]) -> np.ndarray:
    """A new array of `shape` that np.transpose(·, perm) makes C-contiguous (a 64-byte aligned buffer of the
    transposed shape, seen through the inverse permutation)."""
    buffer = empty_aligned([shape[p] for p in perm], dtype)
    return buffer.transpose(np.argsort(perm))


def conv2d(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
    """Conv2D(input, filter[kh, kw, cin, cout])."""
    x, f = inputs
    g = Geom(attrs, x.shape, f.shape[:2])
    x = to_nhwc(x, g)
    cout = f.shape[3]
    if g.is_pointwise():
        y = x.reshape(-1, g.c) @ f.reshape(g.c, cout)
    else:
        y = im2col(x, g, reuse=True).reshape(-1, g.kh * g.kw * g.c) @ f.reshape(-1, cout)
    return from_nhwc(y.reshape(g.n, g.oh, g.ow, cout), g)


def conv2d_backprop_input(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
    """Conv2DBackpropInput(filter, out_backprop) with attr input_sizes."""
    f, dy = inputs
    g = Geom(attrs, list(attrs["input_sizes"]), f.shape[:2])
    dy = to_nhwc(dy, g)
    cout = f.shape[3]
    if g.is_pointwise():
        dx = (dy.reshape(-1, cout) @ f.reshape(g.c, cout).T).reshape(g.n, g.h, g.w, g.c)
    else:
        dx = _scatter_taps(dy.reshape(-1, cout), f, g)
    return from_nhwc(dx, g)


def _scatter_taps(dy2: np.ndarray, f: np.ndarray, g: Geom) -> np.ndarray:
    """Input gradient as one 2-D BLAS matmul per filter tap (dy2 @ f[tap].T), each added where that tap
    reads the input (numpy's batched matmul over a broadcast operand does not reach BLAS)."""
    dx = np.zeros((g.n, g.h, g.w, g.c), np.float32)
    part = scratch("conv_tap", (dy2.shape[0], g.c))
    for i in range(g.kh):
        for j in range(g.kw):
            out_rows, in_rows, out_cols, in_cols = g.tap_ranges(i, j)
            np.matmul(dy2, f[i, j].T, out=part)
            dx[:, in_rows, in_cols] += part.reshape(g.n, g.oh, g.ow, g.c)[:, out_rows, out_cols]
    return dx


def conv2d_backprop_filter(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
    """Conv2DBackpropFilter(input, out_backprop) with attr filter_sizes."""
    x, dy = inputs
    fs = [int(v) for v in attrs["filter_sizes"]]
    g = Geom(attrs, x.shape, (fs[0], fs[1]))
    x, dy = to_nhwc(x, g), to_nhwc(dy, g)
    cout = fs[3]
    if g.is_pointwise():
        df = x.reshape(-1, g.c).T @ dy.reshape(-1, cout)
    else:
        df = im2col(x, g, reuse=True).reshape(-1, g.kh * g.kw * g.c).T @ dy.reshape(-1, cout)
    return df.reshape(fs)


def depthwise_conv2d(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
    """DepthwiseConv2dNative(input, filter[kh, kw, cin, multiplier]) -> cin*multiplier channels."""
    x, f = inputs
    g = Geom(attrs, x.shape, f.shape[:2])
    cols = im2col(to_nhwc(x, g), g).reshape(g.n * g.oh * g.ow, g.kh * g.kw, g.c)
    fk = f.reshape(g.kh * g.kw, g.c, -1)
    # per channel c: [P, K] @ [K, M]
    y = np.matmul(cols.transpose(2, 0, 1), fk.transpose(1, 0, 2))  # [C, P, M]
    y = y.transpose(1, 0, 2).reshape(g.n, g.oh, g.ow, -1)
    return from_nhwc(np.ascontiguousarray(y), g)


def depthwise_conv2d_backprop_input(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
    """DepthwiseConv2dNativeBackpropInput(filter, out_backprop) with attr input_sizes."""
    f, dy = inputs
    g = Geom(attrs, list(attrs["input_sizes"]), f.shape[:2])
    m = f.shape[3]
    dy = to_nhwc(dy, g).reshape(-1, g.c, m)  # [P, C, M]
    fk = f.reshape(g.kh * g.kw, g.c, m)
    dcols = np.matmul(dy.transpose(1, 0, 2), fk.transpose(1, 2, 0))  # [C, P, K]
    dcols = dcols.transpose(1, 2, 0).reshape(g.n, g.oh, g.ow, g.kh, g.kw, g.c)
    return from_nhwc(col2im(dcols, g), g)


def depthwise_conv2d_backprop_filter(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
    """DepthwiseConv2dNativeBackpropFilter(input, out_backprop) with attr filter_sizes."""
    x, dy = inputs
    fs = [int(v) for v in attrs["filter_sizes"]]
    g = Geom(attrs, x.shape, (fs[0], fs[1]))
    cols = im2col(to_nhwc(x, g), g).reshape(-1, g.kh * g.kw, g.c)  # [P, K, C]
    dy = to_nhwc(dy, g).reshape(-1, g.c, fs[3])  # [P, C, M]
    df = np.matmul(cols.transpose(2, 1, 0), dy.transpose(1, 0, 2))  # [C, K, M]
    return np.ascontiguousarray(df.transpose(1, 0, 2)).reshape(fs)
