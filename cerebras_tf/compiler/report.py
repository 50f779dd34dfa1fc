"""The human-readable compile report."""
from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

from cerebras_tf import ir


def render(program: ir.Program, stats: Mapping[str, Any], *, graph_hash: str, system: Mapping[str, Any],
           seconds: float) -> str:
    """A plain-text summary: what was folded, the kernels, variables, inputs/outputs and layers."""
    roles = Counter(k.role for k in program.kernels)
    variables = Counter(v.role for v in program.variables)
    params = sum(v.size for v in program.variables if v.role == "trainable")
    flops = sum(k.flops for k in program.kernels)
    lines = [
        "cerebras-tf compile report",
        f"  mode: {program.mode}    target system: {system.get('system_name') or '<none>'}"
        + (f" (fabric {_fabric_name(system['fabric'])})" if system.get("fabric") else ""),
        f"  graph hash: {graph_hash}",
        f"  compile time: {seconds:.2f} s",
        "",
        f"TF ops in the program: {stats['tf_ops']}; folded (static): {stats['folded_ops']}; "
        f"Identity/StopGradient removed: {stats['aliases_removed']}; runtime assertions dropped: "
        f"{stats['assertions_dropped']}; tf.cond if-converted: {stats['if_converted']}; "
        f"unused kernels removed: {stats.get('dead_kernels', 0)}",
        f"Kernels: {len(program.kernels)} (" + ", ".join(f"{r} {roles[r]}" for r in ir.ROLES if roles[r]) + ")",
        f"Precision casts inserted: {stats['precision_casts']} (matmul/conv inputs to the half dtype; "
        "float32 weights and accumulation)",
        f"Estimated work: {flops / 1e6:,.2f} MFLOP per step",
        f"Variables: {len(program.variables)} (" + ", ".join(f"{r} {variables[r]}" for r in ir.VARIABLE_ROLES
                                                               if variables[r]) + f"); {params:,} parameters",
        "",
        "Inputs:",
        *[f"  {name}: {_tensor(program, tid)}" for name, tid in program.inputs.items()],
        "Outputs:",
        *[f"  {name}: {_tensor(program, tid)}" for name, tid in program.outputs.items()],
        "",
        "Kernels by kind:",
        *[f"  {kind:<28} {count:>6}" for kind, count in program.kernel_counts().items()],
        "",
        "Layers (kernels, parameters, MFLOP/step):",
    ]
    sizes = {v.name: v.size for v in program.variables if v.role == "trainable"}
    for layer in program.layers:
        layer_flops = sum(program.kernels[k].flops for k in layer.kernels)
        layer_params = sum(sizes.get(v, 0) for v in layer.variables)
        lines.append(f"  {layer.name:<40} {len(layer.kernels):>6} {layer_params:>12,} {layer_flops / 1e6:>12,.2f}")
    return "\n".join(lines) + "\n"


def _tensor(program: ir.Program, tensor_id: int) -> str:
    tensor = program.tensors[tensor_id]
    return f"{tensor.dtype}{tensor.shape}"


def _fabric_name(fabric: Any) -> str:
    return str(fabric.get("name", fabric)) if isinstance(fabric, dict) else str(fabric)
