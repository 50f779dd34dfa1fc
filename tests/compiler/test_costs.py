"""Per-layer costs from the IR, the placement model's input."""
from __future__ import annotations

import pytest

from cerebras_tf.ir.costs import layer_costs
from cerebras_tf.wse.placement import LayerCost
from examples.zoo import mlp


def test_layer_costs_of_the_mlp(zoo_estimator):
    program = zoo_estimator("mlp").compile(mlp.input_fn).program
    costs = {c["name"]: c for c in layer_costs(program)}
    dense1 = costs["dense1"]
    assert dense1["weight_bytes"] == (20 * 32 + 32) * 4
    assert dense1["optimizer_state_bytes"] >= 2 * (20 * 32 + 32) * 4  # Adam's m and v
    assert sum(c["optimizer_state_bytes"] for c in costs.values()) == 4 * sum(
        v.size for v in program.variables if v.role == "optimizer_state")  # incl. Adam's beta powers, once
    assert sum(c["weight_bytes"] for c in costs.values()) == 4 * sum(
        v.size for v in program.variables if v.role == "trainable")
    assert dense1["flops_fwd"] >= 2 * 20 * 32  # the matmul, per sample
    assert dense1["flops_bwd"] >= 2 * 20 * 32  # the weight gradient (nothing needs the features' gradient)
    assert dense1["activation_bytes"] > 0
    # Each layer's float32 activations go only to the next layer's cast to half: they cross at half width.
    assert [costs[name]["output_bytes"] for name in ("dense1", "dense2", "dense3")] == [32 * 2, 24 * 2, 16 * 2]
    total = sum(c["flops_fwd"] + c["flops_bwd"] + c["flops_update"] for c in costs.values())
    assert total == pytest.approx(sum(k.flops for k in program.kernels) / 8)
    assert [LayerCost(**c).name for c in costs.values()] == [layer.name for layer in program.layers]
