"""Passes over a whole Program that need no TensorFlow: dead kernels, gradients, layers, execution phases.

The compiler runs them after lowering; being pure functions of the IR, they
are tested on hand-built programs.
"""
from __future__ import annotations

import re
from typing import Iterable

from cerebras_tf.ir.program import Kernel, Layer, Program
from cerebras_tf.ir.vocabulary import HALF, WRITES

# TF names ops of a gradient computation "<scope>/gradients[_N]/<forward op>_grad/...".
GRADIENT_SCOPE = re.compile(r"(^|/)gradients(_\d+)?/")


def prune_dead_kernels(kernels: list[Kernel], keep: set[int]) -> list[Kernel]:
    """The kernels whose results are used, renumbered 0..n-1 in their order.

    TF runs unused ops only because gradient tuples group them by control
    dependency (e.g. the gradient of a MatMul with respect to the input
    features). A kernel stays if it writes a variable, is a gradient seed, or
    produces a tensor in `keep` (the program outputs) or read (or used as its
    guard) by a kept kernel.
    """
    live, alive = set(keep), []
    for kernel in reversed(kernels):
        if kernel.kind in WRITES or kernel.kind == "gradient_seed" or any(t in live for t in kernel.outputs):
            alive.append(kernel)
            live.update(kernel.reads)
    alive.reverse()
    for index, kernel in enumerate(alive):
        kernel.id = index
    return alive


def guards_trainable_writes(program: Program) -> bool:
    """True when a trainable variable is written under a guard: the model decides itself whether a step
    updates the weights (TF's loss-scale optimizer: tf.cond(grads are finite, apply, no_op)), so it does
    its own loss scaling and an executor must not add its own."""
    trainable = {v.name for v in program.variables if v.trainable}
    return any(k.guard is not None and k.kind in WRITES and trainable.intersection(k.vars) for k in program.kernels)


def gradient_tensors(program: Program) -> list[int]:
    """Float tensors made by backward kernels and read outside them: the gradients an executor unscales
    (not integer ones, e.g. the indices of an embedding's gradient, which tf.convert_to_tensor densifies)."""
    floats = {t.id for t in program.tensors if t.dtype == HALF or t.dtype.startswith(("float", "bfloat"))}
    made_by_backward = {t for k in program.kernels if k.role == "backward" for t in k.outputs if t in floats}
    used: list[int] = []
    for kernel in program.kernels:
        if kernel.role not in ("backward", "gradient_seed"):
            used += [t for t in kernel.inputs if t in made_by_backward and t not in used]
    return used


def readers(kernels: Iterable[Kernel]) -> dict[int, list[int]]:
    """Tensor id -> the ids of the kernels among `kernels` that read it (inputs and guards; each kernel once),
    in the kernels' order."""
    found: dict[int, list[int]] = {}
    for kernel in kernels:
        for tid in dict.fromkeys(kernel.reads):
            found.setdefault(tid, []).append(kernel.id)
    return found


def phases(program: Program) -> tuple[list[Kernel], list[Kernel], list[Kernel]]:
    """The kernels split where loss scaling acts: (forward, backward and state updates; the optimizer;
    the global-step update). An executor checks the gradients between the first two and skips the
    second's writes on a non-finite step; `verify` checks no kernel reads a tensor of a later phase."""
    return (
        [k for k in program.kernels if k.role not in ("optimizer", "global_step_update")],
        [k for k in program.kernels if k.role == "optimizer"],
        [k for k in program.kernels if k.role == "global_step_update"],
    )


def data_parallel_problem(program: Program) -> str | None:
    """Why several systems cannot run `program` data parallel by averaging its gradients, or None: the
    update (optimizer and global-step phases) reads a tensor other than a gradient that the forward and
    backward pass computed from the batch, which would differ from system to system (e.g. a model's own
    loss scaling that checks its gradients before the optimizer phase)."""
    forward, update, step = phases(program)
    tainted = set(program.inputs.values())
    for kernel in forward:
        if tainted.intersection(kernel.reads):
            tainted.update(kernel.outputs)
    read = {t for kernel in update + step for t in kernel.reads}
    others = sorted((tainted & read) - set(program.gradients))
    if not others:
        return None
    names = ", ".join(program.tensors[t].name for t in others[:3]) + (", ..." if len(others) > 3 else "")
    return (f"the optimizer update reads {len(others)} tensor(s) computed from the batch that are not "
            f"gradients ({names}): several systems would each have their own")


