"""Pooling kernels (NHWC; NCHW is transposed): max_pool, avg_pool and their gradients.

Loops run over the window taps (kh*kw strided views), never over pixels.
max_pool_grad routes each output's gradient to the first maximum of its window
in row-major tap order (TF's CPU kernel: strict `<` while scanning), padding
never wins (implemented as "first tap equal to the window max"; a window holding a NaN
routes no gradient, where TF's scan would). avg_pool divides by the number of non-padding elements (TF's SAME).

With numba (`_jit.enabled()`, float32/float64), each kernel is instead one loop
over output windows, split by image across the host's threads, and gives the
numpy code's result bit for bit: the window max keeps np.maximum's choices
(NaN propagates; of equal values the later tap's), a gradient goes to the
first tap equal to the max, and the sums add the same terms in the same order
(an input element receives its windows' shares in tap order, which is the
windows' reverse row-major order, so the gradient loops walk windows backwards).
max_pool_grad has a second loop for non-overlapping windows (stride >= kernel,
as in 2x2/2 pooling): it writes each covered element once, its window's
gradient or 0, so dx is zero-filled only when some element is in no window.
Where the program shows orig_output to be the max pool of orig_input (the executor's
`known_maxima`), that loop reads the window maxima from orig_output instead.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Mapping, Sequence, TypeVar

import numpy as np

from cerebras_tf.wse.kernels import _jit
from cerebras_tf.wse.kernels._registry import KERNELS, KernelContext, KernelFn, register
from cerebras_tf.wse.kernels._select import keep_where
from cerebras_tf.wse.kernels._split import split_units
from cerebras_tf.wse.kernels.elementwise_grad import relu_grad as relu_grad_kernel
from cerebras_tf.wse.kernels.half import rounded
from cerebras_tf.wse.kernels.norm import normalized_relu
from cerebras_tf.wse.memory import empty_aligned
from cerebras_tf.wse.kernels.conv_geometry import Geom

_JIT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


# What a pooling kernel works out from its attrs (its Geom, its loops' window counts), made on its first call and
# kept per owner object (the attrs, which the executor hands a kernel every step, as host_kernels_tf._Plans relies
# on; a kept Geom) and key: (owner, value), the owner kept so that its id is not reused. All are dropped past
# _KEPT_LIMIT (a program has a few pooling kernels).
_KEPT: dict[tuple[int, Hashable], tuple[object, Any]] = {}
_KEPT_LIMIT = 1024
_T = TypeVar("_T")


def _kept(owner: object, key: Hashable, make: Callable[[], _T]) -> _T:
    """make(), once per `owner` object and `key`."""
    kept = _KEPT.get((id(owner), key))
    if kept is not None and kept[0] is owner:
        return kept[1]
    value = make()
    if len(_KEPT) >= _KEPT_LIMIT:
        _KEPT.clear()
    _KEPT[(id(owner), key)] = (owner, value)
    return value


def _geom(attrs: Mapping[str, Any], shape: Sequence[int]) -> Geom:
    """The pooling's geometry (a window is a filter of ksize): made once per attrs object and shape."""
    def make() -> Geom:
        fmt = str(attrs.get("data_format", "NHWC"))
        ks = list(attrs["ksize"])
        k = (ks[2], ks[3]) if fmt.startswith("NC") else (ks[1], ks[2])
        return Geom({**attrs, "dilations": None}, shape, (int(k[0]), int(k[1])))
    return _kept(attrs, tuple(int(d) for d in shape), make)


def _nhwc(x: np.ndarray, g: Geom) -> np.ndarray:
    return x.transpose(0, 2, 3, 1) if g.nchw else x


def _back(x: np.ndarray, g: Geom) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if g.nchw else x


def _padded(x: np.ndarray, g: Geom, value: float) -> np.ndarray:
    if not (g.pt or g.pb or g.pl or g.pr):
        return x
    return np.pad(x, ((0, 0), (g.pt, g.pb), (g.pl, g.pr), (0, 0)), constant_values=value)


def _jit_ok(*arrays: np.ndarray) -> bool:
    """Whether the numba loops take these arrays (float32/float64; other dtypes keep the numpy code)."""
    return _jit.enabled() and all(a.dtype in _JIT_DTYPES for a in arrays)


def _low(dtype: np.dtype) -> Any:
    """The padding value of a max: the dtype's lowest value, as a scalar of the dtype."""
    return dtype.type(-np.inf if dtype.kind == "f" else np.iinfo(dtype).min)


def _geometry(g: Geom) -> tuple[int, int, int, int, int, int]:
    return g.kh, g.kw, g.sh, g.sw, g.pt, g.pl


# A window's entry in a WinningTaps array when no tap takes its gradient (its max is NaN, or, with a relu_grad
# fused into the gradient, not > 0).
NO_TAP = 255


