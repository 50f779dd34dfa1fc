"""Lay a compiled program out on the fabric: IR layer costs -> the pipelined placement model, or the weight
streaming model (one layer at a time, weights from MemoryX)."""
from __future__ import annotations

from cerebras_tf import ir
from cerebras_tf.errors import ConfigError
from cerebras_tf.ir import costs
from cerebras_tf.wse.fabric import Fabric
from cerebras_tf.wse.placement import LayerCost, PlacementReport, place
from cerebras_tf.wse.streaming import StreamingReport, stream

PIPELINE = "pipeline"
WEIGHT_STREAMING = "weight_streaming"


def _batch(program: ir.Program) -> int:
    """Samples per step of one system: the leading dimension of the program's first input."""
    tensors = [program.tensors[tid] for tid in program.inputs.values()]
    return max(int(tensors[0].shape[0]), 1) if tensors and tensors[0].shape else 1


def input_bytes_per_sample(program: ir.Program) -> float:
    """Bytes the input workers send to the wafer per sample (features and labels)."""
    tensors = [program.tensors[tid] for tid in program.inputs.values()]
    return sum(costs.tensor_bytes(t) for t in tensors) / _batch(program) if tensors else 0.0


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


def stream_program(program: ir.Program, fabric: Fabric, num_systems: int = 1) -> StreamingReport | None:
    """Time one weight-streaming step of `program` on `num_systems` systems, each running the program's batch
    (the Model Zoo's batch_size is per system: the global batch is num_systems times it). None for a program
    with no layers. Raises FabricCapacityError when the batch's activations do not fit on the wafer or the
    weights and optimizer state in MemoryX, and ConfigError when several systems cannot train the program data
    parallel (ir.data_parallel_problem)."""
    problem = ir.data_parallel_problem(program) if num_systems > 1 and program.mode == "train" else None
    if problem is not None:
        raise ConfigError(f"cs_config num_csx={num_systems}: the simulated cluster cannot train this model data "
                          f"parallel: {problem}.",
                          fix="Train on one system (num_csx=1) over the same global batch, or compute the update "
                              "from the gradients alone.")
    layers = [LayerCost(**entry) for entry in costs.layer_costs(program)]
    if not layers:
        return None
    return stream(layers, fabric, batch_size=_batch(program) * num_systems, num_systems=num_systems,
                  precision="half" if program.precision_casts else "single", training=program.mode == "train")


def lay_out(program: ir.Program, fabric: Fabric, execution_strategy: str = PIPELINE,
            num_systems: int = 1) -> PlacementReport | StreamingReport | None:
    """The program's layout in `execution_strategy`: the pipelined placement or the weight streaming timing."""
    if execution_strategy == WEIGHT_STREAMING:
        return stream_program(program, fabric, num_systems)
    return place_program(program, fabric)
