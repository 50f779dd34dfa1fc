"""Per-layer costs of a program, per training sample, for the pipelined placement model.

Pure data over the IR (no TensorFlow): each entry has the fields of
`cerebras_tf.wse.placement.LayerCost`, so `LayerCost(**entry)` builds the
placement input. Layers are in the program's order (first use, i.e. forward).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from cerebras_tf.ir.program import Kernel, Program, Tensor
from cerebras_tf.ir.vocabulary import HALF, UPDATE_ROLES


def tensor_bytes(tensor: Tensor) -> int:
    itemsize = 2 if tensor.dtype == HALF else np.dtype(tensor.dtype).itemsize
    return tensor.size * itemsize


def _sent_bytes(tensor: Tensor, receivers: list[Kernel]) -> int:
    """Bytes of `tensor` crossing to other layers: half width when every receiver only casts it to half
    (the cast then runs in the sending layer, as the WSE's activations travel in half precision)."""
    if tensor.dtype != HALF and all(kernel.kind == "to_half" for kernel in receivers):
        return tensor.size * 2
    return tensor_bytes(tensor)


def stream_rows(tensor: Tensor, batch: int) -> int:
    """Vectors (rows along the last dimension) one sample of `tensor` streams as: the tokens of
    [batch, tokens, hidden] or [batch * tokens, hidden], the pixels of [batch, height, width, channels];
    1 for a flat [batch, n] or a tensor that is not per sample."""
    if len(tensor.shape) < 2 or not tensor.shape[-1] or tensor.size % (batch * tensor.shape[-1]):
        return 1
    return max(1, tensor.size // (batch * tensor.shape[-1]))


def layer_costs(program: Program) -> list[dict[str, Any]]:
    """name, flops_fwd/bwd/update, weight/optimizer-state bytes, activation/output bytes (per sample),
    and the rows its main output (the largest it sends on, else the largest it makes) streams as."""
    features = [tid for key, tid in program.inputs.items() if key.split("/", 1)[0] == "features"]
    shape = program.tensors[features[0]].shape if features else []
    batch = max(int(shape[0]), 1) if shape else 1
    variables = {v.name: v for v in program.variables}
    layer_of = {k.id: k.layer for k in program.kernels}
    consumers: dict[int, list[Kernel]] = {}
    for kernel in program.kernels:
        for tid in kernel.inputs:
            consumers.setdefault(tid, []).append(kernel)
    costs = []
    counted: set[str] = set()
    for layer in program.layers:
        kernels = [program.kernels[k] for k in layer.kernels]
        flops = {"forward": 0, "backward": 0, "update": 0}
        kept = sent = 0
        largest_sent: Tensor | None = None
        largest_made: Tensor | None = None
        for kernel in kernels:
            bucket = "update" if kernel.role in UPDATE_ROLES else (
                "backward" if kernel.role in ("backward", "gradient_seed") else "forward")
            flops[bucket] += kernel.flops
            if kernel.role != "forward":
                continue
            for tid in kernel.outputs:
                tensor = program.tensors[tid]
                users = consumers.get(tid, [])
                if any(user.role == "backward" for user in users):
                    kept += tensor_bytes(tensor)
                if largest_made is None or tensor.size > largest_made.size:
                    largest_made = tensor
                receivers = [user for user in users if user.role == "forward" and layer_of[user.id] != layer.name]
                if receivers:
                    sent += _sent_bytes(tensor, receivers)
                    if largest_sent is None or tensor.size > largest_sent.size:
                        largest_sent = tensor
        owned = [variables[name] for name in layer.variables if name in variables and name not in counted]
        slots = [v for v in program.variables if v.role == "optimizer_state" and v.name not in counted
                 and (v.slot_of in layer.variables or (v.slot_of is None and v.name in layer.variables))]
        counted.update(v.name for v in owned + slots)  # a variable several layers read is held once
        main = largest_sent if largest_sent is not None else largest_made
        costs.append({
            "name": layer.name,
            "flops_fwd": flops["forward"] / batch,
            "flops_bwd": flops["backward"] / batch,
            "flops_update": flops["update"] / batch,
            "weight_bytes": float(sum(v.size * np.dtype(v.dtype).itemsize for v in owned
                                      if v.role in ("trainable", "state"))),
            "optimizer_state_bytes": float(sum(v.size * np.dtype(v.dtype).itemsize for v in slots)),
            "activation_bytes": kept / batch,
            "output_bytes": sent / batch,
            "stream_rows": stream_rows(main, batch) if main is not None else 1,
        })
    return costs