@_jit.jit
def _max_pool_loop(x: np.ndarray, kh: int, kw: int, sh: int, sw: int, pt: int, pl: int, low: Any,
                   out: np.ndarray, taps: np.ndarray | None, relu_grad: bool, affine: np.ndarray | None,
                   rounding: int | None, lo: int, hi: int) -> None:
    """out[n] = the window max of NHWC x[n] for n in [lo, hi), as the numpy code's np.maximum over taps. With taps
    (uint8, out's shape: WinningTaps), also each window's winning tap (i * kw + j): the first tap equal to the
    window max, where max_pool_grad routes its gradient; NO_TAP where none takes it (a NaN max; with relu_grad,
    a max not > 0). Walking the taps, the winner moves only to a strictly greater value (or from no valid tap
    yet), so it is the first tap equal to the final max. taps None is a type of its own: numba compiles the
    loop without the taps' branches for it (as fast as a loop without them). With an affine ((3, C): mean,
    factor, offset), of norm.normalized_relu's values instead, as a batch norm + relu writes them: its output
    pooled without being stored (BatchNormReluPool). With `rounding` (a float32 x), each max is written
    half.rounded, its tap taken before: a to_half of the output in the same pass (None: a type of its own, as
    taps None).
    One output row of windows at a time: the row's maxima and winning taps build up in [ow, C] work arrays
    (the CPU's cache); a window's tap row i is the outer loop, then the windows, then the tap column j, so the
    input is read row by row in order, and each window still takes its taps in order (i, then j). 25-30% faster
    than a window at a time in the output (the zoo CNN's batch norm + relu + pool, 64x32x32x32: 1.01 -> 0.75 ms
    on one thread), the same bits."""
    h, w, c = x.shape[1], x.shape[2], x.shape[3]
    oh, ow = out.shape[1], out.shape[2]
    none = np.uint8(NO_TAP)
    zero = out.dtype.type(0)
    best = np.empty((ow, c), out.dtype)
    won = np.empty((ow, c), np.uint8)
    for n in range(lo, hi):
        for i0 in range(oh):
            best[:] = low
            won[:] = none
            for i in range(kh):
                r = i0 * sh + i - pt
                if r < 0 or r >= h:
                    continue
                for j0 in range(ow):
                    for j in range(kw):
                        q = j0 * sw + j - pl
                        if q < 0 or q >= w:
                            continue
                        t = np.uint8(i * kw + j)
                        for k in range(c):
                            a, b = best[j0, k], x[n, r, q, k]
                            if affine is not None:
                                b = normalized_relu(b, affine[0, k], affine[1, k], affine[2, k], zero)
                            if taps is not None:
                                f = won[j0, k]
                                won[j0, k] = t if (b > a) | (f == none) else f
                            best[j0, k] = a if (a > b or a != a) else b  # np.maximum(a, b)
            for j0 in range(ow):
                if taps is not None:
                    for k in range(c):
                        m = best[j0, k]
                        taps[n, i0, j0, k] = none if m != m or (relu_grad and not m > 0) else won[j0, k]
                if rounding is not None:
                    for k in range(c):
                        out[n, i0, j0, k] = rounded(best[j0, k], rounding)
                else:
                    for k in range(c):
                        out[n, i0, j0, k] = best[j0, k]


@_jit.jit
def _max_pool_grad_loop(x: np.ndarray, grad_bits: np.ndarray, kh: int, kw: int, sh: int, sw: int, pt: int, pl: int,
                        low: Any, dx: np.ndarray, share: np.ndarray, share_bits: np.ndarray, lo: int, hi: int) -> None:
    """Overlapping windows: dx[n] (zeros on entry) += each window's gradient at its first tap equal to the
    window max, for n in [lo, hi); grad_bits is the gradient viewed as integers of its width. One output
    row of windows at a time, taps outermost (long inner loops), rows backwards: an input element then
    gets its windows' shares in tap order. Branch-free: the gradient's bits are ANDed with an all-ones/zeros
    mask. share and share_bits: an [ow, c] work array of dx's dtype and its integer view, made by the caller
    (a view made in the loop would be of unknown layout and keep its loops from being vectorised)."""
    h, w, c = x.shape[1], x.shape[2], x.shape[3]
    oh, ow = grad_bits.shape[1], grad_bits.shape[2]
    best = np.empty((ow, c), x.dtype)
    free = np.empty((ow, c), grad_bits.dtype)  # all bits set until a tap of the window takes its gradient
    for n in range(lo, hi):
        for i0 in range(oh - 1, -1, -1):
            best[:] = low
            free[:] = -1
            for i in range(kh):
                r = i0 * sh + i - pt
                if r < 0 or r >= h:
                    continue
                for j in range(kw):
                    for j0 in range(ow):
                        q = j0 * sw + j - pl
                        if q < 0 or q >= w:
                            continue
                        for k in range(c):
                            a, b = best[j0, k], x[n, r, q, k]
                            best[j0, k] = a if (a > b or a != a) else b  # np.maximum(a, b)
            for i in range(kh):
                r = i0 * sh + i - pt
                if r < 0 or r >= h:
                    continue
                for j in range(kw):
                    for j0 in range(ow):
                        q = j0 * sw + j - pl
                        if q < 0 or q >= w:
                            continue
                        for k in range(c):
                            hit = free[j0, k] & -grad_bits.dtype.type(x[n, r, q, k] == best[j0, k])
                            free[j0, k] &= ~hit
                            share_bits[j0, k] = grad_bits[n, i0, j0, k] & hit
                    for j0 in range(ow):
                        q = j0 * sw + j - pl
                        if q < 0 or q >= w:
                            continue
                        for k in range(c):
                            dx[n, r, q, k] += share[j0, k]


