"""Issue 24 item 7: an index out of range raises what TF's CPU kernel raises (InvalidArgumentError, its message)
in every index-taking kernel: gather (GatherV2, embedding lookups on tensors, batch gathers), gather_variable
(ResourceGather, embedding lookups on variables), scatter_add_variable (ResourceScatterAdd, the SGD update
of a gather's gradient), unsorted_segment_sum (UnsortedSegmentSum, how a gather's gradient is densified;
negative ids are dropped, as TF does) and sparse_apply_momentum (ResourceSparseApplyMomentum). numpy would
wrap a negative index around and raise a bare IndexError for a large one. one_hot takes any index (TF's
OneHot gives an all-off row), see test_reduce_data.test_one_hot."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from kernel_helpers import check, run

from cerebras_tf.wse.kernels import KernelInputError

R = tf.raw_ops
F = np.float32


def tf_message(error: tf.errors.InvalidArgumentError) -> str:
    """TF's words alone: without the "{{function_node ...}} " prefix and the " [Op:...]" suffix."""
    return error.message.split("}} ", 1)[-1].split(" [Op:")[0]


def same_refusal(ours, theirs) -> str:
    """ours() raises KernelInputError and theirs() InvalidArgumentError, with the same words; returns them."""
    with pytest.raises(tf.errors.InvalidArgumentError) as tf_error:
        theirs()
    with pytest.raises(KernelInputError) as our_error:
        ours()
    assert str(our_error.value) == tf_message(tf_error.value)
    return str(our_error.value)


BAD_GATHERS = [  # params shape, indices, axis, batch_dims, TF's message
    ((5, 3), [0, 7, 2], 0, 0, "indices[1] = 7 is not in [0, 5)"),
    ((5, 3), [0, -1, 9], 0, 0, "indices[1] = -1 is not in [0, 5)"),
    ((5, 3), [[0, 1, 2], [3, 4, 5]], 0, 0, "indices[1,2] = 5 is not in [0, 5)"),
    ((5, 3), [[0, 9, 2], [3, -1, 7]], 0, 0, "indices[0,1] = 9 is not in [0, 5)"),  # the first in row-major order
    ((5, 3), 5, 0, 0, "indices = 5 is not in [0, 5)"),  # a scalar index
    ((5, 3), [[0, 1], [2, 3]], 1, 0, "indices[1,1] = 3 is not in [0, 3)"),
    ((5, 3), [[0, -3], [2, 1]], -1, 0, "indices[0,1] = -3 is not in [0, 3)"),
    ((2, 3, 4), [[0, 1], [2, 3]], 1, 1, "indices[1,1] = 3 is not in [0, 3)"),  # batch gather
    ((2, 3, 4), [[0, 1], [-1, 2]], 2, 1, "indices[1,0] = -1 is not in [0, 4)"),
    ((2, 3, 4), [[[0], [1], [2]], [[3], [4], [1]]], 2, 2, "indices[1,1,0] = 4 is not in [0, 4)"),
    ((0, 3), [0], 0, 0, "indices[0] = 0 is not in [0, 0)"),
]


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("pshape,indices,axis,bd,message", BAD_GATHERS)
def test_gather_out_of_range_raises_what_tfs_cpu_kernel_raises(pshape, indices, axis, bd, message, index_dtype,
                                                                rng):
    params = rng.normal(size=pshape).astype(F)
    idx = np.array(indices, index_dtype)
    with tf.device("/CPU:0"):
        assert same_refusal(lambda: run("gather", [params, idx], {"axis": axis, "batch_dims": bd}),
                            lambda: R.GatherV2(params=params, indices=idx, axis=axis, batch_dims=bd)) == message


@pytest.mark.parametrize("indices,message", [([0, 7, 2], "indices[1] = 7 is not in [0, 5)"),
                                             ([[0, 1], [-1, 2]], "indices[1,0] = -1 is not in [0, 5)"),
                                             ([[0, 1], [5, 0]], "indices[1,0] = 5 is not in [0, 5)")])
