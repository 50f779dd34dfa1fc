"""Which kernel pairs of a program the executor runs as one fused kernel (kernels/fused.py).

A pair is a producer and a tail of a kind pair in `FUSED` where the tail is the only kernel reading the
producer's first output, takes it as its first input, then exactly the producer inputs the pair's
`tail_reads` names, then `tail_takes` tensors of its own made before the producer (a relu's output for
avg_pool_grad -> relu_grad), and that output is not streamed out or kept (a gradient); neither kernel is
guarded nor writes a variable.
Running the tail at the producer's place is then safe: everything it reads exists there, and nothing
else sees the intermediate tensor, which is never stored.
A `to_half` that is the only reader of the first output of a kernel in `ROUNDS_IN_PLACE` (`rounding_pairs`)
rounds that output in place, right after the kernel, where it is still in cache: no second array, one pass
fewer over memory (the executor checks each time that the output is a new float32 array of the kernel's own).
Two adjacent independent dense kernels (`dense_groups`: a convolution's input and filter gradients) run in one
call of a provider that takes kernels together (HostKernels.together: TensorFlow's executor runs them at once).
A to_half right after a bias_add_grad of the same tensor (`roundings_beside_sums`: a conv block's gradient,
summed for its bias and rounded for its convolution's gradients) runs with it in one pass over that tensor.
A max_pool_grad whose orig_output is the max_pool of its orig_input (`known_maxima`, as in every gradient TF
builds) reads the window maxima from it instead of taking them again (`WITH_KNOWN_MAXIMA`); where their windows
do not overlap, the pool keeps each window's winning tap for that gradient (`winning_taps`: kernels/pool.py's
WinningTaps, oneDNN's workspace), which then does not read the pooled input at all.
A conv block's bias_add -> relu whose output only its average pool and the relu_grad fused into that pool's
gradient read (`bias_relu_pools`) runs as no unit: the pool takes relu(x + bias) at its taps and the gradient
x + bias for its features, so neither the relu's output nor the bias_add's is ever stored (TF's graph folds
the bias and relu into the convolution instead).
A fused_batch_norm -> relu whose output only its max pool and the pool's gradient read, where the pool keeps its
winning taps (`batch_norm_relu_pools`), runs with the pool in one unit: the pool takes the normalized values as
it walks its windows, and the gradient needs only the taps, so they are never stored either.
Attention's transposes between the heads' layout and batch_matmul's are not copied where sgemm can read or
write the matrices in place (its leading dimension): a transpose that only batch_matmuls read
(`lazy_transposes`) hands on a view of its input, and a batch_matmul that only such transposes read
(`transposed_outputs`) lays its result out so that the transpose is a view of contiguous memory.
The program (its kernels, the report, the placement) is unchanged: fusion is how the simulator's host
computes it.
"""
from __future__ import annotations

import dataclasses
from typing import Collection, Iterable, Iterator, Mapping, Sequence

from cerebras_tf import ir
from cerebras_tf.wse.kernels import DENSE_KINDS, np_dtype
from cerebras_tf.wse.kernels._registry import KernelFn
from cerebras_tf.wse.kernels.fused import FUSED, ROUNDED_BESIDE
from cerebras_tf.wse.kernels.pool import (WinningTaps, keeps_winning_taps, max_pool_grad_of_output,
                                          max_pool_grad_of_output_relu_grad)


def _sole_readers(kernels: Sequence[ir.Kernel], readers: Mapping[int, Sequence[int]],
                  keep: Collection[int]) -> Iterator[tuple[ir.Kernel, ir.Kernel]]:
    """(producer, tail) for each kernel of `kernels` (one phase, in order) whose first output only `tail`, a
    later kernel of the phase, reads, and is not kept; neither of them guarded or writing a variable."""
    by_id = {k.id: k for k in kernels}
    position = {k.id: i for i, k in enumerate(kernels)}
    for producer in kernels:
        if not producer.outputs or producer.guard is not None or producer.vars:
            continue
        first = producer.outputs[0]
        reading = readers.get(first, ())
        if len(reading) != 1 or first in keep or reading[0] not in by_id:
            continue
        tail = by_id[reading[0]]
        if tail.guard is None and not tail.vars and position[tail.id] > position[producer.id]:
            yield producer, tail


