"""The numba loops of the memory-bound kernels give the numpy code's result bit for bit (wse/kernels/_jit.py).

The numpy code is the one the TF-comparison tests check (they run both ways through the `jit` fixture);
here every loop meets its numpy twin on inputs made to hit the edges: NaN, inf, signed zeros,
subnormals, values beyond the half format's range.
"""
from __future__ import annotations

import contextlib
import os
import sys

import numpy as np
import pytest
from kernel_helpers import both_ways, run

from cerebras_tf.amp import round_to_half
from cerebras_tf.wse import denormals
from cerebras_tf.wse.kernels import _jit
from cerebras_tf.wse.kernels.half import round_half, round_half_in_layout
from cerebras_tf.wse.memory import ALIGNMENT

F = np.float32


def _edgy(rng: np.random.Generator, n: int) -> np.ndarray:
    """Normal values over a wide exponent range, random bit patterns (NaN payloads among them), the edges."""
    wide = (rng.normal(size=n) * np.exp(rng.uniform(-40, 40, n))).astype(F)
    bits = rng.integers(0, 2 ** 32, n // 8, dtype=np.uint64).astype(np.uint32).view(F)
    edges = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 65504, 65520, 65519.99, -65520, 6e-8, 2.9e-8,
                      3e-8, 1e-45, -1e-45, 3.4e38, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11], F)
    x = np.concatenate([wide, bits, edges])
    rng.shuffle(x)
    return x


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("half", ["float16", "bfloat16", "cbfloat16"])
@pytest.mark.parametrize("n", [1, 2047, 2049, 300_001])  # around a block
def test_half_rounding_is_the_reference_bit_for_bit(half, n, rng):
    x = _edgy(rng, n)[:n].reshape(-1, 1)
    fast, slow = both_ways(lambda: round_half(x, half))
    _same_bits(fast, round_to_half(x, half))
    _same_bits(slow, round_to_half(x, half))


@pytest.mark.parametrize("half", ["float16", "bfloat16", "cbfloat16", "float32"])
def test_half_rounding_of_a_strided_view_is_a_new_contiguous_array_of_the_references_bits(half, rng):
    """A transpose the executor hands on uncopied (fusion.lazy_transposes) rounded by the to_half before a
    batch_matmul: copied into a new array and rounded there; the view is left as it was."""
    x = _edgy(rng, 8 * 64 * 4 * 33)[:8 * 64 * 4 * 33].reshape(8, 64, 4, 33)
    view = x.transpose(0, 2, 1, 3)
    before = x.copy()
    expected = round_to_half(np.ascontiguousarray(view), half) if half != "float32" else np.ascontiguousarray(view)
    for jit in (True, False):
        with _jit.use_jit(jit):
            y = round_half(view, half)
            assert y.flags.c_contiguous and not np.shares_memory(y, x)
            _same_bits(y, expected)
    _same_bits(x, before)


@pytest.mark.parametrize("half", ["float16", "bfloat16", "float32"])
def test_half_rounding_in_layout_keeps_a_transposed_views_layout(half, rng):
    """The executor's to_half on a transpose handed on uncopied: a new array rounded in the block's own order,
    handed on as the same view (the strides of x's view), with the reference's bits; other strided views
    (a slice, a broadcast) are rounded into a new contiguous array as round_half does."""
    x = _edgy(rng, 8 * 64 * 4 * 33)[:8 * 64 * 4 * 33].reshape(8, 64, 4, 33)
    before = x.copy()
    for jit in (True, False):
        with _jit.use_jit(jit):
            for view in (x.transpose(0, 2, 1, 3), x.transpose(3, 0, 1, 2), x):
                expected = round_to_half(view, half) if half != "float32" else view
                y = round_half_in_layout(view, half)
                assert y.strides == view.strides and not np.shares_memory(y, x)
                assert y.ctypes.data % ALIGNMENT == 0
                _same_bits(np.ascontiguousarray(y), np.ascontiguousarray(expected))
            for view in (x[:, ::2], np.broadcast_to(x[:1], x.shape)):
                y = round_half_in_layout(view, half)
                assert y.flags.c_contiguous
                _same_bits(y, np.ascontiguousarray(round_to_half(view, half) if half != "float32" else view))
    _same_bits(x, before)


@pytest.mark.parametrize("half", ["float16", "bfloat16", "cbfloat16"])
def test_half_rounding_in_place_is_the_reference_bit_for_bit(half, rng):
    x = _edgy(rng, 300_001)[:300_001].reshape(-1, 1)
    expected = round_to_half(x, half)
    for jit in (True, False):
        with _jit.use_jit(jit):
            y = x.copy()
            assert round_half(y, half, out=y) is y
            _same_bits(y, expected)
    with pytest.raises(ValueError, match="C-contiguous float32"):
        round_half(x, half, out=np.empty((3, 1), F))