@_jit.jit
def _max_pool_grad_tiles(x: np.ndarray, grad_bits: np.ndarray, kh: int, kw: int, sh: int, sw: int, pt: int,
                         pl: int, relu_grad: bool, dx_bits: np.ndarray, lo: int, hi: int) -> None:
    """Non-overlapping windows (kh <= sh, kw <= sw): dx_bits[n] (dx viewed as integers) gets, at every tap of
    every window for n in [lo, hi), the window's gradient bits at the first tap equal to the window max and
    0 at its other taps; elements in no window are not written. One output row of windows at a time, in
    one walk over the taps that keeps the running max (np.maximum's choices: NaN propagates) and the first
    tap to reach it (a strictly greater value moves it), then one walk that writes; a window whose max is
    NaN routes no gradient (no tap equals NaN). With relu_grad, a tap whose x is not > 0 gets 0 too:
    relu_grad(dx, x) in the same walk."""
    h, w, c = x.shape[1], x.shape[2], x.shape[3]
    oh, ow = grad_bits.shape[1], grad_bits.shape[2]
    every = not relu_grad
    none = grad_bits.dtype.type(kh * kw)  # no valid tap seen yet: the first valid tap is taken, whatever its value
    best = np.empty((ow, c), x.dtype)
    first = np.empty((ow, c), grad_bits.dtype)
    for n in range(lo, hi):
        for i0 in range(oh):
            first[:] = none
            for i in range(kh):
                r = i0 * sh + i - pt
                if r < 0 or r >= h:
                    continue
                for j in range(kw):
                    t = grad_bits.dtype.type(i * kw + j)  # of first's width: no widening in the loops
                    for j0 in range(ow):
                        q = j0 * sw + j - pl
                        if q < 0 or q >= w:
                            continue
                        for k in range(c):
                            a, b, f = best[j0, k], x[n, r, q, k], first[j0, k]
                            first[j0, k] = t if (b > a) | (f == none) else f
                            best[j0, k] = a if ((a > b) | (a != a)) & (f != none) else b  # np.maximum(a, b)
            for i in range(kh):
                r = i0 * sh + i - pt
                if r < 0 or r >= h:
                    continue
                for j in range(kw):
                    t = grad_bits.dtype.type(i * kw + j)  # of first's width: no widening in the loops
                    for j0 in range(ow):
                        q = j0 * sw + j - pl
                        if q < 0 or q >= w:
                            continue
                        for k in range(c):
                            hit = (first[j0, k] == t) & (best[j0, k] == best[j0, k]) & (every | (x[n, r, q, k] > 0))
                            dx_bits[n, r, q, k] = grad_bits[n, i0, j0, k] & -grad_bits.dtype.type(hit)


@_jit.jit
def _max_pool_grad_tiles_known(x: np.ndarray, y: np.ndarray, grad_bits: np.ndarray, kh: int, kw: int, sh: int, sw: int,
                               pt: int, pl: int, relu_grad: bool, dx_bits: np.ndarray, lo: int, hi: int) -> None:
    """_max_pool_grad_tiles where y (NHWC) is this max pool of x, bit for bit: one walk over the taps, each
    window's gradient bits to the first tap equal to y (none when y is NaN), 0 to its other taps; with
    relu_grad, nothing where y is not > 0 (the tap taking the gradient holds y, so x > 0 there is y > 0)."""
    h, w, c = x.shape[1], x.shape[2], x.shape[3]
    oh, ow = grad_bits.shape[1], grad_bits.shape[2]
    every = not relu_grad
    free = np.empty((ow, c), grad_bits.dtype)  # all bits set until a tap of the window takes its gradient
    for n in range(lo, hi):
        for i0 in range(oh):
            free[:] = -1
            for i in range(kh):
                r = i0 * sh + i - pt
                if r < 0 or r >= h:
                    continue
                for j in range(kw):
                    for j0 in range(ow):
                        q = j0 * sw + j - pl
                        if q < 0 or q >= w:
                            continue
                        for k in range(c):
                            m = y[n, i0, j0, k]
                            hit = free[j0, k] & -grad_bits.dtype.type((x[n, r, q, k] == m) & (every | (m > 0)))
                            free[j0, k] &= ~hit
                            dx_bits[n, r, q, k] = grad_bits[n, i0, j0, k] & hit


@_jit.jit
def _max_pool_grad_of_taps(taps: np.ndarray, grad_bits: np.ndarray, kh: int, kw: int, sh: int, sw: int, pt: int,
                           pl: int, dx_bits: np.ndarray, lo: int, hi: int) -> None:
    """Non-overlapping windows: dx_bits[n] (dx viewed as integers) gets, for n in [lo, hi), each window's
    gradient bits at its winning tap (_max_pool_loop's taps) and 0 at its other taps; elements in no
    window are not written."""
    h, w, c = dx_bits.shape[1], dx_bits.shape[2], dx_bits.shape[3]
    oh, ow = grad_bits.shape[1], grad_bits.shape[2]
    for n in range(lo, hi):
        for i0 in range(oh):
            for i in range(kh):
                r = i0 * sh + i - pt
                if r < 0 or r >= h:
                    continue
                for j0 in range(ow):
                    for j in range(kw):
                        q = j0 * sw + j - pl
                        if q < 0 or q >= w:
                            continue
                        t = np.uint8(i * kw + j)
                        for k in range(c):
                            hit = taps[n, i0, j0, k] == t
                            dx_bits[n, r, q, k] = grad_bits[n, i0, j0, k] & -grad_bits.dtype.type(hit)


