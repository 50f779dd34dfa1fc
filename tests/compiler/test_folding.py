"""Folding: shape math, splats and tf.cond on static predicates leave only static, lean kernels."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from estimator import EstimatorSpec, ModeKeys
from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig
from cerebras_tf.compiler import compile_model, fold
from cerebras_tf.errors import DynamicShapeError
from cerebras_tf.precheck import precheck
from estimator import CapturedInput, CapturedModel


def _input_fn(params):
    x = np.linspace(-1.0, 1.0, 16 * 6, dtype=np.float32).reshape(16, 6)
    y = (np.arange(16) % 3).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(4, drop_remainder=True)


def _model_fn(features, labels, mode, params):
    x = tf.compat.v1.layers.dense(features, 6, name="hidden")
    batch = tf.shape(x)[0]
    x = tf.reshape(x, tf.stack([batch, 2, -1]))  # a Reshape of computed shape math
    x = x + tf.zeros_like(x) + tf.fill(tf.shape(x), 0.5)  # splats
    x = tf.reshape(x, [batch, -1])
    x = tf.cond(tf.reduce_sum(x) > 0.0, lambda: x * 2.0, lambda: x - 1.0)  # data-dependent: if-converted
    x = tf.cond(tf.constant(True), lambda: x, lambda: x * 0.0)  # static predicate: folded away
    logits = tf.compat.v1.layers.dense(x, 3, name="logits")
    predictions = {"classes": tf.argmax(logits, axis=-1)}
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions=predictions)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf.compat.v1.train.get_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op, predictions=predictions)


def _estimator(tmp_path):
    return CerebrasEstimator(_model_fn, model_dir=str(tmp_path), config=CSRunConfig(cs_ip="localhost:9000"))


def test_shape_math_folds_to_static_attrs_and_splats(tmp_path):
    program = _estimator(tmp_path).compile(_input_fn).program
    tf_types = {k.tf_type for k in program.kernels if k.kind != "gradient_seed"}  # the seed is a Fill
    assert not tf_types & {"Shape", "StridedSlice", "Pack", "ZerosLike", "Fill", "BroadcastGradientArgs"}
    reshapes = [k.attrs["shape"] for k in program.kernels if k.kind == "reshape" and k.role == "forward"]
    assert [4, 2, 3] in reshapes and [4, 6] in reshapes
    splats = {(t.const.splat, tuple(t.shape)) for t in program.tensors if t.const and t.const.splat is not None}
    assert (0.5, (4, 2, 3)) in splats and (0.0, (4, 2, 3)) in splats  # never materialised arrays
    assert not program.arrays
    selects = [k for k in program.kernels if k.kind == "select"]
    assert len([k for k in selects if k.role == "forward"]) == 1  # one if-converted cond, one folded away
    assert program.kernel_counts()["apply_gradient_descent"] == 4


def test_predict_program_outputs_predictions(tmp_path):
    model = precheck(_estimator(tmp_path), _input_fn, ModeKeys.PREDICT)
    program = compile_model(model).program
    assert set(program.outputs) == {"predictions/classes"}
    assert set(program.inputs) == {"features"}
    assert program.tensors[program.outputs["predictions/classes"]].dtype == "int64"
    assert not any(k.kind.startswith("apply_") for k in program.kernels)


def test_splat_detection():
    assert fold.as_splat(np.full((3, 2), 7, np.int32)) == fold.Splat(7, (3, 2), np.dtype(np.int32))
    assert fold.as_splat(np.arange(4)) is None and fold.as_splat(np.ones(1)) is None


def test_splat_detection_of_large_arrays_looks_past_the_first_elements():
    late = np.zeros((100, 100), np.float32)
    late[-1, -1] = 1  # differs only after the elements checked first
    assert fold.as_splat(late) is None
    assert fold.as_splat(np.tril(np.ones((64, 64)))) is None  # a mask: differs early
    assert fold.as_splat(np.zeros((100, 100), np.float32)) == fold.Splat(0.0, (100, 100), np.dtype(np.float32))
    nans = fold.as_splat(np.full((100, 100), np.nan))
    assert nans is not None and np.isnan(nans.value) and nans.shape == (100, 100)
    mostly_nan = np.full((100, 100), np.nan)
    mostly_nan[-1, -1] = 0
    assert fold.as_splat(mostly_nan) is None
    strided = np.zeros((100, 200), np.int32)
    strided[-1, -2] = 1  # the last element of a strided view
    assert fold.as_splat(strided[:, ::2]) is None
    assert fold.as_splat(strided[:, 1::2]) == fold.Splat(0, (100, 100), np.dtype(np.int32))


def test_a_dimension_still_dynamic_after_folding_fails_naming_it():
    graph = tf.Graph()
    with graph.as_default():
        features = tf.compat.v1.placeholder(tf.float32, [4, None], name="features")
        spec = EstimatorSpec("infer", predictions={"y": tf.nn.relu(features)})
    model = CapturedModel(CapturedInput(graph, "infer", None, None), features, None, spec)
    with pytest.raises(DynamicShapeError) as info:
        compile_model(model, validate_only=True)
    assert "features" in str(info.value) and "(4, None)" in str(info.value)
    assert "drop_remainder=True" in str(info.value)


def test_folding_runs_the_constant_subgraph_as_written_and_gets_tensorflows_values():
    """The folder's session turns TF's graph optimizers off (they only re-folded the all-constant subgraph,
    at great cost on large models); the values are still exactly those a default session computes."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 64], name="x")
        mask = tf.linalg.band_part(tf.ones([64, 64]), -1, 0)  # an attention mask, as GPT's
        scale = tf.math.rsqrt(tf.cast(64, tf.float32)) * tf.constant(np.linspace(0.1, 3.0, 64, dtype=np.float32))
        folded = [1e4 * (mask - 1.0) * scale, tf.tile(tf.range(5) * 3, [4]), tf.math.exp(scale) / 7.0]
        uses = [x + folded[0][:4], folded[2] * x]
    ops = sorted({op for t in uses + folded for op in _ancestors(t.op)}, key=lambda op: op._id)
    folder = fold.Folder(ops)
    assert all(folder.is_const(t) for t in folded) and not folder.is_const(uses[0])
    folder.evaluate(folded)
    with tf.compat.v1.Session(graph=graph) as session:  # default config: grappler and the graph optimizer on
        expected = session.run(folded)
    for tensor, value in zip(folded, expected):
        got = folder.value(tensor)
        got = got.materialise() if isinstance(got, fold.Splat) else got
        assert got.dtype == value.dtype and np.array_equal(got, value), tensor.name
    config = fold.literal_session_config()
    assert config.graph_options.rewrite_options.disable_meta_optimizer
    assert not config.graph_options.optimizer_options.do_constant_folding