@pytest.mark.parametrize("flush", [False, True])
def test_float16_rounding_is_the_reference_across_the_float32_bit_space(flush):
    # float16 takes the hardware conversion (F16C on x86-64); one float32 pattern in 251, every exponent and
    # sign, subnormals and NaN payloads among them (all 2**32 agree: checked once, 75 s), also with the
    # executor's denormal flushing (DAZ reads a float32 subnormal as zero: float16 rounds those to zero anyway)
    x = np.arange(0, 2 ** 32, 251, dtype=np.uint64).astype(np.uint32).view(F)
    with denormals.flushing() if flush else contextlib.nullcontext():
        ours = round_half(x, "float16")
    _same_bits(ours, round_to_half(x, "float16"))


def test_relu_is_the_reference_bit_for_bit(rng):
    x = _edgy(rng, 200_000)
    fast, slow = both_ways(lambda: run("relu", [x])[0])
    _same_bits(fast, slow)


def test_relu_grad_is_the_reference_bit_for_bit(rng):
    g, f = _edgy(rng, 200_000), _edgy(rng, 200_000)
    fast, slow = both_ways(lambda: run("relu_grad", [g, f])[0])
    _same_bits(fast, slow)
    assert np.signbit(fast[f <= 0]).sum() == 0  # +0 where the gradient is dropped


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("n", [7, 300_001])
def test_optimizer_loops_are_the_reference_bit_for_bit(nesterov, n, rng):
    """apply_momentum and apply_adam, six steps each (an inf, a NaN and a -0 gradient among them), every
    variable and slot compared."""
    grads = [rng.normal(size=n).astype(F) * F(10.0 ** k) for k in range(-3, 3)]
    grads[2][:3] = [np.inf, np.nan, -0.0]
    start = rng.normal(size=n).astype(F)

    def momentum():
        state = [start.copy(), np.zeros(n, F)]
        for g in grads:
            run("apply_momentum", [F(0.05), g, F(0.9)], {"use_nesterov": nesterov}, variables=state)
        return state

    def adam():
        state = [start.copy(), np.zeros(n, F), np.zeros(n, F)]
        for t, g in enumerate(grads, 1):
            run("apply_adam", [F(0.9 ** t), F(0.999 ** t), F(0.01), F(0.9), F(0.999), F(1e-7), g],
                {"use_nesterov": nesterov}, variables=state)
        return state

    with np.errstate(invalid="ignore", over="ignore"):
        for update in (momentum, adam):
            fast, slow = both_ways(update)
            for a, b in zip(fast, slow):
                _same_bits(a, b)


def test_with_the_loops_off_rounding_runs_the_reference_alone(monkeypatch):
    from cerebras_tf.wse.kernels import half

    def refused(*args):
        raise AssertionError("the numba loop ran with the loops off")
    monkeypatch.setattr(half, "_round_narrow", refused)
    monkeypatch.setattr(half, "_round_float16", refused)
    monkeypatch.setattr(half, "_round_bfloat16", refused)
    x = np.linspace(-5, 5, 1001, dtype=F)
    with _jit.use_jit(False):
        for dtype in ("float16", "bfloat16"):
            _same_bits(round_half(x, dtype), round_to_half(x, dtype))


_CACHED_LOOP = '''
from cerebras_tf.wse.kernels import _jit


@_jit.jit
def plus_one(x):
    return x + 1.0
'''


@pytest.mark.skipif(not _jit.enabled(), reason="numba is not installed")
def test_a_loops_disk_cache_entry_holds_only_under_the_kernels_sources_it_was_compiled_with(tmp_path, monkeypatch):
    """numba keys a cached loop on its own file; a callee from another module of the package is compiled into
    it, so the key also carries the package's stamp: another stamp misses the entry and compiles again."""
    import importlib.util
    source = tmp_path / "cached_loop.py"
    source.write_text(_CACHED_LOOP)
    spec = importlib.util.spec_from_file_location("cached_loop", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "cached_loop", module)
    spec.loader.exec_module(module)

    def compiled_anew(stamp: str) -> bool:
        monkeypatch.setattr(_jit, "SOURCES_STAMP", stamp)
        loop = _jit.jit(module.plus_one.py_func)  # a fresh dispatcher: only the disk cache can spare a compile
        assert loop(1.0) == 2.0
        return sum(loop.stats.cache_misses.values()) > 0 and sum(loop.stats.cache_hits.values()) == 0

    assert compiled_anew("first")
    assert not compiled_anew("first")
    assert compiled_anew("second")
    assert not compiled_anew("first")  # each stamp keeps its entry
    assert any(name.endswith(".nbi") for name in os.listdir(tmp_path / "__pycache__"))


def test_the_kernels_sources_stamp_changes_with_any_module_of_the_package(tmp_path):
    import shutil
    package = tmp_path / "kernels"
    shutil.copytree(os.path.dirname(_jit.__file__), package, ignore=shutil.ignore_patterns("__pycache__"))
    assert _jit.sources_stamp(str(package)) == _jit.SOURCES_STAMP
    half = package / "half.py"
    half.write_text(half.read_text() + "\n")
    assert _jit.sources_stamp(str(package)) != _jit.SOURCES_STAMP
