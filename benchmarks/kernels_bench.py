"""Micro-benchmark: the simulated WSE's kernels on each host-kernel provider against tf.raw_ops.

Times matmul (the MLP's 256x784x500 layer, forward and both gradients) and
conv2d forward / backprop-input / backprop-filter on MNIST-sized convolutions
and the max-pool pair (numpy on every provider), reporting the median of several
runs of the WSE kernel on the numpy/OpenBLAS provider and on the TensorFlow
provider (host_kernels_tf: the kernel's dtype contract around tf.raw_ops), and
of tf.raw_ops itself; the ratios are TF time / ours (> 1 means ours is faster).

    ./dev bench kernels_bench [--repeats 20]
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from cerebras_tf.run.host_kernels_tf import TENSORFLOW_HOST_KERNELS  # noqa: E402
from cerebras_tf.wse.kernels import KERNELS, NUMPY_HOST_KERNELS, KernelContext  # noqa: E402

R = tf.raw_ops


def _median_time(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


Case = tuple[str, Callable[[KernelContext], Any], Callable[[], Any]]  # name, ours (given a context), TF's


def _cases(rng: np.random.Generator) -> list[Case]:
    f32 = np.float32
    x, w = rng.normal(size=(256, 784)).astype(f32), rng.normal(size=(784, 500)).astype(f32)
    dy = rng.normal(size=(256, 500)).astype(f32)
    xt, wt, dyt = tf.constant(x), tf.constant(w), tf.constant(dy)
    k = KERNELS
    cases = [
        ("matmul 256x784 @ 784x500", lambda ctx: k["matmul"]([x, w], {}, ctx), lambda: R.MatMul(a=xt, b=wt)),
        ("matmul dx (transpose_b)", lambda ctx: k["matmul"]([dy, w], {"transpose_b": True}, ctx),
         lambda: R.MatMul(a=dyt, b=wt, transpose_b=True)),
        ("matmul dW (transpose_a)", lambda ctx: k["matmul"]([x, dy], {"transpose_a": True}, ctx),
         lambda: R.MatMul(a=xt, b=dyt, transpose_a=True)),
    ]
    for name, xs, fs in (("conv 64x28x28x1 -> 32, 3x3 SAME", (64, 28, 28, 1), (3, 3, 1, 32)),
                         ("conv 64x14x14x32 -> 64, 3x3 SAME", (64, 14, 14, 32), (3, 3, 32, 64)),
                         ("conv 64x32x32x16 -> 32, 5x5 s2 VALID", (64, 32, 32, 16), (5, 5, 16, 32))):
        strides = [1, 2, 2, 1] if "s2" in name else [1, 1, 1, 1]
        padding = "VALID" if "VALID" in name else "SAME"
        a = {"strides": strides, "padding": padding, "data_format": "NHWC"}
        xi, fi = rng.normal(size=xs).astype(f32), rng.normal(size=fs).astype(f32)
        xit, fit = tf.constant(xi), tf.constant(fi)
        y = R.Conv2D(input=xit, filter=fit, strides=strides, padding=padding)
        g = rng.normal(size=y.shape).astype(f32)
        gt = tf.constant(g)
        cases += [
            (name + " fwd", lambda ctx, xi=xi, fi=fi, a=a: k["conv2d"]([xi, fi], a, ctx),
             lambda xit=xit, fit=fit, s=strides, p=padding: R.Conv2D(input=xit, filter=fit, strides=s, padding=p)),
            (name + " d_input", lambda ctx, fi=fi, g=g, a=a, xs=xs: k["conv2d_backprop_input"](
                [fi, g], {**a, "input_sizes": list(xs)}, ctx),
             lambda fit=fit, gt=gt, s=strides, p=padding, xs=xs: R.Conv2DBackpropInput(
                 input_sizes=list(xs), filter=fit, out_backprop=gt, strides=s, padding=p)),
            (name + " d_filter", lambda ctx, xi=xi, g=g, a=a, fs=fs: k["conv2d_backprop_filter"](
                [xi, g], {**a, "filter_sizes": list(fs)}, ctx),
             lambda xit=xit, gt=gt, s=strides, p=padding, fs=fs: R.Conv2DBackpropFilter(
                 input=xit, filter_sizes=list(fs), out_backprop=gt, strides=s, padding=p)),
        ]
    xp = rng.normal(size=(64, 28, 28, 32)).astype(f32)
    xpt = tf.constant(xp)
    pa = {"ksize": [1, 2, 2, 1], "strides": [1, 2, 2, 1], "padding": "VALID"}
    yp = R.MaxPool(input=xpt, **pa)
    gp = rng.normal(size=yp.shape).astype(f32)
    ypn, gpt = yp.numpy(), tf.constant(gp)
    cases += [
        ("max_pool 2x2 64x28x28x32", lambda ctx: k["max_pool"]([xp], pa, ctx), lambda: R.MaxPool(input=xpt, **pa)),
        ("max_pool_grad", lambda ctx: k["max_pool_grad"]([xp, ypn, gp], pa, ctx),
         lambda: R.MaxPoolGrad(orig_input=xpt, orig_output=yp, grad=gpt, **pa)),
    ]
    return cases


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    contexts = [KernelContext(host_kernels=p) for p in (NUMPY_HOST_KERNELS, TENSORFLOW_HOST_KERNELS)]
    rows = []
    for name, ours, theirs in _cases(rng):
        t_np, t_tfp = (_median_time(lambda c=c, fn=ours: fn(c), args.repeats) for c in contexts)
        t_tf = _median_time(lambda fn=theirs: fn().numpy(), args.repeats)  # .numpy(): wait for the result
        rows.append((name, t_np * 1e3, t_tfp * 1e3, t_tf * 1e3, t_tf / t_np, t_tf / t_tfp))
    width = max(len(r[0]) for r in rows)
    print(f"{'kernel':<{width}}  {'numpy ms':>9}  {'TF-prov ms':>10}  {'TF ms':>9}  {'TF/numpy':>8}  "
          f"{'TF/TF-prov':>10}")
    for name, n, p, t, r_np, r_p in rows:
        print(f"{name:<{width}}  {n:9.3f}  {p:10.3f}  {t:9.3f}  {r_np:8.2f}  {r_p:10.2f}")


if __name__ == "__main__":
    main()
