"""Per-layer costs from the IR, the placement model's input."""
from __future__ import annotations

import pytest

from cerebras_tf.ir.costs import layer_costs
from cerebras_tf.wse.placement import LayerCost
from examples.zoo import mlp, transformer


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


def test_a_layer_streams_a_sample_as_its_vectors(zoo_estimator):
    """The pipelined memory model's stream rows: the MLP's layers send one vector per sample; the transformer's
    layers (which work on [batch * seq, hidden]) send at least seq_length vectors (a token's, or a head's row of
    attention scores)."""
    mlp_costs = layer_costs(zoo_estimator("mlp").compile(mlp.input_fn).program)
    assert {c["stream_rows"] for c in mlp_costs} == {1}
    params = {**transformer.DEFAULT_PARAMS, "seq_length": 8}
    program = zoo_estimator("transformer", params=params).compile(transformer.input_fn).program
    rows = {c["name"]: c["stream_rows"] for c in layer_costs(program)}
    encoder = [name for name in rows if name.startswith("layer_0/")]
    assert len(encoder) == 8 and all(rows[name] >= 8 for name in encoder), rows
    assert rows["layer_0/ffn/output"] == 8 and rows["layer_0/attention/key"] == 8 * 2  # [batch, heads, seq, seq]


def test_stream_rows_counts_the_vectors_of_one_sample():
    from cerebras_tf.ir.costs import stream_rows
    from cerebras_tf.ir.program import Tensor

    def rows(shape: list[int], batch: int = 4) -> int:
        return stream_rows(Tensor(id=0, shape=shape, dtype="float32", name="t"), batch)

    assert rows([4, 16, 64]) == 16 and rows([4 * 16, 64]) == 16  # tokens, laid out either way
    assert rows([4, 8, 8, 3]) == 64  # pixels
    assert rows([4, 10]) == 1 and rows([]) == 1 and rows([2, 5]) == 1  # flat; not per sample
