"""keep_where (the branch-free np.where(mask, x, 0) of the gradient kernels) is bit-exact."""
from __future__ import annotations

import numpy as np
import pytest

from cerebras_tf.wse.kernels._select import keep_where


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_keep_where_matches_np_where_bit_for_bit(dtype, rng):
    x = rng.normal(size=(5, 7)).astype(dtype)
    x.flat[:6] = [np.nan, np.inf, -np.inf, -0.0, 0.0, -np.nan]
    mask = rng.random((5, 7)) < 0.5
    mask.flat[:6] = [True, True, False, True, False, True]
    ours, want = keep_where(mask, x), np.where(mask, x, dtype(0))
    assert ours.dtype == want.dtype
    np.testing.assert_array_equal(ours.view(np.uint8), want.view(np.uint8))


def test_keep_where_broadcasts_and_keeps_integers():
    np.testing.assert_array_equal(keep_where(np.array([[True], [False]]), np.arange(3, dtype=np.float32)),
                                  [[0, 1, 2], [0, 0, 0]])
    np.testing.assert_array_equal(keep_where(np.array([True, False]), np.array([4, 5])), [4, 0])


def test_keep_where_writes_into_out():
    x = np.array([1.0, -2.0, np.nan], np.float32)
    out = np.full(3, 7, np.float32)
    assert keep_where(np.array([True, False, True]), x, out) is out
    np.testing.assert_array_equal(out, [1.0, 0.0, np.nan])
