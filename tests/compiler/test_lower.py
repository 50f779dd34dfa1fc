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
