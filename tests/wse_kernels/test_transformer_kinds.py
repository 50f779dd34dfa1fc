"""The fast paths of the zoo transformer's memory-bound kinds (erf, erfc, tanh, select, one_hot, unsorted_segment_sum,
add_n, softmax, log_softmax, add, assign_variable), numba loops and numpy code (`jit` fixture), against
tf.raw_ops: bit for bit where the kernel matches TF's bits, else as the older tests check."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from kernel_helpers import both_ways, check, run

from cerebras_tf.wse.kernels import eigen_erf, eigen_erfc, eigen_tanh, elementwise
from cerebras_tf.wse.kernels import softmax as softmax_module

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


# |x| > 1 values whose erfc differs between Eigen's packet and scalar paths (on the CPU they were picked on).
_ERFC_TAIL = np.array([4.677, -3.118, 4.695, 5.55, -2.094, 4.289, 1.097, -2.494, 4.025], F)


def _erfc_inputs(rng: np.random.Generator) -> np.ndarray:
    """erf's inputs, and erfc's edges: either side of |x| = 1 (the switch of form), the clamp at 11, where
    exp(-x^2) leaves the normal range (9.345) and where the result does (9.194); an odd count (a tail)."""
    one, clamp, underflow = F(1), F(11), F(9.194)
    near = [np.nextafter(v, w) for v in (one, -one, clamp, -clamp, underflow) for w in (F(0), F(20))]
    edges = np.array([*near, 9.3454, 9.3455, 10.05, 26.0, -26.0, 1e-20, -1e-20, 1e-38, 1.0001], F)
    sweep = np.linspace(9.15, 9.25, 20_001, dtype=F)
    return np.concatenate([_erf_inputs(rng), edges, sweep, -sweep, _ERFC_TAIL[:5]])


def test_erfc_float32_is_tfs_bit_for_bit(jit, rng):
    """TF's erfc in the installed TF's form, subnormals flushed as TF's threads flush them, the tail too."""
    if eigen_erfc.FORM is None:
        pytest.skip("no TF form for erfc here (Eigen's off x86-64)")
    x = _erfc_inputs(rng)
    assert x.size % eigen_erfc.PACKET
    _same_bits(run("erfc", [x])[0], R.Erfc(x=x).numpy())
    matrix = x[-4096:].reshape(64, 64)
    _same_bits(run("erfc", [matrix])[0], R.Erfc(x=matrix).numpy())
    for n in range(1, 18):  # all scalar path below 8 elements, then one or two packets and a tail
        small = _ERFC_TAIL[np.arange(n) % _ERFC_TAIL.size]
        _same_bits(run("erfc", [small])[0], R.Erfc(x=small).numpy())


def test_erfc_forms_differ_and_the_installed_one_is_picked(rng):
    """Only the installed TF's form gives its bits (packets of 8 with no tail)."""
    if eigen_erfc.FORM is None:
        pytest.skip("no TF form for erfc here (Eigen's off x86-64)")
    assert eigen_erfc.tf_form() == eigen_erfc.FORM
    x = (rng.normal(size=8192) * 3).astype(F)
    theirs = R.Erfc(x=x).numpy()
    for form in eigen_erfc.FORMS:
        same = (eigen_erfc.erfc_float32(x, form) == theirs).all()
        assert same == (form == eigen_erfc.FORM), form


@pytest.mark.parametrize("version, form", [((2, 15), "libm"), ((2, 19), "libm"), ((2, 20), "rcp2"),
                                           ((2, 21), "rcp1"), ((3, 0), "rcp1"), (None, "rcp1")])
def test_erfc_form_follows_the_tf_version(version, form, monkeypatch):
    """libm's erfcf up to TF 2.19, Eigen's with the old reciprocal step in 2.20, the new one from 2.21."""
    monkeypatch.setattr(eigen_erfc, "tf_version", lambda: version)
    assert eigen_erfc.tf_form() == (form if eigen_erfc._X86 or form == "libm" else None)


def _tanh_inputs(rng: np.random.Generator) -> np.ndarray:
    """erf's inputs, and tanh's edges: either side of both forms' clamps and of the 13/6 form's cut at 0.0004."""
    edges = [F(v) for v in (0.0004, 7.90531110763549805, 7.90738964080810547, 9.0, 8.0)]
    near = [np.nextafter(v, w) for v in edges for w in (F(0), F(20))]
    return np.concatenate([_erf_inputs(rng), edges, near, -np.array(edges + near, F)]).astype(F)