def test_gather_variable_out_of_range_raises_what_tfs_cpu_kernel_raises(indices, message, rng):
    table = rng.normal(size=(5, 3)).astype(F)
    idx = np.array(indices, np.int32)
    with tf.device("/CPU:0"):
        variable = tf.Variable(table)
        assert same_refusal(lambda: run("gather_variable", [idx], {"batch_dims": 0}, variables=[table]),
                            lambda: R.ResourceGather(resource=variable.handle, indices=idx, dtype=tf.float32)) \
            == message


@pytest.mark.parametrize("indices,message", [([0, 7, 1], "indices[1] = 7 is not in [0, 5)"),
                                             ([0, -1, 1], "indices[1] = -1 is not in [0, 5)"),
                                             ([[0, 8], [9, 1]], "indices[0,1] = 8 is not in [0, 5)")])
def test_scatter_add_out_of_range_raises_what_tf_raises_and_writes_nothing(indices, message, rng):
    """(TF's CPU kernel adds the rows before the first bad index; ours refuses before writing any: the run stops
    at this step either way and the step is not saved.)"""
    init = rng.normal(size=(5, 2)).astype(F)
    ours = init.copy()
    idx = np.array(indices, np.int32)
    updates = np.ones(idx.shape + (2,), F)
    with tf.device("/CPU:0"):
        variable = tf.Variable(init)
        assert same_refusal(lambda: run("scatter_add_variable", [idx, updates], variables=[ours]),
                            lambda: R.ResourceScatterAdd(resource=variable.handle, indices=idx, updates=updates)) \
            == message
    np.testing.assert_array_equal(ours, init)


@pytest.mark.parametrize("ids,message", [([0, 1, 7, 2], "segment_ids[2] = 7 is out of range [0, 5)"),
                                         ([[0, -1], [9, 5]], "segment_ids[1,0] = 9 is out of range [0, 5)"),
                                         ([[-4, 5], [1, 2]], "segment_ids[0,1] = 5 is out of range [0, 5)")])
def test_unsorted_segment_sum_id_too_large_raises_what_tfs_cpu_kernel_raises(ids, message, rng):
    segment_ids = np.array(ids, np.int64)
    data = rng.normal(size=segment_ids.shape + (3,)).astype(F)
    with tf.device("/CPU:0"):
        assert same_refusal(lambda: run("unsorted_segment_sum", [data, segment_ids], {"num_segments": 5}),
                            lambda: R.UnsortedSegmentSum(data=data, segment_ids=segment_ids, num_segments=5)) \
            == message


def test_unsorted_segment_sum_drops_negative_ids_as_tf_does(rng):
    data = rng.normal(size=(4, 3)).astype(F)
    ids = np.array([0, -1, -7, 4], np.int32)
    check(run("unsorted_segment_sum", [data, ids], {"num_segments": 5})[0],
          R.UnsortedSegmentSum(data=data, segment_ids=ids, num_segments=5))


@pytest.mark.parametrize("indices,message", [([0, 7, 1], "Index 7 at offset 1 in indices is out of range"),
                                             ([0, -1, 1], "Index -1 at offset 1 in indices is out of range"),
                                             ([0, 1, 5], "Index 5 at offset 2 in indices is out of range")])
def test_sparse_apply_momentum_out_of_range_raises_what_tf_raises_and_writes_nothing(indices, message, rng):
    init = rng.normal(size=(5, 2)).astype(F)
    var, accum = init.copy(), np.zeros_like(init)
    idx = np.array(indices, np.int32)
    grad = np.ones((3, 2), F)
    with tf.device("/CPU:0"):
        tf_var, tf_accum = tf.Variable(init), tf.Variable(np.zeros_like(init))
        assert same_refusal(
            lambda: run("sparse_apply_momentum", [F(0.1), grad, idx, F(0.9)], variables=[var, accum]),
            lambda: R.ResourceSparseApplyMomentum(var=tf_var.handle, accum=tf_accum.handle, lr=F(0.1), grad=grad,
                                                  indices=idx, momentum=F(0.9))) == message
    np.testing.assert_array_equal(var, init)
    assert not accum.any()


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_in_range_indices_at_both_ends_are_gathered_as_tf_gathers(index_dtype, rng):
    """The check's edges: 0 and rows - 1 are in range, for every kernel (and the results are TF's)."""
    params = rng.normal(size=(6, 3)).astype(F)
    idx = np.array([[5, 0], [0, 5]], index_dtype)
    check(run("gather", [params, idx], {"axis": 0, "batch_dims": 0})[0],
          R.GatherV2(params=params, indices=idx, axis=0))
    check(run("gather", [params, idx[:, :1] % 3], {"axis": 1, "batch_dims": 0})[0],
          R.GatherV2(params=params, indices=idx[:, :1] % 3, axis=1))
    check(run("gather_variable", [idx], {"batch_dims": 0}, variables=[params])[0],
          R.GatherV2(params=params, indices=idx, axis=0))
    data = rng.normal(size=(2, 2, 3)).astype(F)
    check(run("unsorted_segment_sum", [data, idx], {"num_segments": 6})[0],
          R.UnsortedSegmentSum(data=data, segment_ids=idx, num_segments=6))
    ours, variable = params.copy(), tf.Variable(params)
    run("scatter_add_variable", [idx, data], variables=[ours])
    R.ResourceScatterAdd(resource=variable.handle, indices=idx, updates=data)
    check(ours, variable.numpy())


