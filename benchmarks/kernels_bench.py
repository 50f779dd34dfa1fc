"""Micro-benchmark: the simulated WSE's kernels on each host-kernel provider against tf.raw_ops.

Times matmul (the MLP's 256x784x500 layer, forward and both gradients) and
conv2d forward / backprop-input / backprop-filter on MNIST-sized convolutions
and the max-pool pair (numpy on every provider), and the zoo transformer's memory-bound kinds at its
shapes (hidden 256, seq 128, batch 8, vocab 8000, 4 heads, FFN 1024: add, add_n, select, erf, erfc,
one_hot, unsorted_segment_sum, softmax, log_softmax, assign_variable; no host kernels), reporting the median of several
runs of the WSE kernel on the numpy/OpenBLAS provider and on the TensorFlow
provider (host_kernels_tf: the kernel's dtype contract around tf.raw_ops), and
of tf.raw_ops itself; the ratios are TF time / ours (> 1 means ours is faster).

    ./dev bench kernels_bench [--repeats 20] [--only add]
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.timing import median_seconds  # noqa: E402
from cerebras_tf.run.host_kernels_tf import TENSORFLOW_HOST_KERNELS  # noqa: E402
from cerebras_tf.wse.kernels import KERNELS, NUMPY_HOST_KERNELS, KernelContext  # noqa: E402

R = tf.raw_ops


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
    return cases + _transformer_cases(rng)


def _transformer_cases(rng: np.random.Generator) -> list[Case]:
    """The zoo transformer's memory-bound kinds at its shapes, against the TF op each replaces."""
    f32 = np.float32
    k = KERNELS

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(size=shape).astype(f32)

    cases: list[Case] = []
    for xs, ys in (((8000, 256), (8000, 256)), ((1024, 256), (1024, 256)), ((160, 8000), (8000,)),
                   ((8, 4, 128, 128), (8, 1, 1, 128)), ((), (1024, 1024))):
        xa, ya = normal(*xs), normal(*ys)
        xt, yt = tf.constant(xa), tf.constant(ya)
        cases.append((f"add {list(xs)} + {list(ys)}", lambda ctx, xa=xa, ya=ya: k["add"]([xa, ya], {}, ctx),
                      lambda xt=xt, yt=yt: R.AddV2(x=xt, y=yt)))
    for n, shape in ((3, (1024, 1024)), (2, (8000, 256)), (3, (1024, 256))):
        xs_ = [normal(*shape) for _ in range(n)]
        ts = [tf.constant(a) for a in xs_]
        cases.append((f"add_n {n} x {list(shape)}", lambda ctx, xs_=xs_: k["add_n"](xs_, {}, ctx),
                      lambda ts=ts: R.AddN(inputs=ts)))
    for shape in ((8, 4, 128, 128), (1024, 256)):
        c, xa, ya = rng.random(shape) < 0.9, normal(*shape), np.asarray(-1e4, f32)
        ct, xt, yt = tf.constant(c), tf.constant(xa), tf.constant(ya)
        cases.append((f"select {list(shape)}, scalar", lambda ctx, c=c, xa=xa, ya=ya: k["select"]([c, xa, ya], {}, ctx),
                      lambda ct=ct, xt=xt, yt=yt: R.SelectV2(condition=ct, t=xt, e=yt)))
    for kind, op in (("erf", R.Erf), ("erfc", R.Erfc)):
        for shape in ((160, 256), (1024, 1024)):
            xa = normal(*shape)
            xt = tf.constant(xa)
            cases.append((f"{kind} {list(shape)}", lambda ctx, kind=kind, xa=xa: k[kind]([xa], {}, ctx),
                          lambda op=op, xt=xt: op(x=xt)))
    labels = rng.integers(0, 8000, 160).astype(np.int32)
    lt = tf.constant(labels)
    oh = {"depth": 8000, "on_value": 1.0, "off_value": 0.0, "axis": -1}
    cases.append(("one_hot [160] depth 8000", lambda ctx: k["one_hot"]([labels], oh, ctx),
                  lambda: R.OneHot(indices=lt, depth=8000, on_value=f32(1), off_value=f32(0))))
    for rows, n in ((1024, 8000), (160, 1024)):
        data, ids = normal(rows, 256), rng.integers(0, n, rows).astype(np.int32)
        dt, it = tf.constant(data), tf.constant(ids)
        cases.append((f"unsorted_segment_sum [{rows},256] -> {n}",
                      lambda ctx, data=data, ids=ids, n=n: k["unsorted_segment_sum"]([data, ids], {"num_segments": n},
                                                                                      ctx),
                      lambda dt=dt, it=it, n=n: R.UnsortedSegmentSum(data=dt, segment_ids=it, num_segments=n)))
    for kind, op, shape in (("softmax", R.Softmax, (8, 4, 128, 128)), ("log_softmax", R.LogSoftmax, (160, 8000))):
        xa = normal(*shape)
        xt = tf.constant(xa)
        cases.append((f"{kind} {list(shape)}", lambda ctx, kind=kind, xa=xa: k[kind]([xa], {}, ctx),
                      lambda op=op, xt=xt: op(logits=xt)))
    for shape in ((8000, 256), (256, 256)):
        value = normal(*shape)
        var = np.zeros(shape, f32)
        tvar, tvalue = tf.Variable(np.zeros(shape, f32)), tf.constant(value)
        cases.append((f"assign_variable {list(shape)}",
                      lambda ctx, value=value, var=var: k["assign_variable"](
                          [value], {}, KernelContext(variables=[var], host_kernels=ctx.host_kernels)),
                      lambda tvar=tvar, tvalue=tvalue: (R.AssignVariableOp(resource=tvar.handle, value=tvalue),
                                                        tf.constant(0))[1]))
    return cases


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--only", default="", help="run only the cases whose name contains this text")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    contexts = [KernelContext(host_kernels=p) for p in (NUMPY_HOST_KERNELS, TENSORFLOW_HOST_KERNELS)]
    rows = []
    for name, ours, theirs in _cases(rng):
        if args.only not in name:
            continue
        t_np, t_tfp = (median_seconds(lambda c=c, fn=ours: fn(c), args.repeats) for c in contexts)
        t_tf = median_seconds(lambda fn=theirs: fn().numpy(), args.repeats)  # .numpy(): wait for the result
        rows.append((name, t_np * 1e3, t_tfp * 1e3, t_tf * 1e3, t_tf / t_np, t_tf / t_tfp))
    width = max(len(r[0]) for r in rows)
    print(f"{'kernel':<{width}}  {'numpy ms':>9}  {'TF-prov ms':>10}  {'TF ms':>9}  {'TF/numpy':>8}  "
          f"{'TF/TF-prov':>10}")
    for name, n, p, t, r_np, r_p in rows:
        print(f"{name:<{width}}  {n:9.3f}  {p:10.3f}  {t:9.3f}  {r_np:8.2f}  {r_p:10.2f}")


if __name__ == "__main__":
    main()
