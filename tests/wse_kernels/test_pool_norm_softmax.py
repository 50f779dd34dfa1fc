"""Pooling, fused batch norm, softmax and losses against tf.raw_ops."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf.wse.kernels import KernelInputError
from kernel_helpers import check, run

R = tf.raw_ops
F = np.float32

POOLS = [((2, 8, 8, 3), 2, 2, "VALID"), ((2, 9, 7, 3), 3, 2, "SAME"), ((1, 6, 6, 2), 3, 1, "SAME"),
         ((2, 7, 7, 2), 3, 2, "VALID")]


@pytest.mark.parametrize("case", POOLS, ids=range(len(POOLS)))
def test_max_pool_and_grad(case, rng):
    shape, k, s, padding = case
    x = rng.normal(size=shape).astype(F)
    attrs = {"ksize": [1, k, k, 1], "strides": [1, s, s, 1], "padding": padding, "data_format": "NHWC"}
    kw = dict(ksize=[1, k, k, 1], strides=[1, s, s, 1], padding=padding)
    y = R.MaxPool(input=x, **kw)
    check(run("max_pool", [x], attrs)[0], y, rtol=0, atol=0)
    g = rng.normal(size=y.shape).astype(F)
    check(run("max_pool_grad", [x, y.numpy(), g], attrs)[0],
          R.MaxPoolGrad(orig_input=x, orig_output=y, grad=g, **kw), rtol=1e-6, atol=1e-6)


def test_max_pool_grad_ties_go_to_first_max(rng):
    x = np.round(rng.normal(size=(2, 6, 6, 2))).astype(F)  # many ties
    x[0, :4, :4, 0] = 1.0
    attrs = {"ksize": [1, 3, 3, 1], "strides": [1, 1, 1, 1], "padding": "SAME"}
    kw = dict(ksize=[1, 3, 3, 1], strides=[1, 1, 1, 1], padding="SAME")
    y = R.MaxPool(input=x, **kw)
    g = rng.normal(size=y.shape).astype(F)
    check(run("max_pool_grad", [x, y.numpy(), g], attrs)[0],
          R.MaxPoolGrad(orig_input=x, orig_output=y, grad=g, **kw), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape,padding", [((3, 9, 7, 4), "VALID"), ((3, 9, 7, 4), "SAME"), ((2, 8, 8, 5), "SAME")])
def test_max_pool_grad_relu_ties_and_nonfinite_grads(shape, padding, rng):
    """After ReLU most 2x2 windows are all zero (ties); odd sizes crop (VALID) or pad (SAME);
    non-finite gradients are routed unchanged and never leak into other positions."""
    x = np.maximum(np.round(rng.normal(size=shape) * 2), 0).astype(F)
    kw = dict(ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding=padding)
    y = R.MaxPool(input=x, **kw)
    g = rng.normal(size=y.shape).astype(F)
    g.flat[:3] = [np.inf, -np.inf, np.nan]
    ours = run("max_pool_grad", [x, y.numpy(), g], kw)[0]
    theirs = R.MaxPoolGrad(orig_input=x, orig_output=y, grad=g, **kw).numpy()
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("case", POOLS, ids=range(len(POOLS)))
def test_avg_pool_and_grad(case, rng):
    shape, k, s, padding = case
    x = rng.normal(size=shape).astype(F)
    attrs = {"ksize": [1, k, k, 1], "strides": [1, s, s, 1], "padding": padding}
    kw = dict(ksize=[1, k, k, 1], strides=[1, s, s, 1], padding=padding)
    y = R.AvgPool(value=x, **kw)
    check(run("avg_pool", [x], attrs)[0], y)
    g = rng.normal(size=y.shape).astype(F)
    check(run("avg_pool_grad", [g], {**attrs, "orig_input_shape": list(shape)})[0],
          R.AvgPoolGrad(orig_input_shape=list(shape), grad=g, **kw))


def test_pool_nchw(rng):
    x = rng.normal(size=(2, 3, 6, 6)).astype(F)
    a = {"ksize": [1, 1, 2, 2], "strides": [1, 1, 2, 2], "padding": "VALID", "data_format": "NCHW"}
    nhwc = run("max_pool", [x.transpose(0, 2, 3, 1)], {"ksize": [1, 2, 2, 1], "strides": [1, 2, 2, 1],
                                                       "padding": "VALID"})[0]
    np.testing.assert_array_equal(run("max_pool", [x], a)[0], nhwc.transpose(0, 3, 1, 2))


@pytest.mark.parametrize("factor", [1.0, 0.1])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_fused_batch_norm_training_and_grad(factor, fmt, rng):
    x = (rng.normal(size=(4, 5, 6, 3)) * 2 + 1).astype(F)
    if fmt == "NCHW":
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    scale, offset = rng.normal(size=3).astype(F), rng.normal(size=3).astype(F)
    mean, var = rng.normal(size=3).astype(F), np.abs(rng.normal(size=3)).astype(F)
    attrs = {"epsilon": 1e-3, "exponential_avg_factor": factor, "data_format": fmt, "is_training": True}
    ours = run("fused_batch_norm", [x, scale, offset, mean, var], attrs)
    theirs = R.FusedBatchNormV3(x=x, scale=scale, offset=offset, mean=mean, variance=var, epsilon=1e-3,
                                exponential_avg_factor=factor, data_format=fmt, is_training=True)
    assert len(ours) == 6 and ours[5].shape == (0,)
    for o, t in zip(ours[:5], theirs[:5]):
        check(o, t, rtol=1e-5, atol=1e-5)
    dy = rng.normal(size=x.shape).astype(F)
    g_ours = run("fused_batch_norm_grad", [dy, x, scale, ours[3], ours[4], ours[5]], attrs)
    g_tf = R.FusedBatchNormGradV3(y_backprop=dy, x=x, scale=scale, reserve_space_1=theirs[3],
                                  reserve_space_2=theirs[4], reserve_space_3=theirs[5], epsilon=1e-3,
                                  data_format=fmt, is_training=True)
    assert len(g_ours) == 5
    for o, t in zip(g_ours[:3], g_tf[:3]):
        check(o, t, rtol=2e-5, atol=2e-5)


def test_fused_batch_norm_inference_and_grad(rng):
    x = rng.normal(size=(4, 5, 6, 3)).astype(F)
    scale, offset = rng.normal(size=3).astype(F), rng.normal(size=3).astype(F)
    mean, var = rng.normal(size=3).astype(F), np.abs(rng.normal(size=3)).astype(F)
    attrs = {"epsilon": 1e-3, "is_training": False}
    ours = run("fused_batch_norm", [x, scale, offset, mean, var], attrs)
    theirs = R.FusedBatchNormV3(x=x, scale=scale, offset=offset, mean=mean, variance=var, epsilon=1e-3,
                                is_training=False)
    for o, t in zip(ours[:3], theirs[:3]):
        check(o, t, rtol=1e-5, atol=1e-5)
    dy = rng.normal(size=x.shape).astype(F)
    g_ours = run("fused_batch_norm_grad", [dy, x, scale, mean, var, ours[5]], attrs)
    g_tf = R.FusedBatchNormGradV3(y_backprop=dy, x=x, scale=scale, reserve_space_1=mean, reserve_space_2=var,
                                  reserve_space_3=theirs[5], epsilon=1e-3, is_training=False)
    for o, t in zip(g_ours[:3], g_tf[:3]):
        check(o, t, rtol=2e-5, atol=2e-5)


def test_softmax_family(rng):
    x = (rng.normal(size=(16, 10)) * 5).astype(F)
    check(run("softmax", [x])[0], R.Softmax(logits=x))
    check(run("log_softmax", [x])[0], R.LogSoftmax(logits=x), rtol=1e-6, atol=2e-6)
    labels = R.Softmax(logits=rng.normal(size=(16, 10)).astype(F)).numpy()
    ours = run("softmax_cross_entropy", [x, labels])
    theirs = R.SoftmaxCrossEntropyWithLogits(features=x, labels=labels)
    check(ours[0], theirs[0], rtol=1e-6, atol=2e-6)
    check(ours[1], theirs[1])
    sparse = rng.integers(0, 10, size=16).astype(np.int32)
    ours = run("sparse_softmax_cross_entropy", [x, sparse])
    theirs = R.SparseSoftmaxCrossEntropyWithLogits(features=x, labels=sparse)
    check(ours[0], theirs[0], rtol=1e-6, atol=2e-6)
    check(ours[1], theirs[1])
    check(run("l2_loss", [x])[0], R.L2Loss(t=x), rtol=1e-5)


@pytest.mark.parametrize("labels", [[0, 4, 1], [0, -1, 5], [-2, 3, -1]])
def test_sparse_xent_out_of_range_label_raises_what_tfs_cpu_kernel_raises(rng, labels):
    x = rng.normal(size=(3, 4)).astype(F)
    labels = np.array(labels, np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError) as theirs:
        R.SparseSoftmaxCrossEntropyWithLogits(features=x, labels=labels)
    with pytest.raises(KernelInputError) as ours:
        run("sparse_softmax_cross_entropy", [x, labels])
    assert str(ours.value) == theirs.value.message.split("}} ", 1)[-1].split(" [Op:")[0]