def layers(program: Program) -> list[Layer]:
    """Group kernels by user layer (setting each `Kernel.layer`): the variable scope of the trainable
    variables they use or are named in.

    Kernels outside every such scope (activations, pooling, losses, schedules,
    optimizer bookkeeping) join the layer of their biggest input, else of their
    first consumer, else of the kernel before them; so every layer owns
    trainable variables (unless the model has none: then one layer, "program").
    Layers are ordered by their first forward kernel.
    """
    scopes = {v.name.rsplit("/", 1)[0] if "/" in v.name else v.name
              for v in program.variables if v.role == "trainable"}
    slot_owner = {v.name: v.slot_of for v in program.variables if v.slot_of}
    kernels = program.kernels
    layer_of: list[str | None] = [_scope_layer(k, scopes, slot_owner) for k in kernels]
    producer = {t: k.id for k in kernels for t in k.outputs}
    for kernel in kernels:  # forward: the layer of the biggest input
        if layer_of[kernel.id] is None:
            known = [t for t in kernel.inputs if t in producer and layer_of[producer[t]] is not None]
            if known:
                layer_of[kernel.id] = layer_of[producer[max(known, key=lambda t: program.tensors[t].size)]]
    consumer_layer: dict[int, str] = {}
    for kernel in reversed(kernels):  # backward: the layer of the first consumer
        if layer_of[kernel.id] is None:
            layer_of[kernel.id] = next((consumer_layer[t] for t in kernel.outputs if t in consumer_layer), None)
        layer = layer_of[kernel.id]
        if layer is not None:
            consumer_layer.update({t: layer for t in kernel.inputs})
    previous = next((name for name in layer_of if name is not None), "program")
    placed: list[str] = []
    for kernel in kernels:  # neighbours in execution order, for what is still unplaced
        previous = layer_of[kernel.id] or previous
        placed.append(previous)

    groups: dict[str, Layer] = {}
    first_forward: dict[str, int] = {}
    for kernel in kernels:
        kernel.layer = placed[kernel.id]
        group = groups.setdefault(kernel.layer, Layer(kernel.layer, [], []))
        group.kernels.append(kernel.id)
        if kernel.role == "forward":
            first_forward.setdefault(kernel.layer, kernel.id)
        for name in kernel.vars:  # a layer lists the variables it owns (slots are found via slot_of)
            owner = slot_owner.get(name, name)
            if owner not in group.variables:
                group.variables.append(owner)
    return sorted(groups.values(), key=lambda g: (first_forward.get(g.name, len(kernels)), g.kernels[0]))


def _scope_layer(kernel: Kernel, scopes: set[str], slot_owner: dict[str, str]) -> str | None:
    for name in kernel.vars:
        owner = slot_owner.get(name, name)
        scope = _enclosing_scope(owner, scopes, itself=True)
        if scope is not None:
            return scope
    name = GRADIENT_SCOPE.sub(r"\1", kernel.tf_name)
    name = _UPDATE_PREFIX.sub(r"\1", name)
    return _enclosing_scope(name, scopes, itself=False)


_UPDATE_PREFIX = re.compile(r"(^|/)update_")


def _enclosing_scope(name: str, scopes: set[str], itself: bool) -> str | None:
    """The longest of `scopes` that `name` is inside ("scope/..."), or is (with `itself`): a lookup per "/"
    of the name, where testing each scope was (kernels x scopes) string comparisons."""
    if itself and name in scopes:
        return name
    end = name.rfind("/")
    while end >= 0:
        if name[:end] in scopes:
            return name[:end]
        end = name.rfind("/", 0, end)
    return None