def fused_pairs(kernels: Sequence[ir.Kernel], readers: Mapping[int, Sequence[int]],
                keep: Collection[int]) -> dict[int, ir.Kernel]:
    """Producer kernel id -> the tail kernel fused into it, among `kernels` (one phase, in order);
    `readers` maps every tensor of the program to the ids of the kernels that read it. A tail's inputs after
    those its pair names from the producer (Fused.tail_takes) must exist where the producer runs: made by an
    earlier kernel of the phase, or before it."""
    made_at = {t: i for i, k in enumerate(kernels) for t in k.outputs}
    position = {k.id: i for i, k in enumerate(kernels)}
    pairs: dict[int, ir.Kernel] = {}
    for producer, tail in _sole_readers(kernels, readers, keep):
        fused = FUSED.get((producer.kind, tail.kind))
        if fused is None:
            continue
        named = [producer.outputs[0], *(producer.inputs[i] for i in fused.tail_reads)]
        taken = tail.inputs[len(named):]
        if (tail.inputs[:len(named)] == named and len(taken) == fused.tail_takes
                and all(made_at.get(t, -1) < position[producer.id] for t in taken)):
            pairs[producer.id] = tail
    return pairs


def taken_by_tail(producer: ir.Kernel, tail: ir.Kernel) -> list[int]:
    """The tensors a fused pair's function takes after the producer's inputs: the tail's last
    Fused.tail_takes inputs."""
    takes = FUSED[(producer.kind, tail.kind)].tail_takes
    return tail.inputs[len(tail.inputs) - takes:] if takes else []


# Kinds whose first output is a new array of their own (none returns an input, a view of one, or a buffer it
# keeps): a to_half after one may round that array in place. Measured in one process, alternating: the zoo
# CNN's float16 step 0.2-1.3 ms faster (its avg_pool's and fused_batch_norm_grad's roundings); the transformer's
# transposes and gather are left out (0.2-1.3 ms slower in five runs of five).
ROUNDS_IN_PLACE = frozenset({"matmul", "batch_matmul", "conv2d", "conv2d_backprop_input", "conv2d_backprop_filter",
                             "depthwise_conv2d", "depthwise_conv2d_backprop_input", "depthwise_conv2d_backprop_filter",
                             "max_pool", "avg_pool", "max_pool_grad", "avg_pool_grad", "fused_batch_norm_grad"})


def rounding_pairs(kernels: Sequence[ir.Kernel], readers: Mapping[int, Sequence[int]], keep: Collection[int],
                   exclude: Collection[int] = ()) -> dict[int, ir.Kernel]:
    """Producer kernel id -> the to_half that rounds its first output in place, among `kernels` (one phase, in
    order): the producer's kind is in ROUNDS_IN_PLACE, the to_half is the only reader of that output, which is
    not kept; neither is guarded, in `exclude`, or writes a variable."""
    return {producer.id: tail for producer, tail in _sole_readers(kernels, readers, keep)
            if producer.kind in ROUNDS_IN_PLACE and tail.kind == "to_half" and tail.inputs == [producer.outputs[0]]
            and producer.id not in exclude and tail.id not in exclude}


def dense_groups(kernels: Sequence[ir.Kernel], exclude: Collection[int] = ()) -> dict[int, ir.Kernel]:
    """Kernel id -> the next kernel of the phase, run together with it in one provider call, among `kernels`
    (one phase, in order): both dense (kernels.DENSE_KINDS), unguarded, writing no variable, not in `exclude`,
    and the second reads no output of the first. Run at the second's place: nothing lies between them."""
    groups: dict[int, ir.Kernel] = {}
    previous: ir.Kernel | None = None
    for kernel in kernels:
        groupable = _groupable(kernel, exclude)
        if groupable and previous is not None and not set(previous.outputs) & set(kernel.inputs):
            groups[previous.id] = kernel
            previous = None
        else:
            previous = kernel if groupable else None
    return groups


def roundings_beside_sums(kernels: Sequence[ir.Kernel], exclude: Collection[int] = ()) -> dict[int, ir.Kernel]:
    """Kernel id -> the to_half right after it in `kernels` (one phase, in order) that rounds its first input,
    for a kind in ROUNDED_BESIDE (a bias_add_grad): the two run as one unit at the to_half's place, in one pass
    over that input. Neither guarded, writing a variable or in `exclude`."""
    groups: dict[int, ir.Kernel] = {}
    for kernel, after in zip(kernels, kernels[1:]):
        if (kernel.kind in ROUNDED_BESIDE and after.kind == "to_half" and kernel.inputs
                and after.inputs == kernel.inputs[:1] and not {kernel.id, after.id} & set(exclude)
                and all(k.guard is None and k.check_guard is None and not k.vars for k in (kernel, after))):
            groups[kernel.id] = after
    return groups


