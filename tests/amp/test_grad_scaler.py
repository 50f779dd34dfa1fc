"""GradScaler: dynamic/static loss scaling, overflow tolerance, clipping (vs TF), checkpoint state."""
import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import amp
from cerebras_tf.amp import GradScaler, clip_by_global_norm, clip_by_value

RNG = np.random.default_rng(7)
FINITE, OVERFLOW = True, False


def grads_like(scale: float = 1.0) -> list[np.ndarray]:
    shapes = [(784, 50), (50,), (50, 10), (10,)]
    return [(RNG.standard_normal(s) * scale).astype(np.float32) for s in shapes]


def run(scaler: GradScaler, pattern: list[bool]) -> list[float]:
    return [scaler.update(f) for f in pattern]


class TestDefaults:
    def test_dynamic_defaults(self):
        s = GradScaler("dynamic")
        assert s.dynamic and s.scale == 2.0 ** 15 == s.max_loss_scale
        assert (s.steps_per_increase, s.min_loss_scale, s.overflow_tolerance) == (2000, 2.0 ** -14, 0.0)
        assert s.max_gradient_norm is None

    def test_cbfloat16_default_range(self):
        amp.set_half_dtype("cbfloat16")
        s = GradScaler("dynamic")
        assert s.scale == s.max_loss_scale == 2.0 ** 31

    def test_init_scale_is_clamped_to_max(self):
        assert GradScaler("dynamic", init_scale=2.0 ** 20, max_loss_scale=2.0 ** 10).scale == 2.0 ** 10

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            (dict(loss_scale="dynamc"), "dynamic"),
            (dict(loss_scale="dynamic", min_loss_scale=2.0 ** -20), "min_loss_scale"),
            (dict(loss_scale="dynamic", min_loss_scale=8.0, max_loss_scale=4.0), "max_loss_scale"),
            (dict(loss_scale="dynamic", overflow_tolerance=-0.1), "overflow_tolerance"),
            (dict(loss_scale=-2.0), "positive"),
            (dict(loss_scale=float("inf")), "positive"),
            (dict(loss_scale="dynamic", max_gradient_norm=-1.0), "max_gradient_norm"),
        ],
    )
    def test_refuses_bad_arguments(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            GradScaler(**kwargs)


class TestDynamic:
    def test_halves_on_overflow_and_skips_the_step(self):
        s = GradScaler("dynamic", init_scale=1024.0)
        g = grads_like()
        g[1][3] = np.inf
        applied = []
        res = s.step(g, applied.append)
        assert res.finite is False and not applied
        assert s.scale == 512.0 and s.num_skipped_steps == 1
        g[1][3] = np.nan
        res = s.step(g, applied.append)
        assert res.finite is False and not applied and s.scale == 256.0

    def test_step_applies_finite_unscaled_grads(self):
        s = GradScaler("dynamic", init_scale=4.0, steps_per_increase=1, max_loss_scale=8.0)
        applied = []
        res = s.step([np.array([4.0, -8.0], np.float32)], applied.append)
        assert res.finite and len(applied) == 1 and applied[0] is res.grads
        np.testing.assert_array_equal(applied[0][0], [1.0, -2.0])
        assert s.scale == 8.0 and s.num_skipped_steps == 0

    def test_doubles_after_steps_per_increase_finite_steps(self):
        s = GradScaler("dynamic", init_scale=8.0, steps_per_increase=3, max_loss_scale=1024.0)
        assert run(s, [FINITE] * 7) == [8.0, 8.0, 16.0, 16.0, 16.0, 32.0, 32.0]

    def test_overflow_restarts_the_increase_count(self):
        s = GradScaler("dynamic", init_scale=8.0, steps_per_increase=3)
        assert run(s, [FINITE, FINITE, OVERFLOW, FINITE, FINITE, FINITE]) == [8.0, 8.0, 4.0, 4.0, 4.0, 8.0]

    def test_clamped_to_max(self):
        s = GradScaler("dynamic", init_scale=16.0, steps_per_increase=1, max_loss_scale=64.0)
        assert run(s, [FINITE] * 5) == [32.0, 64.0, 64.0, 64.0, 64.0]

    def test_clamped_to_min(self):
        s = GradScaler("dynamic", init_scale=4.0, min_loss_scale=1.0)
        assert run(s, [OVERFLOW] * 4) == [2.0, 1.0, 1.0, 1.0]
        assert s.num_skipped_steps == 4

    def test_overflow_tolerance_fraction(self):
        # tolerance 0.5: an overflow is tolerated while overflows/steps since the last rescale <= 0.5.
        s = GradScaler("dynamic", init_scale=64.0, steps_per_increase=100, overflow_tolerance=0.5)
        scales = run(s, [FINITE, OVERFLOW, OVERFLOW, OVERFLOW, FINITE, FINITE, OVERFLOW])
        # 0/1, 1/2 (tolerated), 2/3 > .5 halve+reset, 1/1 halve+reset, 0/1, 0/2, 1/3 tolerated
        assert scales == [64.0, 64.0, 32.0, 16.0, 16.0, 16.0, 16.0]
        assert s.num_skipped_steps == 4  # tolerated overflows are still skipped
        assert (s.steps_since_rescale, s.overflows_since_rescale) == (3, 1)

    def test_tolerated_overflows_count_towards_increase(self):
        s = GradScaler("dynamic", init_scale=8.0, steps_per_increase=4, overflow_tolerance=0.4)
        assert run(s, [FINITE, FINITE, FINITE, OVERFLOW]) == [8.0, 8.0, 8.0, 16.0]

    def test_zero_tolerance_halves_on_every_overflow(self):
        s = GradScaler("dynamic", init_scale=2.0 ** 10, steps_per_increase=2)
        assert run(s, [FINITE, OVERFLOW, FINITE, OVERFLOW, OVERFLOW]) == [1024.0, 512.0, 512.0, 256.0, 128.0]

    def test_unscale_divides_by_the_scale(self):
        s = GradScaler("dynamic", init_scale=2.0 ** 12)
        g = grads_like()
        res = s.unscale_and_check([x * np.float32(2.0 ** 12) for x in g])
        assert res.finite is True
        for got, want in zip(res.grads, g):
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, want)  # power-of-two scale: exact
        assert res.global_norm == pytest.approx(float(tf.linalg.global_norm(g)), rel=1e-6)

    def test_huge_but_finite_grads_are_finite(self):
        s = GradScaler("dynamic", init_scale=1.0, min_loss_scale=1.0)
        res = s.unscale_and_check([np.full(4, 1e30, np.float32)])  # float32 sum of squares overflows
        assert res.finite is True and res.global_norm == pytest.approx(2e30, rel=1e-6)

    def test_scale_loss(self):
        s = GradScaler("dynamic", init_scale=256.0)
        assert s.scale_loss(np.float32(0.5)) == np.float32(128.0)