@_jit.jit
def _avg_pool_loop(x: np.ndarray, kh: int, kw: int, sh: int, sw: int, pt: int, pl: int, counts: np.ndarray,
                   out: np.ndarray, bias: np.ndarray | None, lo: int, hi: int) -> None:
    """out[n] (zeros on entry) = the window sums of x[n] in tap order, divided by the window counts. With a
    bias (per channel), of relu(x[n] + bias) instead, relu as elementwise.relu (NaN kept, -0 -> +0): the
    fused bias_add + relu's values, which are then never stored. bias None is a type of its own: numba
    compiles the loop without the bias for it."""
    h, w, c = x.shape[1], x.shape[2], x.shape[3]
    oh, ow = out.shape[1], out.shape[2]
    zero = x.dtype.type(0)
    for n in range(lo, hi):
        for i0 in range(oh):
            for j0 in range(ow):
                for i in range(kh):
                    r = i0 * sh + i - pt
                    if r < 0 or r >= h:
                        continue
                    for j in range(kw):
                        q = j0 * sw + j - pl
                        if q < 0 or q >= w:
                            continue
                        if bias is not None:
                            for k in range(c):
                                v = x[n, r, q, k] + bias[k]
                                out[n, i0, j0, k] += v if v > 0 or v != v else zero
                        else:
                            for k in range(c):
                                out[n, i0, j0, k] += x[n, r, q, k]
                d = counts[i0, j0]
                for k in range(c):
                    out[n, i0, j0, k] /= d


@_jit.jit
def _avg_pool_grad_loop(grad: np.ndarray, kh: int, kw: int, sh: int, sw: int, pt: int, pl: int,
                        counts: np.ndarray, dx: np.ndarray, lo: int, hi: int) -> None:
    """dx[n] (zeros on entry) += each window's gradient / its count, at each of its taps."""
    h, w, c = dx.shape[1], dx.shape[2], dx.shape[3]
    oh, ow = grad.shape[1], grad.shape[2]
    for n in range(lo, hi):
        for i0 in range(oh - 1, -1, -1):  # backwards: an element gets its windows' shares in tap order
            for j0 in range(ow - 1, -1, -1):
                d = counts[i0, j0]
                for i in range(kh):
                    r = i0 * sh + i - pt
                    if r < 0 or r >= h:
                        continue
                    for j in range(kw):
                        q = j0 * sw + j - pl
                        if q < 0 or q >= w:
                            continue
                        for k in range(c):
                            dx[n, r, q, k] += grad[n, i0, j0, k] / d


@_jit.jit
def _avg_pool_grad_tiles(grad: np.ndarray, kh: int, kw: int, sh: int, sw: int, pt: int, pl: int,
                         counts: np.ndarray, zero: Any, features: np.ndarray, bias: np.ndarray | None,
                         relu_grad: bool, dx: np.ndarray, lo: int, hi: int) -> None:
    """_avg_pool_grad_loop for windows that do not overlap: each input element in a window is written once,
    `zero` + its window's share (what the loop's sum of that one share onto a zero is: -0 becomes +0);
    elements in no window are left as they are (the caller's zeros). With relu_grad, relu_grad(dx, features)
    in the same walk: +0 where the feature (NHWC, dx's shape; plus the per-channel bias where one is given:
    relu(v) > 0 exactly where v > 0) is not > 0."""
    h, w, c = dx.shape[1], dx.shape[2], dx.shape[3]
    oh, ow = grad.shape[1], grad.shape[2]
    for n in range(lo, hi):
        for i0 in range(oh):
            for i in range(kh):
                r = i0 * sh + i - pt
                if r < 0 or r >= h:
                    continue
                for j0 in range(ow):
                    d = counts[i0, j0]
                    for j in range(kw):
                        q = j0 * sw + j - pl
                        if q < 0 or q >= w:
                            continue
                        if relu_grad and bias is not None:
                            for k in range(c):
                                v = zero + grad[n, i0, j0, k] / d
                                dx[n, r, q, k] = v if features[n, r, q, k] + bias[k] > 0 else zero
                        elif relu_grad:
                            for k in range(c):
                                v = zero + grad[n, i0, j0, k] / d
                                dx[n, r, q, k] = v if features[n, r, q, k] > 0 else zero
                        else:
                            for k in range(c):
                                dx[n, r, q, k] = zero + grad[n, i0, j0, k] / d


def _max(xn: np.ndarray, g: Geom) -> tuple[np.ndarray, np.ndarray]:
    """(padded input, window max) of an NHWC input; padding is the dtype's lowest value."""
    low = -np.inf if xn.dtype.kind == "f" else np.iinfo(xn.dtype).min
    xp = _padded(xn, g, low)
    out: np.ndarray | None = None
    for _, _, rs, cs in g.taps():
        v = xp[:, rs, cs, :]
        out = v.copy() if out is None else np.maximum(out, v, out=out)
    assert out is not None  # a window has at least one tap
    return xp, out


