"""Half dtypes: round_to_half against TensorFlow casts and an independent slow reference."""
import math
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import amp
from cerebras_tf.amp import round_to_half

RNG = np.random.default_rng(1234)
TF_DTYPES = {"float16": tf.float16, "bfloat16": tf.bfloat16}
FORMAT_BITS = {"float16": (5, 10), "bfloat16": (8, 7), "cbfloat16": (6, 9)}


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def tf_round(x: np.ndarray, dtype: str) -> np.ndarray:
    return tf.cast(tf.constant(x, tf.float32), TF_DTYPES[dtype]).numpy().astype(np.float32)


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Bitwise equality (sign of zero included); NaN only has to stay NaN."""
    assert got.dtype == np.float32 and got.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bad = np.flatnonzero((bits(got) != bits(want)) & ~nan)
    assert bad.size == 0, f"{bad.size} mismatches, e.g. got {got.ravel()[bad[:5]]} want {want.ravel()[bad[:5]]}"


def reference_round(x: np.ndarray, exponent_bits: int, mantissa_bits: int) -> np.ndarray:
    """Slow, independent IEEE-style rounding (RNE, subnormals, overflow to inf), per element."""
    bias = 2 ** (exponent_bits - 1) - 1
    emin = 1 - bias
    max_finite = (2.0 - 2.0 ** -mantissa_bits) * 2.0 ** bias
    out = []
    for v in np.asarray(x, dtype=np.float32).ravel().tolist():
        if math.isnan(v) or math.isinf(v) or v == 0.0:
            out.append(v)
            continue
        m, e = math.frexp(abs(v))  # |v| = m * 2**e, 0.5 <= m < 1
        quantum = 2.0 ** (max(e - 1, emin) - mantissa_bits)
        r = round(abs(v) / quantum) * quantum  # Python round(): ties to even, exact here
        r = math.inf if r > max_finite else r
        out.append(math.copysign(r, v))
    return np.array(out, dtype=np.float32).reshape(np.shape(x))


def random_many_scales(n: int, lo: int, hi: int) -> np.ndarray:
    x = RNG.standard_normal(n) * np.exp2(RNG.integers(lo, hi, n).astype(np.float64))
    return x.astype(np.float32)


def halfway_cases(dtype: str, n: int = 4000) -> np.ndarray:
    """Exact midpoints between consecutive representable values (plus/minus one float32 ulp)."""
    e_bits, m_bits = FORMAT_BITS[dtype]
    bias = 2 ** (e_bits - 1) - 1
    # Random representable values from the smallest subnormal up to max finite.
    exps = RNG.integers(1 - bias - m_bits, bias + 1, n)
    exps = np.maximum(exps, 1 - bias)
    mant = RNG.integers(0, 2 ** m_bits, n)
    sub = RNG.random(n) < 0.1
    ulp = np.exp2((exps - m_bits).astype(np.float64))
    v = np.where(sub, mant * 2.0 ** (1 - bias - m_bits), (2 ** m_bits + mant) * ulp)
    step = np.where(sub, 2.0 ** (1 - bias - m_bits), ulp)
    mid = (v + step / 2).astype(np.float32)
    assert np.all(mid.astype(np.float64) == v + step / 2), "midpoints must be exact float32"
    mid = mid * np.where(RNG.random(n) < 0.5, -1, 1).astype(np.float32)
    return np.concatenate([mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))])


SPECIALS = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 65504.0, 65519.996, 65520.0, -65520.0, 1e5,
     3.3895314e38, 3.3961776e38, np.finfo(np.float32).max, -np.finfo(np.float32).max,
     2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -25, 3 * 2.0 ** -25, 2.0 ** -26, 1e-30,
     np.finfo(np.float32).tiny, 1e-40, -1e-40, 1e-45, 2.0 ** -133, 3 * 2.0 ** -134],
    dtype=np.float32,
)
NAN_PAYLOADS = np.array([0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00001], np.uint32).view(np.float32)
SPECIALS = np.concatenate([SPECIALS, NAN_PAYLOADS])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
class TestAgainstTensorFlow:
    def test_random_normals_many_scales(self, dtype):
        x = random_many_scales(200_000, -45, 45)
        assert_same_bits(round_to_half(x, dtype), tf_round(x, dtype))

    def test_halfway_ties_round_to_even(self, dtype):
        x = halfway_cases(dtype)
        got = round_to_half(x, dtype)
        assert_same_bits(got, tf_round(x, dtype))
        # The exact midpoints (first third) went to the value with an even last mantissa bit.
        mids = got[: len(x) // 3]
        half = mids.astype(np.float16 if dtype == "float16" else ml_dtypes.bfloat16)
        assert np.all(half.view(np.uint16) & 1 == 0)

    def test_overflow_subnormals_nan_inf(self, dtype):
        got = round_to_half(SPECIALS, dtype)
        assert_same_bits(got, tf_round(SPECIALS, dtype))
        assert np.isnan(got[np.isnan(SPECIALS)]).all()

    def test_subnormal_range(self, dtype):
        tiny = amp.half_format(dtype).smallest_normal
        x = (RNG.uniform(-2 * tiny, 2 * tiny, 50_000)).astype(np.float32)
        assert_same_bits(round_to_half(x, dtype), tf_round(x, dtype))

    def test_reference_agrees_with_tensorflow(self, dtype):
        """Validates the slow reference used for cbfloat16 on the formats TF knows."""
        x = np.concatenate([random_many_scales(3000, -45, 45), halfway_cases(dtype, 300), SPECIALS])
        assert_same_bits(reference_round(x, *FORMAT_BITS[dtype]), tf_round(x, dtype))


class TestCbfloat16:
    def test_random_against_reference(self):
        x = np.concatenate([random_many_scales(20_000, -50, 40), halfway_cases("cbfloat16", 3000), SPECIALS])
        assert_same_bits(round_to_half(x, "cbfloat16"), reference_round(x, 6, 9))

    @pytest.mark.parametrize(
        "x, want",
        [
            (4290772992.0, 4290772992.0),  # max finite (2 - 2**-9) * 2**31 = 2**32 - 2**22
            (2.0 ** 32 - 2.0 ** 21 - 256, 4290772992.0),  # just below the tie: stays max
            (2.0 ** 32 - 2.0 ** 21, math.inf),  # tie above max: rounds to even -> inf
            (-(2.0 ** 33), -math.inf),
            (1.0 + 2.0 ** -10, 1.0),  # tie, 1.0 is even
            (1.0 + 3 * 2.0 ** -10, 1.0 + 2.0 ** -8),  # tie, goes up to the even neighbour
            (1.0 + 2.0 ** -10 + 2.0 ** -20, 1.0 + 2.0 ** -9),  # above the tie
            (2.0 ** -30, 2.0 ** -30),  # smallest normal
            (2.0 ** -30 - 2.0 ** -40, 2.0 ** -30),  # tie between 511 * 2**-39 (odd) and 2**-30
            (2.0 ** -39, 2.0 ** -39),  # smallest subnormal
            (2.0 ** -40, 0.0),  # tie between 0 and 2**-39 -> 0
            (1.5 * 2.0 ** -40, 2.0 ** -39),
            (3 * 2.0 ** -40, 2.0 ** -38),  # tie between 1 and 2 quanta -> 2
            (-(2.0 ** -41), -0.0),
            (1e-3, 524 * 2.0 ** -19),  # 1e-3 / 2**-19 = 524.29
            (3.14159265, 3.140625),
        ],
    )
    def test_hand_computed(self, x, want):
        got = round_to_half(np.array([x], np.float32), "cbfloat16")
        assert bits(got)[0] == bits(np.array([want], np.float32))[0], (x, got[0], want)

    def test_values_are_representable(self):
        """Every output has at most 10 significant bits and lies on the format's grid."""
        y = round_to_half(random_many_scales(100_000, -45, 35), "cbfloat16")
        finite = np.isfinite(y) & (y != 0)
        m, e = np.frexp(y[finite].astype(np.float64))
        e = e - 1
        q = np.exp2(np.maximum(e, -30) - 9)
        assert np.all(np.abs(y[finite]) / q == np.round(np.abs(y[finite]) / q))
        assert np.all(np.abs(y[finite]) <= amp.half_format("cbfloat16").max_finite)


