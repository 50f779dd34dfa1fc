"""Place a compiled program on the fabric: IR layer costs -> the pipelined placement model."""
from __future__ import annotations

from cerebras_tf import ir
from cerebras_tf.ir import costs
from cerebras_tf.wse.fabric import Fabric
from cerebras_tf.wse.placement import LayerCost, PlacementReport, place


def input_bytes_per_sample(program: ir.Program) -> float:
    """Bytes the input workers send to the wafer per sample (features and labels)."""
    tensors = [program.tensors[tid] for tid in program.inputs.values()]
    if not tensors:
        return 0.0
    batch = max(int(tensors[0].shape[0]), 1) if tensors[0].shape else 1
    return sum(costs.tensor_bytes(t) for t in tensors) / batch


def place_program(program: ir.Program, fabric: Fabric) -> PlacementReport | None:
    """Size and place every layer of `program` on `fabric` (None for a program with no layers).

    Raises FabricCapacityError when the model does not fit on-chip.
    """
    layers = [LayerCost(**entry) for entry in costs.layer_costs(program)]
    if not layers:
        return None
    return place(
        layers,
        fabric,
        precision="half" if program.precision_casts else "single",
        training=program.mode == "train",
        input_bytes_per_sample=input_bytes_per_sample(program),
    )
