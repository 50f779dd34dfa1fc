"""Random kernels (determinism, per-step freshness, distribution) and variable/optimizer kernels vs TF."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from kernel_helpers import check, run

R = tf.raw_ops
F = np.float32
SHAPE = [200, 500]


@pytest.mark.parametrize("kind", ["random_uniform", "random_normal", "truncated_normal"])
def test_random_is_deterministic_and_fresh_per_step(kind):
    attrs = {"seed": 7, "seed2": 3, "dtype": "float32", "shape": SHAPE}
    a, b = run(kind, [], attrs, step=5)[0], run(kind, [], attrs, step=5)[0]
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.float32 and list(a.shape) == SHAPE
    assert not np.array_equal(a, run(kind, [], attrs, step=6)[0])
    assert not np.array_equal(a, run(kind, [], {**attrs, "seed2": 4}, step=5)[0])


def test_unseeded_kernels_differ_by_salt():
    attrs = {"seed": 0, "seed2": 0, "dtype": "float32", "shape": [100]}
    a = run("random_normal", [], attrs, step=1, salt=1)[0]
    assert not np.array_equal(a, run("random_normal", [], attrs, step=1, salt=2)[0])
    np.testing.assert_array_equal(a, run("random_normal", [], attrs, step=1, salt=1)[0])


# (key, (counter low, high), size): the Random123 known answer, a counter whose low half carries into the high
# one inside the sample, one that wraps at 2^128, a size that is no multiple of 4, one the numba loop splits
PHILOX_CASES = [(0, (0, 0), 8), (0x299F31D0A4093822, (0xFFFFFFFFFFFFFF00, 0x0370734413198A2E), 1001),
                (123, (2**64 - 3, 2**64 - 1), 10), (5, (7, 9), 1 << 20)]


@pytest.mark.parametrize("key,counter,size", PHILOX_CASES)
def test_philox_uniform_is_tfs_stateless_uniform(jit, key, counter, size):
    from cerebras_tf.wse.kernels.random import philox_uniform

    theirs = R.StatelessRandomUniformV2(shape=[size], key=tf.constant([key], tf.uint64),
                                        counter=tf.constant(list(counter), tf.uint64), alg=1, dtype=tf.float32)
    ours = philox_uniform(size, key, counter)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, theirs.numpy())


def test_random_uniform_is_the_stateless_uniform_of_its_stream(jit):
    from cerebras_tf.wse.kernels._registry import KernelContext
    from cerebras_tf.wse.kernels.random import stream

    attrs = {"seed": 7, "seed2": 3, "dtype": "float32", "shape": [30, 7]}
    key, counter = stream(attrs, KernelContext(step=11))
    theirs = R.StatelessRandomUniformV2(shape=[30, 7], key=tf.constant([key], tf.uint64),
                                        counter=tf.constant(list(counter), tf.uint64), alg=1, dtype=tf.float32)
    np.testing.assert_array_equal(run("random_uniform", [], attrs, step=11)[0], theirs.numpy())
    assert stream(attrs, KernelContext(step=12)) != (key, counter)


def test_random_distributions():
    n = float(np.prod(SHAPE))
    u = run("random_uniform", [], {"seed": 1, "seed2": 2, "shape": SHAPE})[0]
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 5 / np.sqrt(12 * n) and abs(u.var() - 1 / 12) < 0.002
    z = run("random_normal", [], {"seed": 1, "seed2": 2, "shape": SHAPE})[0]
    assert abs(z.mean()) < 5 / np.sqrt(n) and abs(z.var() - 1) < 0.01
    assert abs(np.mean(z ** 3)) < 5 * np.sqrt(15 / n)  # symmetric (E z^3 = 0, Var z^3 = 15)
    t = run("truncated_normal", [], {"seed": 1, "seed2": 2, "shape": SHAPE})[0]
    assert np.abs(t).max() <= 2 and abs(t.mean()) < 5 * 0.88 / np.sqrt(n)
    # variance of N(0,1) truncated to [-2, 2]: 0.774
    ref = tf.random.truncated_normal(SHAPE, seed=1).numpy()
    assert abs(t.var() - 0.7737) < 0.01 and abs(ref.var() - 0.7737) < 0.01


def test_random_half_dtype_is_rounded():
    from cerebras_tf.amp.dtypes import round_to_half
    h = run("random_normal", [], {"seed": 1, "seed2": 2, "shape": [1000], "dtype": "half"})[0]
    np.testing.assert_array_equal(h, round_to_half(h))
    assert run("random_uniform", [], {"seed": 1, "seed2": 2, "shape": [10], "dtype": "float16"})[0].dtype == np.float16


# ---- variables ---------------------------------------------------------------------------------

def test_read_variable_is_a_snapshot(rng):
    var = rng.normal(size=(3, 4)).astype(F)
    before = var.copy()
    read = run("read_variable", [], variables=[var])[0]
    run("assign_add_variable", [np.ones((3, 4), F)], variables=[var])
    np.testing.assert_array_equal(read, before)  # the earlier read keeps its value
    np.testing.assert_array_equal(var, before + 1)  # the write happened in place


def test_assign_kinds_match_tf(rng):
    init, val = rng.normal(size=(3, 4)).astype(F), rng.normal(size=(3, 4)).astype(F)
    ours, tfv = init.copy(), tf.Variable(init)
    for kind, op in (("assign_add_variable", R.AssignAddVariableOp), ("assign_sub_variable", R.AssignSubVariableOp),
                     ("assign_variable", R.AssignVariableOp), ("assign_add_variable", R.AssignAddVariableOp)):
        assert run(kind, [val], variables=[ours]) == []
        op(resource=tfv.handle, value=val)
        check(ours, tfv.numpy())


def test_scatter_add_and_gather_variable(rng):
    init = rng.normal(size=(6, 3)).astype(F)
    ours, tfv = init.copy(), tf.Variable(init)
    idx = np.array([1, 4, 1, 0], np.int32)
    upd = rng.normal(size=(4, 3)).astype(F)
    run("scatter_add_variable", [idx, upd], variables=[ours])
    R.ResourceScatterAdd(resource=tfv.handle, indices=idx, updates=upd)
    check(ours, tfv.numpy())
    gidx = np.array([[5, 0], [2, 2]], np.int32)
    check(run("gather_variable", [gidx], {"batch_dims": 0}, variables=[ours])[0],
          R.ResourceGather(resource=tfv.handle, indices=gidx, dtype=tf.float32))


# ---- optimizers: a few steps against ResourceApply* on tf.Variables -----------------------------

def _compare(kind, tf_op, n_vars, make_inputs, tf_kwargs, attrs, rng, steps=4, slots_init=None, shape=(5, 7),
             **tol):
    init = [rng.normal(size=shape).astype(F)]
    for _ in range(1, n_vars):
        init.append(np.abs(rng.normal(size=shape)).astype(F) * F(0.1) if slots_init is None else slots_init(shape))
    ours = [a.copy() for a in init]
    tvars = [tf.Variable(a) for a in init]
    for step in range(steps):
        inputs = make_inputs(step, shape)
        assert run(kind, inputs, attrs, variables=ours) == []
        tf_op(**{name: h.handle for name, h in zip(tf_kwargs[:n_vars], tvars)},
              **dict(zip(tf_kwargs[n_vars:], inputs)), **attrs)
    for o, t in zip(ours, tvars):
        check(o, t.numpy(), **(tol or dict(rtol=1e-6, atol=1e-7)))


def _g(rng):
    return lambda step, shape: rng.normal(size=shape).astype(F)


def test_apply_gradient_descent(rng):
    _compare("apply_gradient_descent", R.ResourceApplyGradientDescent, 1,
             lambda s, sh: [F(0.1), rng.normal(size=sh).astype(F)], ["var", "alpha", "delta"], {}, rng)


@pytest.mark.parametrize("nesterov", [False, True])
def test_apply_momentum(nesterov, rng, jit):
    _compare("apply_momentum", R.ResourceApplyMomentum, 2,
             lambda s, sh: [F(0.05), rng.normal(size=sh).astype(F), F(0.9)],
             ["var", "accum", "lr", "grad", "momentum"], {"use_nesterov": nesterov}, rng)


@pytest.mark.parametrize("nesterov", [False, True])
def test_apply_keras_momentum(nesterov, rng):
    _compare("apply_keras_momentum", R.ResourceApplyKerasMomentum, 2,
             lambda s, sh: [F(0.05), rng.normal(size=sh).astype(F), F(0.9)],
             ["var", "accum", "lr", "grad", "momentum"], {"use_nesterov": nesterov}, rng)


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("indices", [[4, 0, 2], [1, 3, 1]])
def test_sparse_apply_momentum(nesterov, indices, rng):
    idx = np.array(indices, np.int32)
    _compare("sparse_apply_momentum", R.ResourceSparseApplyMomentum, 2,
             lambda s, sh: [F(0.05), rng.normal(size=(3, sh[1])).astype(F), idx, F(0.9)],
             ["var", "accum", "lr", "grad", "indices", "momentum"], {"use_nesterov": nesterov}, rng)


@pytest.mark.parametrize("shape", [(5, 7), (600, 300)])  # the big one is split across host threads
@pytest.mark.parametrize("nesterov", [False, True])
def test_apply_adam(nesterov, shape, rng, jit):
    b1, b2 = F(0.9), F(0.999)

    def inputs(step, shape):
        t = step + 1
        return [F(b1 ** t), F(b2 ** t), F(0.01), b1, b2, F(1e-7), rng.normal(size=shape).astype(F)]

    _compare("apply_adam", R.ResourceApplyAdam, 3, inputs,
             ["var", "m", "v", "beta1_power", "beta2_power", "lr", "beta1", "beta2", "epsilon", "grad"],
             {"use_nesterov": nesterov}, rng, steps=6, slots_init=lambda s: np.zeros(s, F), shape=shape)


def test_apply_rms_prop(rng):
    _compare("apply_rms_prop", R.ResourceApplyRMSProp, 3,
             lambda s, sh: [F(0.01), F(0.9), F(0.5), F(1e-7), rng.normal(size=sh).astype(F)],
             ["var", "ms", "mom", "lr", "rho", "momentum", "epsilon", "grad"], {}, rng)


@pytest.mark.parametrize("update_slots", [True, False])
def test_apply_adagrad(update_slots, rng):
    _compare("apply_adagrad", R.ResourceApplyAdagrad, 2,
             lambda s, sh: [F(0.1), rng.normal(size=sh).astype(F)], ["var", "accum", "lr", "grad"],
             {"update_slots": update_slots}, rng)
    _compare("apply_adagrad_v2", R.ResourceApplyAdagradV2, 2,
             lambda s, sh: [F(0.1), F(1e-6), rng.normal(size=sh).astype(F)], ["var", "accum", "lr", "epsilon", "grad"],
             {"update_slots": update_slots}, rng)