@register("max_pool")
def max_pool(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x = inputs[0]
    g = _geom(attrs, x.shape)
    if _jit_ok(x):
        xn = np.ascontiguousarray(_nhwc(x, g))
        out = empty_aligned((g.n, g.oh, g.ow, g.c), x.dtype)
        low = _low(x.dtype)
        split_units(g.n, g.h * g.w * g.c, lambda lo, hi: _max_pool_loop(xn, *_geometry(g), low, out, None, False,
                                                                         None, None, lo, hi))
        return [_back(out, g)]
    return [_back(_max(_nhwc(x, g), g)[1], g)]


def _tiled(g: Geom) -> bool:
    """Whether the windows tile the (padded) input: no overlap, no gaps, every input element in a window."""
    return g.kh == g.sh and g.kw == g.sw and g.oh * g.sh - g.pt >= g.h and g.ow * g.sw - g.pl >= g.w


@register("max_pool_grad")
def max_pool_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """MaxPoolGrad(orig_input, orig_output, grad): each window's gradient goes to the first tap
    (row-major) equal to the window max, recomputed from orig_input as TF does; padding never wins.
    With numba: non-overlapping windows take _max_pool_grad_tiles (no zero fill when the windows tile
    the input), overlapping ones _max_pool_grad_loop; both split by image across the host's threads."""
    return _max_pool_grad(inputs, attrs, ctx, relu_grad=False)


def max_pool_grad_relu_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any],
                            ctx: KernelContext) -> list[np.ndarray]:
    """relu_grad(max_pool_grad(x, y, grad), x): the pooled input x is a relu's output and its gradient goes
    on through that relu; for non-overlapping windows with numba, in max_pool_grad's own walk."""
    return _max_pool_grad(inputs, attrs, ctx, relu_grad=True)


def max_pool_grad_of_output(inputs: list[np.ndarray], attrs: Mapping[str, Any],
                            ctx: KernelContext) -> list[np.ndarray]:
    """max_pool_grad where orig_output is known to be max_pool(orig_input) of these attrs, bit for bit (the
    executor checks the program: wse/fusion.py's known_maxima): with numba, non-overlapping windows read their
    maxima from it instead of taking them again (the same bits as max_pool_grad; one walk over orig_input
    instead of two: the zoo CNN's 2x2/2 pool 30% faster)."""
    return _max_pool_grad(inputs, attrs, ctx, relu_grad=False, known=True)


def max_pool_grad_of_output_relu_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any],
                                      ctx: KernelContext) -> list[np.ndarray]:
    """max_pool_grad_relu_grad where orig_output is known to be max_pool(orig_input), as max_pool_grad_of_output."""
    return _max_pool_grad(inputs, attrs, ctx, relu_grad=True, known=True)


def _max_pool_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext,
                   relu_grad: bool, known: bool = False) -> list[np.ndarray]:
    """max_pool_grad, with relu_grad applied on the way out; `known`: inputs[1] is max_pool(inputs[0]) of
    these attrs, bit for bit, and the numba loop of non-overlapping windows takes the window maxima from it
    (for overlapping ones, measured no faster than taking them again)."""
    x, y, grad = inputs
    g = _geom(attrs, x.shape)
    overlap = g.kh > g.sh or g.kw > g.sw
    if relu_grad and (overlap or not _jit_ok(x, grad) or x.dtype != grad.dtype):  # only the tiles loop masks
        return relu_grad_kernel([_max_pool_grad(inputs, attrs, ctx, relu_grad=False, known=known)[0], x], {}, ctx)
    if _jit_ok(x, grad):
        xn, gn = np.ascontiguousarray(_nhwc(x, g)), np.ascontiguousarray(_nhwc(grad, g))
        dx = empty_aligned((g.n, g.h, g.w, g.c), grad.dtype)
        bits, low = gn.view(f"i{gn.dtype.itemsize}"), _low(x.dtype)
        if not overlap:
            if not _tiled(g):
                dx.fill(0)  # elements in no window
            dx_bits = dx.view(bits.dtype)
            if known and y.dtype == x.dtype and y.shape == grad.shape:
                yn = np.ascontiguousarray(_nhwc(y, g))
                split_units(g.n, g.h * g.w * g.c, lambda lo, hi: _max_pool_grad_tiles_known(
                    xn, yn, bits, *_geometry(g), relu_grad, dx_bits, lo, hi))
            else:
                split_units(g.n, g.h * g.w * g.c, lambda lo, hi: _max_pool_grad_tiles(
                    xn, bits, *_geometry(g), relu_grad, dx_bits, lo, hi))
            return [_back(dx, g)]
        dx.fill(0)
        def work(lo: int, hi: int) -> None:
            share = np.empty((g.ow, g.c), dx.dtype)
            _max_pool_grad_loop(xn, bits, *_geometry(g), low, dx, share, share.view(bits.dtype), lo, hi)
        split_units(g.n, g.h * g.w * g.c, work)
        return [_back(dx, g)]
    xp, best = _max(_nhwc(x, g), g)
    padded = bool(g.pt or g.pb or g.pl or g.pr)
    valid = _padded(np.ones((1, g.h, g.w, 1), bool), g, False) if padded else None
    gn = _nhwc(grad, g)
    dxp = np.zeros(g.padded_shape(), grad.dtype)
    found = np.zeros(best.shape, bool)
    hit = np.empty(best.shape, bool)
    for _, _, rs, cs in g.taps():
        np.equal(xp[:, rs, cs, :], best, out=hit)
        if valid is not None:
            hit &= valid[:, rs, cs, :]
        np.greater(hit, found, out=hit)  # a hit, and no earlier tap of its window was
        found |= hit
        if overlap:
            dxp[:, rs, cs, :] += keep_where(hit, gn)
        else:  # each input element belongs to one window at most
            dxp[:, rs, cs, :] = keep_where(hit, gn)
    return [_back(g.unpad(dxp), g)]


