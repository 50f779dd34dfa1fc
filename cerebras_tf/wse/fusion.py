"""Which kernel pairs of a program the executor runs as one fused kernel (kernels/fused.py).

A pair is a producer and a tail of a kind pair in `FUSED` where the tail is the only kernel reading the
producer's first output, takes it as its first input and then exactly the producer inputs the pair's
`tail_reads` names, and that output is not streamed out or kept (a gradient); neither kernel is guarded
nor writes a variable.
Running the tail at the producer's place is then safe: everything it reads exists there, and nothing
else sees the intermediate tensor, which is never stored.
The program (its kernels, the report, the placement) is unchanged: fusion is how the simulator's host
computes it.
"""
from __future__ import annotations

from typing import Collection, Mapping, Sequence

from cerebras_tf import ir
from cerebras_tf.wse.kernels.fused import FUSED


def fused_pairs(kernels: Sequence[ir.Kernel], readers: Mapping[int, Sequence[int]],
                keep: Collection[int]) -> dict[int, ir.Kernel]:
    """Producer kernel id -> the tail kernel fused into it, among `kernels` (one phase, in order);
    `readers` maps every tensor of the program to the ids of the kernels that read it."""
    by_id = {k.id: k for k in kernels}
    position = {k.id: i for i, k in enumerate(kernels)}
    pairs: dict[int, ir.Kernel] = {}
    for producer in kernels:
        if not producer.outputs or producer.guard is not None or producer.vars:
            continue
        first = producer.outputs[0]
        reading = readers.get(first, ())
        if len(reading) != 1 or first in keep or reading[0] not in by_id:
            continue
        tail = by_id[reading[0]]
        fused = FUSED.get((producer.kind, tail.kind))
        if (fused is not None and tail.guard is None and not tail.vars
                and tail.inputs == [first, *(producer.inputs[i] for i in fused.tail_reads)]
                and position[tail.id] > position[producer.id]):
            pairs[producer.id] = tail
    return pairs
