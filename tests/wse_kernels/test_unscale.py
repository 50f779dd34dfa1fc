"""kernels/unscale.py: the gradients' unscaling and finiteness in one pass, against GradScaler's own."""
from __future__ import annotations

import numpy as np
import pytest

from cerebras_tf.amp import GradScaler
from cerebras_tf.wse import denormals
from cerebras_tf.wse.kernels.unscale import unscale_gradients


def _gradients(rng: np.random.Generator) -> list[np.ndarray]:
    """Big and small gradients; one with denormal products at 2**15, one a transposed view, one float16."""
    tiny = (rng.standard_normal(1000) * 1e-36).astype(np.float32)
    return [rng.standard_normal((300, 257)).astype(np.float32), rng.standard_normal(7).astype(np.float32), tiny,
            rng.standard_normal((40, 30)).astype(np.float32).T, rng.standard_normal(64).astype(np.float16)]


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool((a.view(np.uint32) == b.view(np.uint32)).all())


@pytest.mark.parametrize("loss_scale", ["dynamic", 1.0, 0.5])
@pytest.mark.parametrize("in_place", [False, True])
def test_products_and_finiteness_are_the_grad_scalers(rng, jit, loss_scale, in_place):
    scaler = GradScaler(loss_scale=loss_scale)
    grads = _gradients(rng)
    before = [g.copy() for g in grads]
    with denormals.flushing():  # as the executor's step: products below float32's normals are zeros
        expected = scaler.unscale_and_check(grads)
        got, finite = unscale_gradients(grads, scaler.reciprocal, [in_place] * len(grads))
    assert finite is True and expected.finite
    for i, (a, b) in enumerate(zip(got, expected.grads)):
        assert _same_bits(a, b), i
    if loss_scale == "dynamic":
        assert (expected.grads[2] == 0).any()  # flushed products
    if loss_scale == 1.0:
        assert (np.abs(got[2]) < np.finfo(np.float32).tiny).any() and (got[2] != 0).all()  # copied as they are
    for g, old, new in zip(grads, before, got):
        owned = in_place and g.dtype == np.float32 and g.flags.c_contiguous
        assert (new is g) == owned  # the others: a new array, the gradient left as it was
        if not owned:
            assert _same_bits(g, old) if g.dtype == np.float32 else (g == old).all()


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan, "overflow"])
def test_any_non_finite_product_makes_the_step_non_finite(rng, jit, bad):
    scaler = GradScaler(loss_scale=0.5)  # reciprocal 2: a big finite gradient overflows when unscaled
    grads = _gradients(rng)
    grads[0][123, 45] = np.float32(3e38) if bad == "overflow" else bad
    expected = scaler.unscale_and_check([g.copy() for g in grads])
    got, finite = unscale_gradients(grads, scaler.reciprocal, [True] * len(grads))
    assert finite is False and not expected.finite
    assert _same_bits(got[0], expected.grads[0])
    grads[0][123, 45] = 1
    assert unscale_gradients(grads, scaler.reciprocal, [False] * len(grads))[1] is True