class TestStatic:
    @pytest.mark.parametrize("pattern", [[OVERFLOW] * 5, [FINITE] * 50, [FINITE, OVERFLOW] * 5])
    def test_static_scale_never_changes(self, pattern):
        s = GradScaler(loss_scale=128.0, steps_per_increase=1)
        assert not s.dynamic and set(run(s, pattern)) == {128.0}

    def test_none_means_no_scaling(self):
        s = GradScaler()
        g = grads_like()
        res = s.unscale_and_check(g)
        assert s.scale == 1.0 and res.finite
        assert all(np.array_equal(a, b) and a is not b for a, b in zip(res.grads, g))

    def test_static_unscale_and_skip(self):
        s = GradScaler(loss_scale=100.0)
        g = [np.array([100.0, -300.0], np.float32)]
        np.testing.assert_allclose(s.unscale_and_check(g).grads[0], [1.0, -3.0], rtol=1e-7)
        applied = []
        res = s.step([np.array([np.nan], np.float32)], applied.append)
        assert not res.finite and not applied and s.scale == 100.0 and s.num_skipped_steps == 1

    def test_static_ignores_max_gradient_norm_with_warning(self):
        with pytest.warns(UserWarning, match="dynamic"):
            s = GradScaler(loss_scale=1.0, max_gradient_norm=1e-3)
        g = grads_like()
        np.testing.assert_array_equal(s.unscale_and_check(g).grads[0], g[0])