class TestFormats:
    def test_float16_facts_match_numpy(self):
        f, ref = amp.half_format("float16"), np.finfo(np.float16)
        assert (f.max_finite, f.smallest_normal, f.epsilon) == (float(ref.max), float(ref.tiny), float(ref.eps))
        assert f.smallest_subnormal == float(ref.smallest_subnormal) and f.bias == 15

    def test_bfloat16_facts_match_ml_dtypes(self):
        f, ref = amp.half_format("bfloat16"), ml_dtypes.finfo(ml_dtypes.bfloat16)
        assert (f.max_finite, f.smallest_normal, f.epsilon) == (float(ref.max), float(ref.tiny), float(ref.eps))
        assert f.bias == 127

    def test_cbfloat16_facts(self):
        f = amp.half_format("cbfloat16")
        assert (f.exponent_bits, f.mantissa_bits, f.bias) == (6, 9, 31)
        assert f.max_finite == 4290772992.0 and f.smallest_normal == 2.0 ** -30
        assert f.smallest_subnormal == 2.0 ** -39 and f.epsilon == 2.0 ** -9
        for v in (f.max_finite, f.smallest_normal, f.smallest_subnormal, 1 + f.epsilon):
            assert round_to_half(np.float32(v), "cbfloat16") == np.float32(v)
        assert round_to_half(np.float32(1 + f.epsilon / 2), "cbfloat16") == 1.0