def _groupable(kernel: ir.Kernel, exclude: Collection[int]) -> bool:
    return (kernel.kind in DENSE_KINDS and kernel.guard is None and kernel.check_guard is None and not kernel.vars
            and kernel.id not in exclude)


@dataclasses.dataclass(frozen=True)
class BiasReluPool:
    """A conv block's bias_add -> relu (a fused pair) whose output only an avg_pool and the relu_grad fused into
    that pool's avg_pool_grad read: the pool takes the bias_add's inputs (x, bias) and the relu's values at
    its taps (pool.avg_pool_of_bias_relu), the gradient x + bias for its features
    (pool.avg_pool_grad_of_bias_relu), and neither the bias_add's nor the relu's output is ever stored."""

    bias_add: ir.Kernel
    relu: ir.Kernel
    pool: ir.Kernel
    grad: ir.Kernel  # the avg_pool_grad, relu_grad its fused tail
    relu_grad: ir.Kernel

    @property
    def taken(self) -> list[int]:
        """(x, bias): what the pool, and the gradient after its own input, take instead of the relu's output."""
        return list(self.bias_add.inputs[:2])


def _relus_read_by(kernels: Sequence[ir.Kernel], readers: Mapping[int, Sequence[int]], keep: Collection[int],
                   tails: Mapping[int, ir.Kernel], producer_kind: str,
                   count: int) -> Iterator[tuple[ir.Kernel, ir.Kernel, list[ir.Kernel]]]:
    """(producer, relu, the kernels reading the relu's output) for each `producer_kind` kernel among `kernels`
    (one phase) fused with a relu (`tails`: fused_pairs) whose output is not kept and is read by exactly
    `count` kernels, all of the phase."""
    by_id = {k.id: k for k in kernels}
    for producer_id, relu in tails.items():
        producer = by_id.get(producer_id)
        if producer is None or producer.kind != producer_kind or relu.kind != "relu":
            continue
        reading = [by_id[r] for r in readers.get(relu.outputs[0], ()) if r in by_id]
        if relu.outputs[0] not in keep and len(reading) == len(readers.get(relu.outputs[0], ())) == count:
            yield producer, relu, reading


def _data_format(kernel: ir.Kernel) -> str:
    value = kernel.attrs.get("data_format", "NHWC")
    return value.decode() if isinstance(value, bytes) else str(value)


def bias_relu_pools(kernels: Sequence[ir.Kernel], readers: Mapping[int, Sequence[int]], keep: Collection[int],
                    tails: Mapping[int, ir.Kernel]) -> list[BiasReluPool]:
    """The BiasReluPools among `kernels` (one phase, in order), given its fused pairs (`tails`: producer id ->
    tail, fused_pairs): a bias_add fused with a relu whose output is not kept and is read by exactly one
    unguarded avg_pool (as its input) and one relu_grad (as its features) that is fused into an
    avg_pool_grad; the three in one data format, neither pooling kernel writing a variable."""
    by_id = {k.id: k for k in kernels}
    found = []
    for bias_add, relu, reading in _relus_read_by(kernels, readers, keep, tails, "bias_add", 2):
        y = relu.outputs[0]
        pools = [r for r in reading if r.kind == "avg_pool" and r.inputs == [y]]
        relu_grads = [r for r in reading if r.kind == "relu_grad" and r.inputs[1:] == [y] and r.inputs[0] != y]
        grads = [by_id[p] for p, t in tails.items() if relu_grads and t.id == relu_grads[0].id and p in by_id]
        if (len(bias_add.inputs) != 2 or len(pools) != 1 or len(relu_grads) != 1 or len(grads) != 1
                or grads[0].kind != "avg_pool_grad"):
            continue
        pool, grad = pools[0], grads[0]
        if (any(k.guard is not None or k.vars for k in (pool, grad))
                or not (_data_format(bias_add) == _data_format(pool) == _data_format(grad))):
            continue
        found.append(BiasReluPool(bias_add, relu, pool, grad, relu_grads[0]))
    return found