class TestClipping:
    def test_gcc_matches_tf_clip_by_global_norm(self):
        g = grads_like(3.0)
        norm = float(tf.linalg.global_norm(g))
        clip = norm / 3
        s = GradScaler("dynamic", init_scale=2.0 ** 10, max_gradient_norm=clip)
        res = s.unscale_and_check([x * np.float32(2.0 ** 10) for x in g])
        want, want_norm = tf.clip_by_global_norm(g, clip)
        assert res.finite and res.global_norm == pytest.approx(float(want_norm), rel=1e-6)
        for got, w in zip(res.grads, want):
            np.testing.assert_allclose(got, w.numpy(), rtol=2e-6, atol=1e-9)
        assert float(tf.linalg.global_norm(res.grads)) == pytest.approx(clip, rel=1e-5)

    def test_gcc_below_threshold_leaves_grads(self):
        g = grads_like()
        clip = 10 * float(tf.linalg.global_norm(g))
        s = GradScaler("dynamic", init_scale=1.0, min_loss_scale=1.0, max_gradient_norm=clip)
        want, _ = tf.clip_by_global_norm(g, clip)
        for got, w in zip(s.unscale_and_check(g).grads, want):
            np.testing.assert_array_equal(got, w.numpy())

    @pytest.mark.parametrize("ratio", [0.01, 0.5, 0.99, 1.0, 2.0])
    def test_clip_by_global_norm_function_matches_tf(self, ratio):
        g = grads_like(0.1)
        clip = ratio * float(tf.linalg.global_norm(g))
        got, got_norm = clip_by_global_norm(g, clip)
        want, want_norm = tf.clip_by_global_norm(g, clip)
        assert got_norm == pytest.approx(float(want_norm), rel=1e-6)
        for a, w in zip(got, want):
            np.testing.assert_allclose(a, w.numpy(), rtol=2e-6, atol=1e-10)

    def test_clip_by_global_norm_nonfinite_gives_nan_like_tf(self):
        g = grads_like()
        g[0][0, 0] = np.inf
        got, norm = clip_by_global_norm(g, 1.0)
        want, _ = tf.clip_by_global_norm(g, 1.0)
        assert np.isinf(norm) or np.isnan(norm)
        assert all(np.isnan(a).all() == np.isnan(w.numpy()).all() for a, w in zip(got, want))
        assert np.isnan(got[1]).all()

    def test_clip_by_value_matches_tf(self):
        g = grads_like(2.0)
        for a, x in zip(clip_by_value(g, 0.5), g):
            np.testing.assert_array_equal(a, tf.clip_by_value(x, -0.5, 0.5).numpy())


class TestStateDict:
    def test_round_trip_continues_identically(self):
        pattern = [FINITE, OVERFLOW, FINITE, FINITE, OVERFLOW, FINITE, FINITE, FINITE]
        kwargs = dict(loss_scale="dynamic", init_scale=256.0, steps_per_increase=3, overflow_tolerance=0.3)
        a = GradScaler(**kwargs)
        run(a, pattern[:5])
        state = a.state_dict()
        assert set(state) == {"loss_scale", "steps_since_rescale", "overflows_since_rescale", "num_skipped_steps"}
        assert type(state["loss_scale"]) is float
        assert all(type(state[k]) is int for k in state if k != "loss_scale")
        b = GradScaler(**kwargs)
        # As if read back from TF checkpoint variables (numpy scalars).
        b.load_state_dict({k: np.float32(v) if k == "loss_scale" else np.int64(v) for k, v in state.items()})
        assert b.state_dict() == state and b.scale != 256.0
        assert run(b, pattern[5:]) == run(a, pattern[5:])
        assert b.state_dict() == a.state_dict()

    def test_load_rejects_invalid_scale(self):
        with pytest.raises(ValueError, match="loss_scale"):
            GradScaler("dynamic").load_state_dict({"loss_scale": float("nan")})
