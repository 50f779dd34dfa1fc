"""Raw-op coverage beyond the zoo: einsum attention with a causal band mask, depthwise conv, sigmoid/softplus,
RMSProp and Adagrad; and the embedding + sparse-optimizer case, refused with its fix and compiling once fixed."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig
from cerebras_tf.errors import UnsupportedOpError


def _input_fn(params):
    x = np.linspace(-1.0, 1.0, 16 * 6 * 6 * 2, dtype=np.float32).reshape(16, 6, 6, 2)
    y = (np.arange(16) % 3).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(4, drop_remainder=True)


def _raw_ops_model_fn(features, labels, mode, params):
    depthwise = tf.compat.v1.get_variable("depthwise", [3, 3, 2, 2])
    features = features * tf.compat.v1.get_variable("scale", [], initializer=tf.compat.v1.ones_initializer())
    # scaled by a variable: the conv's input gradient is then needed (and compiled)
    x = tf.nn.depthwise_conv2d(features, depthwise, strides=[1, 1, 1, 1], padding="SAME")  # [4, 6, 6, 4]
    x = tf.nn.sigmoid(x) + tf.nn.softplus(x)
    seq = tf.reshape(x, [4, 36, 4])
    scores = tf.einsum("bqd,bkd->bqk", seq, seq)
    causal = tf.linalg.band_part(tf.ones([36, 36]), -1, 0)  # folded: a constant
    probs = tf.nn.softmax(tf.linalg.band_part(scores, -1, 0) - 1e4 * (1.0 - causal))
    context = tf.einsum("bqk,bkd->bqd", probs, seq)
    logits = tf.compat.v1.layers.dense(tf.reshape(context, [4, -1]), 3, name="logits")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf.compat.v1.train.get_global_step()
    optimizer = {"rmsprop": tf.compat.v1.train.RMSPropOptimizer(0.01, momentum=0.9),
                 "adagrad": tf.compat.v1.train.AdagradOptimizer(0.1)}[params["optimizer"]]
    return CSEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(loss, global_step=step))


@pytest.mark.parametrize("optimizer,update", [("rmsprop", "apply_rms_prop"), ("adagrad", "apply_adagrad")])
def test_raw_ops_and_more_optimizers_compile(tmp_path, optimizer, update):
    est = CerebrasEstimator(_raw_ops_model_fn, model_dir=str(tmp_path), params={"optimizer": optimizer},
                            config=CSRunConfig(cs_ip="localhost:9000"))
    counts = est.compile(_input_fn).kernel_counts
    for kind in ("depthwise_conv2d", "depthwise_conv2d_backprop_input", "depthwise_conv2d_backprop_filter",
                 "einsum", "band_part", "sigmoid", "sigmoid_grad", "softplus", update):
        assert counts.get(kind), kind


def _embedding_model_fn(features, labels, mode, params):
    table = tf.compat.v1.get_variable("embedding", [10, 4])
    ids = tf.cast(tf.abs(features[:, :, 0, 0]) * 9.0, tf.int32)  # [4, 6] token ids
    logits = tf.compat.v1.layers.dense(tf.reduce_mean(tf.gather(table, ids), axis=1), 3, name="logits")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf.compat.v1.train.get_global_step()
    optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
    grads_and_vars = optimizer.compute_gradients(loss)
    if params["densify"]:
        grads_and_vars = [(tf.convert_to_tensor(g), v) for g, v in grads_and_vars]
    return CSEstimatorSpec(mode, loss=loss, train_op=optimizer.apply_gradients(grads_and_vars, step))


def test_sparse_embedding_gradient_is_refused_with_the_fix_and_compiles_densified(tmp_path):
    sparse = CerebrasEstimator(_embedding_model_fn, model_dir=str(tmp_path / "a"), params={"densify": False},
                               config=CSRunConfig(cs_ip="localhost:9000"))
    with pytest.raises(UnsupportedOpError) as info:
        sparse.compile(_input_fn, validate_only=True)
    assert "'Unique'" in str(info.value) and "tf.convert_to_tensor(g)" in str(info.value)
    assert f"{__file__}:" in str(info.value)

    dense = CerebrasEstimator(_embedding_model_fn, model_dir=str(tmp_path / "b"), params={"densify": True},
                              config=CSRunConfig(cs_ip="localhost:9000"))
    counts = dense.compile(_input_fn).kernel_counts
    assert counts["gather_variable"] == 1 and counts["unsorted_segment_sum"] == 1 and counts["apply_adam"] == 3


def _keras_model_fn(features, labels, mode, params):
    hidden = tf.keras.layers.Dense(8, activation="relu", name="hidden")(tf.reshape(features, [4, -1]))
    logits = tf.keras.layers.Dense(3, name="logits")(hidden)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    updates = tf.keras.optimizers.legacy.Adam(1e-3).get_updates(loss, tf.compat.v1.trainable_variables())
    with tf.control_dependencies(updates):
        train_op = tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1)
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


def test_keras_optimizer_in_graph_mode_compiles_with_its_slots(tmp_path):
    est = CerebrasEstimator(_keras_model_fn, model_dir=str(tmp_path), config=CSRunConfig(cs_ip="localhost:9000"))
    program = est.compile(_input_fn).program
    assert program.kernel_counts()["apply_adam"] == 4
    roles = {v.name: (v.role, v.slot_of) for v in program.variables}
    assert roles["Adam/hidden/kernel/m"] == ("optimizer_state", "hidden/kernel")
    assert roles["Adam/iter"] == ("optimizer_state", None)
    assert roles["Adam/learning_rate"][0] == "state"  # a hyperparameter held in a variable, never written
    assert [k.role for k in program.kernels].count("global_step_update") == 1
