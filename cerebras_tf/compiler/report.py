"""The human-readable compile report."""
from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

from cerebras_tf import ir

# The kernel a full compile inserts before each float32 matmul/conv input; a validate-only compile has none.
PRECISION_CAST_KIND = "to_half"
# Lists (kernel kinds) wrap at this width: the report is read in a terminal and in the log.
_WIDTH = 110


def kernel_summary(program: ir.Program) -> str:
    """The kernel count and what it counts, e.g. "84 kernels (75 + 9 precision casts)".

    Validate-only and full compiles of one model differ by the precision casts
    alone, so both reports say it: the count without casts is the same number.
    """
    total = len(program.kernels)
    casts = sum(1 for kernel in program.kernels if kernel.kind == PRECISION_CAST_KIND)
    if casts:
        return f"{total} kernels ({total - casts} + {casts} precision casts)"
    if not program.precision_casts:
        return f"{total} kernels (validate only: a full compile adds the precision casts of matmul/conv inputs)"
    return f"{total} kernels (no precision casts needed)"


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
        f"Identity/StopGradient removed: {stats['aliases_removed']}; runtime assertions checked on the host: "
        f"{stats['assertions']}; prints: {stats['prints']}; tf.cond if-converted: {stats['if_converted']}; "
        f"unused kernels removed: {stats.get('dead_kernels', 0)}",
        f"Program: {kernel_summary(program)}",
        "  by role: " + ", ".join(f"{r} {roles[r]}" for r in ir.ROLES if roles[r]),
        *([f"Precision casts inserted: {stats['precision_casts']} (matmul/conv inputs to the half dtype; "
           "float32 weights and accumulation)"] if program.precision_casts else []),
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
        *_wrap_items([f"{kind} {count}" for kind, count in program.kernel_counts().items()]),
        "",
        "Layers (kernels, parameters, MFLOP/step):",
    ]
    sizes = {v.name: v.size for v in program.variables if v.role == "trainable"}
    for layer in program.layers:
        layer_flops = sum(program.kernels[k].flops for k in layer.kernels)
        layer_params = sum(sizes.get(v, 0) for v in layer.variables)
        lines.append(f"  {layer.name:<40} {len(layer.kernels):>6} {layer_params:>12,} {layer_flops / 1e6:>12,.2f}")
    return "\n".join(lines) + "\n"


def _wrap_items(items: list[str], indent: str = "  ") -> list[str]:
    """Comma-separated items on lines of at most _WIDTH characters, never splitting an item."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(", ,") + len(item) <= _WIDTH:  # room for the next comma
            lines[-1] += ", " + item
        else:
            if lines:
                lines[-1] += ","
            lines.append(indent + item)
    return lines


def _tensor(program: ir.Program, tensor_id: int) -> str:
    tensor = program.tensors[tensor_id]
    return f"{tensor.dtype}{tensor.shape}"


def _fabric_name(fabric: Any) -> str:
    return str(fabric.get("name", fabric)) if isinstance(fabric, dict) else str(fabric)