# ---- in a tf.cond branch not taken this step (check=False): TF never runs the op, so nothing is refused --------

@pytest.mark.parametrize("pshape,indices,axis,bd,message", BAD_GATHERS)
def test_an_unchecked_gather_refuses_nothing_and_gives_tfs_shape(pshape, indices, axis, bd, message, rng):
    """(Its result is discarded by the if-converted cond's select: only its shape matters, and that it runs.)"""
    params = rng.normal(size=pshape).astype(F)
    idx = np.array(indices, np.int32)
    a = axis % len(pshape)
    rows = max(pshape[a], 1)  # TF's shape for ids in range (of a table with a row, where it has none)
    tf_shape = R.GatherV2(params=np.ones(pshape[:a] + (rows,) + pshape[a + 1:], F), indices=np.clip(idx, 0, rows - 1),
                          axis=axis, batch_dims=bd).shape
    out = run("gather", [params, idx], {"axis": axis, "batch_dims": bd}, check=False)[0]
    assert out.shape == tuple(tf_shape) and out.dtype == params.dtype


@pytest.mark.parametrize("kind", ["gather", "gather_variable"])
def test_an_unchecked_gather_of_ids_in_range_is_tfs_gather(kind, rng):
    params = rng.normal(size=(6, 3)).astype(F)
    idx = np.array([[5, 0], [2, 3]], np.int32)
    inputs, variables = ([params, idx], None) if kind == "gather" else ([idx], [params])
    check(run(kind, inputs, {"axis": 0, "batch_dims": 0}, variables=variables, check=False)[0],
          R.GatherV2(params=params, indices=idx, axis=0))


def test_an_unchecked_gather_variable_refuses_nothing(rng):
    table = rng.normal(size=(5, 3)).astype(F)
    out = run("gather_variable", [np.array([[0, 7], [-1, 4]], np.int32)], {"batch_dims": 0}, variables=[table],
              check=False)[0]
    assert out.shape == (2, 2, 3)
    np.testing.assert_array_equal(out[0, 0], table[0])
    np.testing.assert_array_equal(out[1, 1], table[4])


def test_an_unchecked_unsorted_segment_sum_drops_ids_too_large_as_tf_drops_negative_ones(rng):
    data = rng.normal(size=(5, 3)).astype(F)
    ids = np.array([0, 7, -1, 4, 5], np.int32)
    check(run("unsorted_segment_sum", [data, ids], {"num_segments": 5}, check=False)[0],
          R.UnsortedSegmentSum(data=data, segment_ids=np.where(ids >= 5, -1, ids), num_segments=5))


def test_an_unchecked_sparse_softmax_gives_tfs_rows_for_labels_in_range_and_zeros_for_the_others(rng):
    logits = rng.normal(size=(4, 3)).astype(F)
    labels = np.array([2, 7, -3, 0], np.int32)
    loss, grad = run("sparse_softmax_cross_entropy", [logits, labels], check=False)
    good = np.array([0, 3])
    tf_loss, tf_grad = R.SparseSoftmaxCrossEntropyWithLogits(features=logits[good], labels=labels[good])
    check(loss[good], tf_loss)
    check(grad[good], tf_grad)
    assert not loss[1:3].any() and not grad[1:3].any()
