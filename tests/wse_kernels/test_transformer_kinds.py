"""The fast paths of the zoo transformer's memory-bound kinds (erf, select, one_hot, unsorted_segment_sum,
add_n, softmax, log_softmax, add, assign_variable), numba loops and numpy code (`jit` fixture), against
tf.raw_ops: bit for bit where the kernel matches TF's bits, else as the older tests check."""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from kernel_helpers import check, run

from cerebras_tf.wse.kernels import eigen_erf

R = tf.raw_ops
F = np.float32


def _same_bits(ours: np.ndarray, theirs: np.ndarray) -> None:
    """Equal bits, any NaN matching any NaN."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, (ours.dtype, ours.shape, theirs.shape)
    if ours.dtype.kind == "f":
        nan = np.isnan(ours)
        np.testing.assert_array_equal(nan, np.isnan(theirs))
        ours, theirs = np.where(nan, 0, ours), np.where(nan, 0, theirs)
    width = f"u{ours.dtype.itemsize}"
    np.testing.assert_array_equal(ours.view(width), theirs.view(width))


def _erf_inputs(rng: np.random.Generator) -> np.ndarray:
    """Random bit patterns (NaNs, infinities, subnormals among them), normal values, and the edges."""
    bits = rng.integers(0, 2 ** 32, 300_000, dtype=np.uint64).astype(np.uint32).view(F)
    normal = (rng.normal(size=200_000) * 3).astype(F)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1.1754942e-38, -1.1754942e-38,
                      1.1754944e-38, 1e-30, 4.0, -4.0, 3.99, 5.0, 1e30, -3.4e38, 3.832506856900711,
                      -3.832506856900711, np.nextafter(F(3.832506856900711), F(0)), 3.7439211627767994, 0.5, 1.0],
                     F)
    return np.concatenate([bits, normal, edges])


def test_erf_float32_is_tfs_bit_for_bit(jit, rng):
    """TF's own Eigen approximation (the form the installed TF uses), subnormals read as zero as TF's."""
    x = _erf_inputs(rng)
    _same_bits(run("erf", [x])[0], R.Erf(x=x).numpy())
    matrix = x[:4096].reshape(64, 64)
    _same_bits(run("erf", [matrix])[0], R.Erf(x=matrix).numpy())


def test_erf_forms_differ_and_the_installed_one_is_picked(rng):
    x = (rng.normal(size=10_000) * 2).astype(F)
    a, b = (eigen_erf.erf_float32(x, form) for form in eigen_erf.FORMS)
    assert (a != b).any()
    assert eigen_erf.tf_form() == eigen_erf._FORM


def test_erf_other_dtypes_keep_theirs(rng):
    x = rng.normal(size=(5, 7))
    check(run("erf", [x])[0], R.Erf(x=x), rtol=1e-12, atol=1e-15)