@dataclasses.dataclass(frozen=True)
class BatchNormReluPool:
    """A fused_batch_norm -> relu (a fused pair) whose output only a max_pool, that pool's gradient and the
    relu_grad fused into it read, where the pool keeps its winning taps for the gradient (winning_taps, with
    the relu_grad): the pool runs in the batch norm's unit on its inputs (fused.batch_norm_relu_max_pool) and
    the gradient from the taps and its own gradient input alone (WinningTaps.max_pool_grad_of_taps), so the
    relu's output, the batch's normalized values, is never stored. `rounding`: a to_half that, the gradient
    aside, is the only reader of the pool's output (a convolution's operand rounded to the half dtype): the
    unit may hand that output on rounded (the pool writing each max so), and the to_half run as no unit."""

    batch_norm: ir.Kernel
    relu: ir.Kernel
    pool: ir.Kernel
    grad: ir.Kernel  # the max_pool_grad, relu_grad its fused tail
    relu_grad: ir.Kernel
    rounding: ir.Kernel | None = None


def batch_norm_relu_pools(kernels: Sequence[ir.Kernel], readers: Mapping[int, Sequence[int]], keep: Collection[int],
                          tails: Mapping[int, ir.Kernel],
                          taps: Mapping[int, WinningTaps]) -> list[BatchNormReluPool]:
    """The BatchNormReluPools among `kernels` (one phase, in order), given its fused pairs (`tails`: fused_pairs)
    and the pools that keep winning taps (`taps`: winning_taps): a fused_batch_norm fused with a relu whose
    output is not kept and is read by exactly a max_pool (as its input), that pool's only max_pool_grad (as
    its orig_input) and the relu_grad fused into it (as its features), the pool and gradient sharing
    WinningTaps with the relu_grad; the batch norm and pool in NHWC."""
    found = []
    for batch_norm, relu, reading in _relus_read_by(kernels, readers, keep, tails, "fused_batch_norm", 3):
        y = relu.outputs[0]
        pools = [r for r in reading if r.kind == "max_pool" and r.inputs == [y]]
        grads = [r for r in reading if r.kind == "max_pool_grad" and r.inputs[0] == y]
        if len(pools) != 1 or len(grads) != 1:
            continue
        pool, grad = pools[0], grads[0]
        tail = tails.get(grad.id)
        shared = taps.get(pool.id)
        if (tail is None or tail.kind != "relu_grad" or tail.inputs[1:] != [y] or tail not in reading
                or shared is None or taps.get(grad.id) is not shared or not shared.relu_grad
                or grad.inputs[1] != pool.outputs[0]
                or not _data_format(batch_norm) == _data_format(pool) == "NHWC"):
            continue
        found.append(BatchNormReluPool(batch_norm, relu, pool, grad, tail,
                                       _pool_rounding(pool, grad, kernels, readers, keep)))
    return found


def _pool_rounding(pool: ir.Kernel, grad: ir.Kernel, kernels: Sequence[ir.Kernel],
                   readers: Mapping[int, Sequence[int]], keep: Collection[int]) -> ir.Kernel | None:
    """The to_half of `kernels` that reads the pool's output, which only it and the pool's gradient `grad`
    (which takes the winning taps instead) read and which is not kept; unguarded, writing no variable."""
    out = pool.outputs[0]
    others = [r for r in readers.get(out, ()) if r != grad.id]
    if out in keep or len(others) != 1:
        return None
    rounding = next((k for k in kernels if k.id == others[0]), None)
    if (rounding is None or rounding.kind != "to_half" or rounding.inputs != [out] or rounding.guard is not None
            or rounding.vars):
        return None
    return rounding


# The function of a max_pool_grad in `known_maxima`, by the kind of the tail fused into it ("": none).
WITH_KNOWN_MAXIMA: dict[str, KernelFn] = {"": max_pool_grad_of_output, "relu_grad": max_pool_grad_of_output_relu_grad}


def known_maxima(kernels: Iterable[ir.Kernel]) -> set[int]:
    """Ids of the max_pool_grad kernels among `kernels` (the whole program) whose orig_output (input 1) is the
    first output of an unguarded max_pool of the same orig_input (input 0) and the same attrs: bit for bit
    that pool's window maxima, which TF's kernel would take again from orig_input."""
    kernels = list(kernels)
    pooled = {k.outputs[0]: k for k in kernels if k.kind == "max_pool" and k.guard is None and k.outputs}
    known = set()
    for kernel in kernels:
        if kernel.kind == "max_pool_grad" and len(kernel.inputs) == 3:
            pool = pooled.get(kernel.inputs[1])
            if pool is not None and pool.inputs[:1] == kernel.inputs[:1] and pool.attrs == kernel.attrs:
                known.add(kernel.id)
    return known