def keeps_winning_taps(attrs: Mapping[str, Any], shape: Sequence[int], dtype: np.dtype) -> bool:
    """Whether a max_pool of these attrs on an input of `shape` and `dtype` may run through WinningTaps:
    windows that do not overlap, of fewer than NO_TAP taps, float32/float64 under numba."""
    g = _geom(attrs, shape)
    return (_jit.enabled() and np.dtype(dtype) in _JIT_DTYPES and g.kh <= g.sh and g.kw <= g.sw
            and g.kh * g.kw < NO_TAP)


class WinningTaps:
    """One max_pool and the max_pool_grad of its output (the executor's `known_maxima`, windows that do not
    overlap: `keeps_winning_taps`) sharing each window's winning tap, as oneDNN's pooling keeps a workspace.
    The pool writes one byte a window beside its output: the tap the gradient goes to (_max_pool_loop);
    the gradient then writes dx from those bytes and its own input, without reading the pooled input again
    (the zoo CNN's 8 MB, out of cache by then: its 2x2/2 pool gradient 1.2-1.6 -> 0.5-0.8 ms measured cold, the
    pool 0.01-0.05 ms slower). The same bits as max_pool_grad(_relu_grad) on the pool's input and output.
    `relu_grad`: a relu_grad on the pooled input is fused into the gradient (relu_grad(dx, x)); the tap of a
    window whose max is not > 0 then takes nothing. The bytes live from the pool to its gradient in the same
    step (the executor runs the gradient after the pool: it reads the pool's output); the gradient takes them.
    A batch norm's relu'd output may be pooled as it is made, never stored (max_pool_of_normalized,
    fusion.batch_norm_relu_pools); its gradient then takes only its own input (max_pool_grad_of_taps)."""

    def __init__(self, relu_grad: bool) -> None:
        self.relu_grad = relu_grad
        self._taps: np.ndarray | None = None
        self._pooled: tuple[np.ndarray, np.ndarray] | None = None  # a folded pool's (input, output) without taps

    def max_pool(self, inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
        """max_pool, keeping the window's winning taps for the gradient (NHWC; an NCHW pool is transposed)."""
        x = inputs[0]
        g = _geom(attrs, x.shape)
        if not _jit_ok(x):
            self._taps = None
            return max_pool(inputs, attrs, ctx)
        return [self._pool(x, g, None)]

    def _pool(self, x: np.ndarray, g: Geom, affine: np.ndarray | None, rounding: int | None = None) -> np.ndarray:
        xn = np.ascontiguousarray(_nhwc(x, g))
        out = empty_aligned((g.n, g.oh, g.ow, g.c), x.dtype)
        taps = np.empty((g.n, g.oh, g.ow, g.c), np.uint8)
        low = _low(x.dtype)
        split_units(g.n, g.h * g.w * g.c, lambda lo, hi: _max_pool_loop(
            xn, *_geometry(g), low, out, taps, self.relu_grad, affine, rounding, lo, hi))
        self._taps = taps
        return _back(out, g)

    @staticmethod
    def pools_normalized(x: np.ndarray, attrs: Mapping[str, Any]) -> bool:
        """Whether max_pool_of_normalized takes x: float32 NHWC, with numba."""
        return _jit_ok(x) and x.dtype == np.float32 and x.ndim == 4 and not _geom(attrs, x.shape).nchw

    def max_pool_of_normalized(self, x: np.ndarray, affine: np.ndarray, attrs: Mapping[str, Any],
                               rounding: int | None = None) -> np.ndarray:
        """max_pool(relu((x - mean) * factor + offset)) for affine (3, C) float32 rows mean, factor, offset (a
        batch norm's: its _normalize_relu's values, bit for bit), keeping the taps; x as pools_normalized takes
        it. The normalized values are never stored: the gradient (max_pool_grad_of_taps) does not read them.
        With `rounding` (half.rounding_code), each max is written half.rounded."""
        return self._pool(x, _geom(attrs, x.shape), affine, rounding)

    def max_pool_keeping_input(self, y: np.ndarray, attrs: Mapping[str, Any], ctx: KernelContext) -> np.ndarray:
        """max_pool(y) for a folded pool that cannot pool the normalized values as they are made
        (pools_normalized): y is kept for max_pool_grad_of_taps where the pool keeps no taps."""
        out = self.max_pool([y], attrs, ctx)[0]
        self._pooled = (y, out) if self._taps is None else None
        return out

    def max_pool_grad(self, inputs: list[np.ndarray], attrs: Mapping[str, Any],
                      ctx: KernelContext) -> list[np.ndarray]:
        """max_pool_grad(x, y, grad) (relu_grad'ed on the way out with `relu_grad`) from the pool's taps; without
        them (the pool ran without numba), as max_pool_grad_of_output(_relu_grad)."""
        x, _, grad = inputs
        return self._grad(x.shape, x.dtype, grad, attrs, ctx, inputs)

    def max_pool_grad_of_taps(self, shape: Sequence[int], dtype: Any) -> KernelFn:
        """max_pool_grad on inputs (grad) alone, for a pooled input of `shape` and `dtype` that was never stored
        (max_pool_of_normalized): from the taps, or without them from what the pool kept."""
        def grad_of_taps(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
            pooled, self._pooled = self._pooled, None
            return self._grad(shape, np.dtype(dtype), inputs[0], attrs, ctx,
                              [*pooled, inputs[0]] if pooled is not None else None)
        return grad_of_taps

    def _grad(self, shape: Sequence[int], dtype: np.dtype, grad: np.ndarray, attrs: Mapping[str, Any],
              ctx: KernelContext, inputs: list[np.ndarray] | None) -> list[np.ndarray]:
        taps, self._taps = self._taps, None
        g = _geom(attrs, shape)
        if taps is None or not _jit_ok(grad) or grad.dtype != dtype or taps.shape != (g.n, g.oh, g.ow, g.c):
            assert inputs is not None, "a folded pool's gradient without the pool's taps or its kept input"
            return _max_pool_grad(inputs, attrs, ctx, relu_grad=self.relu_grad, known=True)
        gn = np.ascontiguousarray(_nhwc(grad, g))
        dx = empty_aligned((g.n, g.h, g.w, g.c), grad.dtype)
        if not _tiled(g):
            dx.fill(0)  # elements in no window
        bits = gn.view(f"i{gn.dtype.itemsize}")
        dx_bits = dx.view(bits.dtype)
        split_units(g.n, g.h * g.w * g.c, lambda lo, hi: _max_pool_grad_of_taps(
            taps, bits, g.kh, g.kw, g.sh, g.sw, g.pt, g.pl, dx_bits, lo, hi))
        return [_back(dx, g)]


def _counts(g: Geom) -> np.ndarray:
    ones = _padded(np.ones((1, g.h, g.w, 1), np.float32), g, 0)
    cnt = np.zeros((1, g.oh, g.ow, 1), np.float32)
    for _, _, rs, cs in g.taps():
        cnt += ones[:, rs, cs, :]
    return cnt


def _loop_counts(g: Geom, dtype: np.dtype) -> np.ndarray:
    """_counts as the numba loops take them, [oh, ow] of `dtype` (read only): made once per Geom (which _geom
    keeps) and dtype."""
    return _kept(g, dtype, lambda: np.ascontiguousarray(_counts(g)[0, :, :, 0].astype(dtype)))


@register("avg_pool")
def avg_pool(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    x = inputs[0]
    g = _geom(attrs, x.shape)
    if _jit_ok(x):
        return [_avg_pool_jit(x, g, None)]
    xp = _padded(_nhwc(x, g), g, 0)
    out = np.zeros((g.n, g.oh, g.ow, g.c), x.dtype)
    for _, _, rs, cs in g.taps():
        out += xp[:, rs, cs, :]
    out /= _counts(g).astype(x.dtype)
    return [_back(out, g)]


def _avg_pool_jit(x: np.ndarray, g: Geom, bias: np.ndarray | None) -> np.ndarray:
    """avg_pool's numba path, of relu(x + bias) with a bias (_avg_pool_loop)."""
    xn = np.ascontiguousarray(_nhwc(x, g))
    out = empty_aligned((g.n, g.oh, g.ow, g.c), x.dtype)  # aligned: TF's convolutions copy it otherwise
    out.fill(0)
    counts = _loop_counts(g, x.dtype)
    split_units(g.n, g.h * g.w * g.c, lambda lo, hi: _avg_pool_loop(xn, *_geometry(g), counts, out, bias, lo, hi))
    return _back(out, g)


def _bias_ok(x: np.ndarray, bias: np.ndarray, g: Geom) -> bool:
    """Whether the numba loops take `bias` as the per-channel bias of `x` (x's dtype, one per channel)."""
    return _jit_ok(x) and bias.dtype == x.dtype and bias.shape == (g.c,)


def _bias_relu(x: np.ndarray, bias: np.ndarray, attrs: Mapping[str, Any], ctx: KernelContext) -> np.ndarray:
    """relu(bias_add(x, bias)) by the two kernels, the bias along the pooling's channel axis."""
    data_format = attrs.get("data_format", "NHWC")
    return KERNELS["relu"](KERNELS["bias_add"]([x, bias], {"data_format": data_format}, ctx), {}, ctx)[0]


def avg_pool_of_bias_relu(inputs: list[np.ndarray], attrs: Mapping[str, Any],
                          ctx: KernelContext) -> list[np.ndarray]:
    """avg_pool(relu(bias_add(x, bias))) for inputs (x, bias), the bias along the pooling's channel axis (a
    conv block's bias, relu and average pool, fusion.bias_relu_pools): with numba, relu(x + bias) is
    taken at each tap as it is summed, so the relu's output is never stored; the same bits as the three
    kernels."""
    x, bias = inputs
    g = _geom(attrs, x.shape)
    if _bias_ok(x, bias, g):
        return [_avg_pool_jit(x, g, np.ascontiguousarray(bias))]
    return avg_pool([_bias_relu(x, bias, attrs, ctx)], attrs, ctx)


@register("avg_pool_grad")
def avg_pool_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
    """AvgPoolGrad(grad) with attr orig_input_shape. With numba, windows that do not overlap write each element
    once (`_avg_pool_grad_tiles`; no zero fill where they tile the input: the zoo CNN's 2x2/2 pool gradient
    0.17 -> 0.11 ms hot, 0.32 -> 0.25 cold), overlapping ones add each share onto zeros; the same bits."""
    return _avg_pool_grad(inputs[0], attrs, ctx, None)


def avg_pool_grad_relu_grad(inputs: list[np.ndarray], attrs: Mapping[str, Any],
                            ctx: KernelContext) -> list[np.ndarray]:
    """relu_grad(avg_pool_grad(grad), features) for inputs (grad, features): the pooled input was a relu's
    output (a conv block's relu + average pool); for windows that do not overlap with numba, in
    avg_pool_grad's own walk (one pass: dx is not written and read again), the same bits."""
    grad, features = inputs
    return _avg_pool_grad(grad, attrs, ctx, features)


def avg_pool_grad_of_bias_relu(inputs: list[np.ndarray], attrs: Mapping[str, Any],
                               ctx: KernelContext) -> list[np.ndarray]:
    """avg_pool_grad_relu_grad whose features were relu(bias_add(x, bias)), for inputs (grad, x, bias)
    (fusion.bias_relu_pools): the feature is > 0 exactly where x + bias is, which the walk takes instead;
    the same bits."""
    grad, x, bias = inputs
    shape = [int(v) for v in attrs["orig_input_shape"]]
    if _bias_ok(x, bias, _geom(attrs, shape)):
        return _avg_pool_grad(grad, attrs, ctx, x, np.ascontiguousarray(bias))
    return _avg_pool_grad(grad, attrs, ctx, _bias_relu(x, bias, attrs, ctx))


def _avg_pool_grad(grad: np.ndarray, attrs: Mapping[str, Any], ctx: KernelContext,
                   features: np.ndarray | None, bias: np.ndarray | None = None) -> list[np.ndarray]:
    """avg_pool_grad, and relu_grad(dx, features) on the way out when `features` is given (of features +
    bias, per channel, where a bias is given: only in the numba walk, which its caller checked it takes)."""
    shape = [int(v) for v in attrs["orig_input_shape"]]
    g = _geom(attrs, shape)
    relu = features is not None
    if _jit_ok(grad) and g.kh <= g.sh and g.kw <= g.sw and (
            features is None or (features.dtype == grad.dtype and list(features.shape) == shape)):
        gn = np.ascontiguousarray(_nhwc(grad, g))
        counts = _loop_counts(g, grad.dtype)
        # no element in two windows: each written once, no zero fill where tiled
        dx = empty_aligned((g.n, g.h, g.w, g.c), grad.dtype)
        if not _tiled(g):
            dx.fill(0)
        zero = grad.dtype.type(0)
        fn = np.ascontiguousarray(_nhwc(features, g)) if features is not None else dx[:1, :1, :1, :1]
        split_units(g.n, g.h * g.w * g.c, lambda lo, hi: _avg_pool_grad_tiles(
            gn, *_geometry(g), counts, zero, fn, bias, relu, dx, lo, hi))
        return [_back(dx, g)]
    if bias is not None and features is not None:
        features = _bias_relu(features, bias, attrs, ctx)
    dx = _avg_pool_grad_alone(grad, g)
    return relu_grad_kernel([dx, features], {}, ctx) if features is not None else [dx]


def _avg_pool_grad_alone(grad: np.ndarray, g: Geom) -> np.ndarray:
    """avg_pool_grad's dx where the windows-do-not-overlap loop does not run: overlapping windows add each
    share onto zeros (numba), or the numpy code."""
    if _jit_ok(grad):
        gn = np.ascontiguousarray(_nhwc(grad, g))
        counts = _loop_counts(g, grad.dtype)
        dx = np.zeros((g.n, g.h, g.w, g.c), grad.dtype)
        split_units(g.n, g.h * g.w * g.c, lambda lo, hi: _avg_pool_grad_loop(
            gn, *_geometry(g), counts, dx, lo, hi))
        return _back(dx, g)
    share = _nhwc(grad, g) / _counts(g).astype(grad.dtype)
    dxp = np.zeros(g.padded_shape(), grad.dtype)
    for _, _, rs, cs in g.taps():
        dxp[:, rs, cs, :] += share
    return _back(g.unpad(dxp), g)