def test_tanh_float32_is_tfs_bit_for_bit(jit, rng):
    """TF's own Eigen approximation in the installed TF's form, subnormals read as zero as TF's; the last
    size % 8 elements too (Eigen's scalar path)."""
    x = _tanh_inputs(rng)
    assert x.size % 8
    _same_bits(run("tanh", [x])[0], R.Tanh(x=x).numpy())
    matrix = x[:4096].reshape(64, 64)
    _same_bits(run("tanh", [matrix])[0], R.Tanh(x=matrix).numpy())


def test_tanh_forms_differ_and_only_the_installed_one_is_tfs(rng):
    x = _tanh_inputs(rng)
    theirs = R.Tanh(x=x).numpy()
    for form in eigen_tanh.FORMS:
        ours = eigen_tanh.tanh_float32(x, form)
        _same_bits(ours, eigen_tanh.tanh_numpy(x, form))  # the loop and its numpy twin
        same = (ours.view(np.uint32) == theirs.view(np.uint32)) | (np.isnan(ours) & np.isnan(theirs))
        assert same.all() == (form == eigen_tanh.FORM), form
    assert eigen_tanh.tf_form() == eigen_tanh.FORM


@pytest.mark.parametrize("version, form", [((2, 15), "13/6"), ((2, 17), "13/6"), ((2, 18), "9/8"),
                                           ((2, 21), "9/8"), ((3, 0), "9/8"), (None, "9/8")])
def test_tanh_form_follows_the_tf_version(version, form, monkeypatch):
    """Eigen's 13/6 form up to TF 2.17, its 9/8 form (August 2024) from 2.18."""
    monkeypatch.setattr(eigen_tanh, "tf_version", lambda: version)
    assert eigen_tanh.tf_form() == form


def test_tanh_other_dtypes_keep_theirs(rng):
    x = rng.normal(size=(5, 7)) * 3
    check(run("tanh", [x])[0], R.Tanh(x=x), rtol=1e-12, atol=1e-15)


def test_erfc_other_dtypes_keep_theirs(rng):
    x = rng.normal(size=(5, 7)) * 3
    check(run("erfc", [x])[0], R.Erfc(x=x), rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 128, 129, 300, 1000, 8000, 8192])
def test_row_sums_take_numpys_order(n, rng):
    x = (rng.standard_exponential(size=(5, n)) * np.exp(rng.uniform(-6, 6, (5, n)))).astype(F)
    sums = np.empty(5, F)
    softmax_module._row_sums(x.reshape(-1), n, sums)
    _same_bits(sums, x.sum(axis=-1))


def _logit_rows(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    x = (rng.normal(size=shape) * 4).astype(F)
    rows = x.reshape(-1, shape[-1])
    if len(rows) >= 4 and shape[-1] >= 3:
        rows[0, 1] = np.nan
        rows[1, :] = -np.inf
        rows[2, 2] = np.inf
        rows[3, :] = 0.0
    return x


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(8, 4, 16, 128), (20, 8000), (600, 1000), (6, 1), (5, 7), (9, 129), (4, 8193),
                                   (0, 5)])  # (600, 1000): rows split across two threads, two blocks each
def test_softmax_loops_are_the_numpy_code_bit_for_bit(kind, shape, rng):
    x = _logit_rows(rng, shape)
    with np.errstate(all="ignore"):
        fast, slow = both_ways(lambda: run(kind, [x])[0])
    _same_bits(fast, slow)


