"""Lowering details: what the program keeps."""
from __future__ import annotations

from cerebras_tf.ir import WRITES
from examples.zoo import mlp


def test_kernels_nothing_uses_are_removed(zoo_estimator):
    """TF groups a MatMul's two gradients by control dependency, so it computes the features' gradient too;
    the program keeps only what feeds an output, a gradient or a variable write."""
    result = zoo_estimator("mlp").compile(mlp.input_fn)
    program = result.program
    features = program.inputs["features"]
    feature_shape = program.tensors[features].shape
    produced = [program.tensors[t].shape for k in program.kernels if k.role == "backward" for t in k.outputs]
    assert feature_shape not in produced  # no d(loss)/d(features)
    consumed = {t for k in program.kernels for t in k.inputs} | set(program.outputs.values())
    assert all(set(k.outputs) & consumed or k.kind in WRITES or k.kind == "gradient_seed" for k in program.kernels)
    assert [k.id for k in program.kernels] == list(range(len(program.kernels)))
    assert "unused kernels removed: " in result.report and "unused kernels removed: 0" not in result.report


def _sparse_classifier(features, labels, mode, params):
    import tensorflow as tf

    from cerebras_tf import CSEstimatorSpec

    logits = tf.compat.v1.layers.dense(features, 5, name="logits")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    step = tf.compat.v1.train.get_or_create_global_step()
    return CSEstimatorSpec(mode, loss=loss,
                           train_op=tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step))


def _sparse_input_fn(params):
    import numpy as np
    import tensorflow as tf

    x, y = np.ones((8, 3), np.float32), np.arange(8, dtype=np.int32) % 5
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(4, drop_remainder=True)


def test_tf_op_determinism_does_not_change_the_program(tmp_path):
    """TF_DETERMINISTIC_OPS (R1.7's GPT-3 sets it with tf_random_seed) swaps sparse softmax cross-entropy for
    a gather TF cannot differentiate at real sizes; the model is captured for the wafer without it, and the
    user's setting is back afterwards."""
    import tensorflow as tf
    from tensorflow.python.framework import config as tf_config

    from cerebras_tf import CerebrasEstimator, CSRunConfig

    def compile_() -> list[str]:
        estimator = CerebrasEstimator(_sparse_classifier, model_dir=str(tmp_path / "model"),
                                      config=CSRunConfig(cs_ip="localhost:9000"))
        return [kernel.kind for kernel in estimator.compile(_sparse_input_fn, validate_only=True).program.kernels]

    plain = compile_()
    tf.config.experimental.enable_op_determinism()
    try:
        deterministic = compile_()
        assert tf_config.is_op_determinism_enabled()
    finally:
        tf_config.disable_op_determinism()
    assert "sparse_softmax_cross_entropy" in deterministic and "gather" not in deterministic
    assert deterministic == plain
