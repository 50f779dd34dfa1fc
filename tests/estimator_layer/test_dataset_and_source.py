"""Dataset introspection and user-source locations."""
from __future__ import annotations

import os
import re
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from estimator import inspect_dataset
from estimator.dataset import INFINITE
from estimator.source import function_location, is_user_file, user_frame

THIS_FILE = os.path.abspath(__file__)


def _line_of(marker: str) -> int:
    with open(THIS_FILE) as handle:
        return next(i for i, line in enumerate(handle, 1) if marker in line and "_line_of" not in line)


def _build(seed=None, graph_seed=None, repeat=None, drop_remainder=True):
    graph = tf.Graph()
    with graph.as_default():
        if graph_seed is not None:
            tf.compat.v1.set_random_seed(graph_seed)
        ds = tf.data.Dataset.from_tensor_slices(np.zeros((10, 3), np.float32))
        ds = ds.shuffle(10, seed=seed)  # marker: shuffle
        ds = ds.repeat(repeat) if repeat != 0 else ds
        ds = ds.batch(4, drop_remainder=drop_remainder)  # marker: batch
        return inspect_dataset(ds)


def test_infinite_repeat_static_batch_and_locations():
    info = _build()
    assert info.cardinality == INFINITE and info.repeats_forever
    assert info.element_spec.shape.as_list() == [4, 3]
    assert [op.type for op in info.batch_ops] == ["BatchDatasetV2"]
    assert info.batch_ops[0].location == f"{THIS_FILE}:{_line_of('# marker: batch')}"
    assert info.shuffles[0].location == f"{THIS_FILE}:{_line_of('# marker: shuffle')}"


def test_finite_or_missing_repeat_is_visible():
    assert _build(repeat=3).cardinality == 3 * 10 // 4
    assert not _build(repeat=0).repeats_forever
    assert _build(repeat=0, drop_remainder=False).element_spec.shape.as_list() == [None, 3]


def test_shuffle_seed_is_deterministic_with_an_op_or_graph_seed_only():
    assert not _build().shuffles[0].deterministic
    assert _build(seed=5).shuffles[0].deterministic
    assert _build(graph_seed=3).shuffles[0].deterministic


def test_user_frames_skip_installed_packages_and_our_layers():
    assert is_user_file(THIS_FILE)
    assert not is_user_file(tf.__file__)
    assert not is_user_file(inspect_dataset.__code__.co_filename)
    assert not is_user_file("<frozen importlib._bootstrap>")
    here = user_frame(traceback.extract_stack())
    assert here is not None and here.startswith(THIS_FILE + ":")


def test_function_location_names_the_def_line():
    def input_fn(params):  # marker: def
        return params

    assert function_location(input_fn) == f"{THIS_FILE}:{_line_of('# marker: def')}"


def test_the_functions_a_pipeline_runs_are_listed_with_their_op_types_nested_calls_included():
    graph = tf.Graph()
    with graph.as_default():
        ds = tf.data.Dataset.range(8).map(lambda i: tf.py_function(lambda v: v, [i], tf.int64))  # marker: py map
        ds = ds.interleave(lambda i: tf.data.Dataset.from_tensors(i).map(lambda j: j * 2))
        info = inspect_dataset(ds.batch(2))
    by_type = {function.transformation.type: function for function in info.functions}
    assert set(by_type) == {"MapDataset", "InterleaveDataset"}
    assert "EagerPyFunc" in by_type["MapDataset"].op_types
    assert by_type["MapDataset"].transformation.location == f"{THIS_FILE}:{_line_of('# marker: py map')}"
    assert {"MapDataset", "Mul"} <= by_type["InterleaveDataset"].op_types  # the map inside the interleave body
    assert _build().functions == ()


def test_a_failing_node_named_by_a_tf_error_is_found_in_an_eager_dataset():
    from estimator.dataset import failing_op_location

    def check(i):
        tf.debugging.assert_less(i, tf.constant(4, tf.int64), message="too big")  # marker: failing op
        return i

    dataset = tf.data.Dataset.range(8).map(check).batch(2)
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        list(dataset)
    nodes = re.findall(r"\{\{node ([^}]+)\}\}", info.value.message)
    assert failing_op_location(dataset, nodes) == f"{THIS_FILE}:{_line_of('# marker: failing op')}"
    assert failing_op_location(dataset, []) is None and failing_op_location(dataset, ["no_such_node"]) is None