def winning_taps(kernels: Iterable[ir.Kernel], known: Collection[int], tails: Mapping[int, ir.Kernel],
                 tensors: Sequence[ir.Tensor]) -> dict[int, WinningTaps]:
    """Kernel id -> the WinningTaps its max_pool or max_pool_grad runs through, both kernels of each pair where
    the grad is in `known` (known_maxima), the only max_pool_grad of its pool, and the windows do not overlap
    (pool.keeps_winning_taps: numba, float32/float64, the gradient of the input's dtype); with a relu_grad
    where `tails` (producer id -> the tail fused into it: fused_pairs) fuses one into the grad.
    `kernels`: the whole program."""
    kernels = list(kernels)
    pools = {k.outputs[0]: k for k in kernels if k.kind == "max_pool" and k.outputs}
    grads: dict[int, list[ir.Kernel]] = {}
    for kernel in kernels:
        if kernel.kind == "max_pool_grad" and len(kernel.inputs) == 3 and kernel.inputs[1] in pools:
            grads.setdefault(pools[kernel.inputs[1]].id, []).append(kernel)
    shared: dict[int, WinningTaps] = {}
    for pool in pools.values():
        reading = grads.get(pool.id, [])
        if len(reading) != 1 or reading[0].id not in known:
            continue
        grad = reading[0]
        x, dy = tensors[pool.inputs[0]], tensors[grad.inputs[2]]
        if dy.dtype != x.dtype or not keeps_winning_taps(pool.attrs, x.shape, np_dtype(x.dtype)):
            continue
        tail = tails.get(grad.id)
        shared[pool.id] = shared[grad.id] = WinningTaps(relu_grad=tail is not None and tail.kind == "relu_grad")
    return shared


def _keeps_rows(perm: Sequence[int]) -> bool:
    """A permutation of rank 3 or more that leaves the last axis last: each matrix of the permuted array is a
    strided view with unit steps along its rows, which sgemm reads and writes in place."""
    return len(perm) >= 3 and list(perm)[-1] == len(perm) - 1


def _perm(kernel: ir.Kernel) -> tuple[int, ...]:
    return tuple(int(p) for p in kernel.attrs.get("perm", ()))


def lazy_transposes(kernels: Iterable[ir.Kernel], readers: Mapping[int, Sequence[int]],
                    keep: Collection[int]) -> set[int]:
    """Ids of the transposes among `kernels` (the whole program) that may hand on a view of their input
    instead of a copy: unguarded, of a permutation that keeps rows (_keeps_rows), and every reader of the
    output a batch_matmul, or a to_half (float32 numerics: its input itself) whose readers are so in turn;
    no tensor on the way is kept."""
    by_id = {k.id: k for k in kernels}

    def only_batch_matmuls(tensor: int) -> bool:
        reading = readers.get(tensor, ())
        if tensor in keep or not reading:
            return False
        for r in reading:
            kernel = by_id.get(r)
            if kernel is None or kernel.guard is not None:
                return False
            if kernel.kind == "to_half":
                if not only_batch_matmuls(kernel.outputs[0]):
                    return False
            elif kernel.kind != "batch_matmul":
                return False
        return True
    return {k.id for k in by_id.values() if k.kind == "transpose" and k.guard is None and not k.vars
            and _keeps_rows(_perm(k)) and only_batch_matmuls(k.outputs[0])}


def transposed_outputs(kernels: Iterable[ir.Kernel], readers: Mapping[int, Sequence[int]],
                       keep: Collection[int]) -> dict[int, tuple[int, ...]]:
    """batch_matmul id -> the permutation its result is laid out for (host kernels' attrs["out_perm"]), among
    `kernels` (the whole program): unguarded, writing no variable, its result not kept and read only by
    unguarded transposes, all of one permutation that keeps rows (_keeps_rows)."""
    by_id = {k.id: k for k in kernels}
    laid_out: dict[int, tuple[int, ...]] = {}
    for kernel in by_id.values():
        if kernel.kind != "batch_matmul" or kernel.guard is not None or kernel.vars or kernel.outputs[0] in keep:
            continue
        reading = [by_id.get(r) for r in readers.get(kernel.outputs[0], ())]
        if not reading or any(r is None or r.kind != "transpose" or r.guard is not None for r in reading):
            continue
        perms = {_perm(r) for r in reading if r is not None}
        perm = perms.pop()
        if not perms and _keeps_rows(perm):
            laid_out[kernel.id] = perm
    return laid_out