@pytest.mark.parametrize("kind, op", [("softmax", R.Softmax), ("log_softmax", R.LogSoftmax)])
def test_softmax_loops_against_tf(kind, op, jit, rng):
    for shape in ((8, 4, 16, 128), (20, 8000)):
        x = (rng.normal(size=shape) * 4).astype(F)
        check(run(kind, [x])[0], op(logits=x), rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("n, shape", [(2, (8000, 3)), (3, (64, 1024)), (4, (130, 257)), (5, (3,))])
def test_add_n_is_tfs_bit_for_bit(n, shape, jit, rng):
    xs = [(rng.normal(size=shape) * 10.0 ** k).astype(F) for k in range(n)]
    xs[0].reshape(-1)[:3] = [np.inf, -0.0, np.nan]
    xs[1].reshape(-1)[:3] = [-np.inf, -0.0, 1.0]
    _same_bits(run("add_n", xs)[0], R.AddN(inputs=xs).numpy())


@pytest.mark.parametrize("pattern", ["full", "scalar_else", "scalar_then", "v1_rows"])
def test_select_is_tfs_bit_for_bit(pattern, jit, rng):
    shape = (8, 4, 32, 33)  # above elementwise._SMALL: the loops
    cond = rng.random(shape) < 0.7
    x, y = rng.normal(size=shape).astype(F), rng.normal(size=shape).astype(F)
    x.reshape(-1)[:2] = [np.nan, -0.0]
    if pattern == "scalar_else":
        y = np.asarray(-np.inf, F)
    elif pattern == "scalar_then":
        x = np.asarray(-1e9, F)
    if pattern == "v1_rows":
        rows = cond[:, 0, 0, 0]
        _same_bits(run("select", [rows, x, y], {"broadcast": "v1"})[0], R.Select(condition=rows, x=x, y=y).numpy())
    else:
        _same_bits(run("select", [cond, x, y])[0], R.SelectV2(condition=cond, t=x, e=y).numpy())
    ints = rng.integers(-5, 5, size=shape).astype(np.int32)
    _same_bits(run("select", [cond, ints, np.asarray(7, np.int32)])[0],
               R.SelectV2(condition=cond, t=ints, e=np.int32(7)).numpy())


@pytest.mark.parametrize("on, off", [(1.0, 0.0), (2.5, -1.0), (1.0, -0.0), (np.int32(3), np.int32(0))])
def test_one_hot_is_tfs_bit_for_bit(on, off, rng):
    idx = rng.integers(-2, 9000, size=(2, 80)).astype(np.int32)  # some out of range: all-off rows
    ours = run("one_hot", [idx], {"depth": 8000, "on_value": on, "off_value": off, "axis": -1})[0]
    dtype = np.asarray(on).dtype if isinstance(on, np.generic) else np.dtype(F)
    _same_bits(ours, R.OneHot(indices=idx, depth=8000, on_value=dtype.type(on), off_value=dtype.type(off)).numpy())


def test_unsorted_segment_sum_is_tfs_bit_for_bit(jit, rng):
    """Duplicate ids sum in data order (values of very different sizes make the order show), negative ids
    are dropped."""
    data = (rng.normal(size=(1024, 3, 5)) * np.exp(rng.uniform(-12, 12, (1024, 1, 1)))).astype(F)
    ids = rng.integers(-1, 40, size=1024).astype(np.int32)
    _same_bits(run("unsorted_segment_sum", [data, ids], {"num_segments": 50})[0],
               R.UnsortedSegmentSum(data=data, segment_ids=ids, num_segments=50).numpy())
    ids2 = rng.integers(0, 6, size=(16, 8)).astype(np.int64)
    data2 = rng.normal(size=(16, 8, 4)).astype(np.float64)
    _same_bits(run("unsorted_segment_sum", [data2, ids2], {"num_segments": 7})[0],
               R.UnsortedSegmentSum(data=data2, segment_ids=ids2, num_segments=7).numpy())


def test_unchecked_unsorted_segment_sum_drops_ids_too_large_both_ways(rng):
    data, ids = rng.normal(size=(30, 4)).astype(F), rng.integers(-2, 9, size=30).astype(np.int32)
    fast, slow = both_ways(lambda: run("unsorted_segment_sum", [data, ids], {"num_segments": 6}, check=False)[0])
    _same_bits(fast, slow)


@pytest.mark.parametrize("shapes", [((160, 800), (800,)), ((8, 4, 32, 32), (8, 1, 1, 32)), ((), (256, 256)),
                                    ((256, 256), ()), ((130, 129), (130, 129)), ((33, 7), (33, 7)), ((), ())])
def test_add_is_tfs_bit_for_bit(shapes, rng):
    x, y = (np.asarray(rng.normal(size=s) * 3, F) for s in shapes)
    ours = run("add", [x, y])[0]
    _same_bits(ours, R.AddV2(x=x, y=y).numpy())
    if ours.size >= elementwise._SMALL:
        assert ours.ctypes.data % 64 == 0


def test_assign_variable_copies_into_the_variable(rng):
    var = np.zeros((7, 5), F)
    value = rng.normal(size=(7, 5)).astype(F)
    before = var
    run("assign_variable", [value], variables=[var])
    assert var is before
    _same_bits(var, value)
    value[0, 0] = 9.0  # a copy, not a view
    assert var[0, 0] != 9.0