def _ancestors(op):
    seen, stack = set(), [op]
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend(t.op for t in op.inputs)
    return seen


def test_large_folded_values_are_fetched_one_by_one_and_equal_ones_shared(monkeypatch):
    """Large values (a causal mask tiled over the batch, in every decoder layer) are fetched one at a
    time and one equal to an earlier one is the same read-only array; every value is TF's."""
    monkeypatch.setattr(fold, "LARGE_VALUE_BYTES", 2 * 8 * 16 * 16)  # the float16 masks and more
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float16, [8, 1, 16, 16], name="x")
        masks = []
        for layer in range(3):
            causal = tf.linalg.band_part(tf.ones([16, 16]), -1, 0)
            if layer == 2:
                causal = tf.linalg.band_part(tf.ones([16, 16]), 0, -1)  # a different mask
            tiled = tf.tile(causal[tf.newaxis, tf.newaxis], [8, 1, 1, 1])
            masks.append(tf.cast((1.0 - tiled) * -1e4, tf.float16))
        nans = [tf.where(tf.tile(causal[tf.newaxis, tf.newaxis], [8, 1, 1, 1]) > 0.5, np.float32(np.nan), 1.0)
                for _ in range(2)]
        small = tf.reduce_sum(tf.reshape(tf.range(15.0), [3, 5]), axis=0)
        folded = masks + nans + [small]
        uses = [x + m for m in masks] + [x + tf.cast(n, tf.float16) for n in nans] + [small * 2.0]
    ops = sorted({op for t in uses + folded for op in _ancestors(t.op)}, key=lambda op: op._id)
    folder = fold.Folder(ops)
    folder.evaluate(folded)
    with tf.compat.v1.Session(graph=graph) as session:
        expected = session.run(folded)
    values = [folder.value(t) for t in folded]
    for got, value in zip(values, expected):
        assert got.dtype == value.dtype and np.array_equal(got, value, equal_nan=True)
    assert values[0] is values[1] and values[2] is not values[0] and not values[0].flags.writeable
    assert values[3] is values[4]  # NaNs compare equal here
    assert values[5].flags.writeable  # small values are not shared


def test_splats_feed_the_folded_subgraph_as_one_value_and_a_shape():
    """A known splat (ones, zeros_like, fill) that the constant subgraph reads is fed as a Const holding one
    value and the shape (TF repeats it), not every element: GPT-NeoX 20B's 44 rotary attention layers fed
    ones(2048, 2048) float32 to a band_part as 740 MB of the 748 MB folded graph. The values are TF's."""
    graph = tf.Graph()
    with graph.as_default():
        empty = tf.compat.v1.placeholder(tf.float32, [0, 5], name="empty")
        folded = [
            tf.linalg.band_part(tf.ones([256, 256]), -1, 0) * 3.0,  # the causal mask of a rotary layer
            tf.linalg.band_part(tf.ones([256, 256], tf.float16), -1, 0) - 2.0,
            tf.linalg.band_part(tf.fill([128, 256], tf.constant(1.5, tf.bfloat16)), 0, -1) * 2.0,
            tf.math.logical_not(tf.fill([128, 128], True)),
            tf.linalg.band_part(tf.fill([64, 64], np.float32(np.nan)), -1, 0) + 1.0,
            tf.cumsum(tf.fill([300, 4], tf.constant(-7, tf.int64)), axis=0),
            tf.reduce_sum(tf.zeros_like(empty) + 1.0),  # a splat with no elements
        ]
    ops = sorted({op for t in folded for op in _ancestors(t.op)}, key=lambda op: op._id)
    folder = fold.Folder(ops)
    assert all(folder.is_const(t) for t in folded)
    graph_def, _ = folder._constant_subgraph(folded)
    feeds = [node for node in graph_def.node if node.name.startswith("folded_input_")]
    assert any(len(node.attr["value"].tensor.tensor_shape.dim) == 2 for node in feeds)
    assert graph_def.ByteSize() < 16_384  # the 256x256 float32 ones alone are 262,144 bytes as elements
    folder.evaluate(folded)
    with tf.compat.v1.Session(graph=graph) as session:
        expected = session.run(folded, {empty: np.zeros([0, 5], np.float32)})
    for tensor, value in zip(folded, expected):
        got = folder.value(tensor)
        got = got.materialise() if isinstance(got, fold.Splat) else got
        assert got.dtype == value.dtype and got.shape == value.shape, tensor.name
        assert np.array_equal(got, value, equal_nan=True), tensor.name