class TestApi:
    def test_default_and_set_half_dtype(self):
        assert amp.get_half_dtype() == "float16"
        assert amp.set_half_dtype("CBFloat16") == "cbfloat16"
        assert amp.get_half_dtype() == "cbfloat16"
        x = np.float32(1.0 + 2.0 ** -10)
        assert round_to_half(x) == 1.0  # cbfloat16 tie -> even
        assert amp.set_half_dtype(np.float16) == "float16"
        assert round_to_half(x) == x  # representable in float16
        assert amp.set_half_dtype(ml_dtypes.bfloat16) == "bfloat16"

    def test_float32_mode_rounds_nothing(self):
        try:
            assert amp.set_half_dtype(np.float32) == "float32"
            x = np.array([1.0 + 2.0 ** -20, 1e-30, 7e38 / 2], dtype=np.float32)
            np.testing.assert_array_equal(round_to_half(x), x)
        finally:
            amp.set_half_dtype("float16")

    @pytest.mark.parametrize("bad", ["float64", "fp16", "half", "", 16, np.float64, None])
    def test_set_half_dtype_refuses(self, bad):
        with pytest.raises(ValueError) as err:
            amp.set_half_dtype(bad)
        for name in ("float16", "bfloat16", "cbfloat16"):
            assert name in str(err.value)
        assert amp.get_half_dtype() == "float16"

    def test_round_to_half_rejects_unknown_dtype(self):
        with pytest.raises(ValueError, match="cbfloat16"):
            round_to_half(np.ones(3, np.float32), "float8")

    @pytest.mark.parametrize("dtype", ["float16", "bfloat16", "cbfloat16"])
    def test_shapes_copies_and_idempotence(self, dtype):
        x = random_many_scales(3 * 4 * 5, -20, 20).reshape(3, 4, 5)
        before = x.copy()
        y = round_to_half(x[:, ::2, :], dtype)  # non-contiguous input
        assert y.dtype == np.float32 and y.shape == (3, 2, 5)
        np.testing.assert_array_equal(x, before)  # input untouched
        assert_same_bits(round_to_half(y, dtype), y)
        s = round_to_half(1.0009765625, dtype)  # python float, 0-d result
        assert s.shape == () and s.dtype == np.float32
        assert round_to_half(np.float64(1e-3), dtype) == round_to_half(np.float32(1e-3), dtype)


def test_amp_modules_never_import_tensorflow():
    """The executor side (cerebras_tf.amp) must load without TensorFlow."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = textwrap.dedent(
        f"""
        import sys, types
        pkg = types.ModuleType("cerebras_tf"); pkg.__path__ = [{os.path.join(root, "cerebras_tf")!r}]
        sys.modules["cerebras_tf"] = pkg  # skip cerebras_tf/__init__ (the TF side)
        import numpy as np
        import cerebras_tf.amp as amp
        amp.round_to_half(np.ones(4, np.float32), "cbfloat16")
        amp.GradScaler("dynamic").unscale_and_check([np.ones(3, np.float32)])
        assert not any(m == "tensorflow" or m.startswith("tensorflow.") for m in sys.modules), "tensorflow imported"
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "cbfloat16", "float32"])
def test_round_to_half_into_out(dtype):
    x = np.array([[1.0001, -3e-6], [7e4, np.nan]], np.float32)
    out = np.empty((2, 2), np.float32)
    got = amp.round_to_half(x, dtype, out=out)
    assert got.base is out or got is out
    np.testing.assert_array_equal(out, amp.round_to_half(x, dtype))
    with pytest.raises(ValueError, match="C-contiguous float32"):
        amp.round_to_half(x, dtype, out=np.empty(3, np.float32))
