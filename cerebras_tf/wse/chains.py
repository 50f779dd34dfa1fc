"""Chains of elementwise kernels the executor runs as one generated numba loop (issue #27).

`fuse_chains` groups one phase's elementwise kernels into chains: kernels whose float32 arithmetic is
exactly rounded both in numpy and in a numba loop (add, sub, mul, div, neg, abs, square, sqrt,
reciprocal, rsqrt as 1/sqrt, maximum, minimum, squared_difference, select, comparisons, logical ops,
relu, bias_add (channels last), add_n, pow by a constant 0.5/2/3/-1 (as elementwise._pow rewrites it),
the gradients of tanh, sigmoid, rsqrt, sqrt, reciprocal and relu, tanh itself (TF's rational form,
kernels/eigen_tanh.py: exactly rounded operations too), the executor's `to_half` rounding, and a
tile along size-1 axes only, which is a broadcast: the loop reads its input as a column, row or scalar),
so one pass over memory gives the same bits as the kernels one by one. Not exp/log/erf and the like:
numpy's SIMD versions differ from libm's in the last bit, and erf's loop is not written as a chain's.

A chain's members all have one output shape; each of its external inputs has that shape (or its size),
is a scalar, a row [cols] or a column [rows, 1] of the output's 2-D view (cols = last dim), or rows that
each serve a group of consecutive output rows (an attention mask [batch, 1, 1, keys]). It runs where
its last member is; a kernel outside it that reads a member's output must come later. Where such a kernel
lies between the chain and a member that would join it (an add_n's output read by a bias_add_grad before
the `to_half` of it), the joining member runs earlier, at the chain's place, if everything it reads exists
there. Its outputs are the member outputs read outside it or kept; the other intermediates are never stored.

The loop's source is generated from the chain's structure, compiled by numba (nopython, nogil, no
fast-math) once per structure per process (and once per pattern of arrays that are one: a chain that writes
an optimizer's variables into their own arrays, which it also reads, runs a loop taking each array once, as
LLVM vectorises no loop whose arrays may overlap), and written to a per-user cache dir
(``$CEREBRAS_TF_CHAIN_CACHE`` or ``~/.cache/cerebras_tf/chains``) so numba's on-disk cache keeps the
machine code across runs: one directory there per code generation (a cerebras_tf whose loops differ),
another generation's removed once it has gone unused for two weeks. No chains without numba or with
CEREBRAS_TF_JIT=0 (`_jit.enabled()`), or with CEREBRAS_TF_FUSE_CHAINS=0 (`enabled()`; tests flip the module
flag with `use_chains`).
"""
from __future__ import annotations

import bisect
import contextlib
import dataclasses
import hashlib
import importlib.util
import math
import os
import shutil
import string
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

import numpy as np

from cerebras_tf import ir
from cerebras_tf.amp import FLOAT32_MODE, half_format
from cerebras_tf.wse import denormals as _denormals
from cerebras_tf.wse.kernels import _jit, eigen_tanh
from cerebras_tf.wse.kernels import half as _half
from cerebras_tf.wse.kernels._registry import KernelContext, KernelFn
from cerebras_tf.wse.memory import empty_aligned
from cerebras_tf.wse.threads import LOOP_MIN_ELEMENTS_PER_THREAD, run_loop

ENV_VAR = "CEREBRAS_TF_FUSE_CHAINS"
CACHE_ENV_VAR = "CEREBRAS_TF_CHAIN_CACHE"
# In every generated source (so in its cache file's name): this module's own hash, as numba's disk cache would
# not see a change to the code generation or to the intrinsics a loop inlines;
# kernels/half.py's too, for the float16 rounding intrinsic the loops call, kernels/_jit.py's, for the bit
# casts, and wse/denormals.py's, for the MXCSR functions the parallel loops call.
_stamp = hashlib.sha256()
for _path in (__file__, _half.__file__, _jit.__file__, _denormals.__file__):
    with open(_path, "rb") as _code:
        _stamp.update(_code.read())
_CODEGEN_STAMP = _stamp.hexdigest()[:16]

_enabled = os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")

_FLOAT = frozenset({"float32", ir.HALF})
_BINARY = {"add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
           "bias_add": "{0} + {1}",
           "maximum": "{0} if ({0} > {1}) | ({0} != {0}) else {1}",  # np.maximum: NaN kept, the second on ties
           "minimum": "{0} if ({0} < {1}) | ({0} != {0}) else {1}"}
_UNARY = {"neg": "-{0}", "abs": "abs({0})", "square": "{0} * {0}", "sqrt": "np.sqrt({0})",
          "reciprocal": "np.float32(1.0) / {0}",
          "relu": "{0} if ({0} > np.float32(0.0)) | ({0} != {0}) else np.float32(0.0)"}  # elementwise.relu
_COMPARE = {"equal": "==", "not_equal": "!=", "less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">="}
_LOGICAL = {"logical_and": "{0} & {1}", "logical_or": "{0} | {1}", "logical_not": "not {0}"}
_POW = {0.5: "sqrt", 2.0: "square", 3.0: "cube", -1.0: "reciprocal"}  # elementwise._POW_REWRITES
# Gradients (kernels/elementwise_grad.py), (y, dy) operands but relu_grad's (gradients, features): numpy's order.
_GRAD = {"tanh_grad": ["{o}q = {0} * {0}", "{o}d = np.float32(1.0) - {o}q", "{o} = {1} * {o}d"],
         "sigmoid_grad": ["{o}p = {1} * {0}", "{o}d = np.float32(1.0) - {0}", "{o} = {o}p * {o}d"],
         "rsqrt_grad": ["{o}p = np.float32(-0.5) * ({1} * {0})", "{o} = {o}p * ({0} * {0})"],
         "sqrt_grad": ["{o} = (np.float32(0.5) * {1}) / {0}"],
         "reciprocal_grad": ["{o} = ((-{0}) * {0}) * {1}"],
         "relu_grad": ["{o} = {0} if {1} > np.float32(0.0) else np.float32(0.0)"]}  # the numba loop's
KINDS = frozenset({*_BINARY, *_UNARY, *_COMPARE, *_LOGICAL, *_GRAD, "rsqrt", "squared_difference", "select",
                   "add_n", "pow", "to_half", "tile", "tanh"})
# Kinds whose kernel takes several passes over memory (numpy temporaries): a loop of their own even alone (a
# layer norm's squared_difference against its row means: 0.21 -> 0.03 ms at 1024x256)
SINGLE_KINDS = frozenset({"squared_difference", "rsqrt", "cube", "tanh_grad", "sigmoid_grad", "rsqrt_grad",
                          "sqrt_grad", "reciprocal_grad"})


def enabled() -> bool:
    """Whether the executor fuses chains: numba's loops are on (`_jit.enabled()`) and chains are not switched off."""
    return _enabled and _jit.enabled()


@contextlib.contextmanager
def use_chains(on: bool) -> Iterator[None]:
    """Within the block, executors created fuse chains (on) or not (off); for tests and benchmarks."""
    global _enabled
    before, _enabled = _enabled, on
    try:
        yield
    finally:
        _enabled = before


@dataclasses.dataclass
class Chain:
    """Kernels run as one loop: `fn(inputs, attrs, ctx)` takes the tensors `inputs` and returns `outputs`."""

    kernels: list[ir.Kernel]  # members, in program order
    inputs: list[int]  # external input tensor ids, in fn's order
    outputs: list[int]  # member outputs read outside the chain or kept, in fn's order
    fn: KernelFn
    source: str  # the generated loop (its structure: also the compile cache's key)
    place: ir.Kernel  # the member the chain runs where: the last, or the one before members that run earlier


@dataclasses.dataclass
class _Op:
    kernel: ir.Kernel
    op: str  # a kind, or "cube" (pow by 3)
    operands: list[int]  # tensor ids the op reads (pow: its base only)


def _broadcast(shape: Sequence[int], out: Sequence[int]) -> str | None:
    """How an input of `shape` is read for an output of shape `out`: "f" (full: the same elements), "s"
    (scalar), "r" (a row along the last dim), "c" (a column: one value per row), "g" (rows, each for a group of
    consecutive output rows: the leading dims of `out`, then ones, then the last dim, as an attention mask
    [batch, 1, 1, keys] for scores [batch, heads, queries, keys]); None for anything else."""
    if len(shape) > len(out):
        return None
    padded = [1] * (len(out) - len(shape)) + list(shape)
    if any(p not in (1, o) for p, o in zip(padded, out)):
        return None
    size, out_size = math.prod(padded), math.prod(out)
    if size == out_size:
        return "f"
    if size == 1:
        return "s"
    if padded[-1] == out[-1] and all(p == 1 for p in padded[:-1]):
        return "r"
    if padded[-1] == 1 and padded[:-1] == list(out[:-1]):
        return "c"
    if padded[-1] == out[-1]:
        lead = next(i for i, p in enumerate(padded) if p != out[i])
        if all(p == 1 for p in padded[lead:-1]):
            return "g"
    return None


def _member(kernel: ir.Kernel, tensors: Sequence[ir.Tensor], constants: Mapping[int, np.ndarray]) -> _Op | None:
    """`kernel` as a chain op, or None where it cannot be one (kind, dtypes, guards, variables)."""
    kind = kernel.kind
    if (kind not in KINDS or kernel.guard is not None or kernel.check_guard is not None or kernel.vars
            or len(kernel.outputs) != 1 or not kernel.inputs):
        return None
    dtypes = [tensors[t].dtype for t in kernel.inputs]
    out = tensors[kernel.outputs[0]]
    floats = all(d in _FLOAT for d in dtypes)
    if kind in _LOGICAL:
        ok = all(d == "bool" for d in dtypes) and out.dtype == "bool"
    elif kind in _COMPARE:
        ok = floats and out.dtype == "bool"
    elif kind == "select":
        ok = (len(dtypes) == 3 and dtypes[0] == "bool" and all(d in _FLOAT for d in dtypes[1:]) and out.dtype in _FLOAT
              and not (kernel.attrs.get("broadcast", "numpy") == "v1" and len(tensors[kernel.inputs[0]].shape) == 1
                       and len(tensors[kernel.inputs[1]].shape) > 1))
    else:
        ok = floats and out.dtype in _FLOAT
    if kind == "relu_grad":  # its numba loop (same shapes) only
        ok = ok and tensors[kernel.inputs[0]].shape == tensors[kernel.inputs[1]].shape == out.shape
    if kind == "bias_add":
        ok = ok and not (str(kernel.attrs.get("data_format", "NHWC")).startswith("NC") and len(out.shape) >= 3)
    if kind == "tile":  # repeating only size-1 axes: a broadcast (the mean's gradient: [rows, 1] to [rows, cols])
        multiples = [int(m) for m in np.asarray(kernel.attrs.get("multiples", []), np.int64).reshape(-1)]
        shape = tensors[kernel.inputs[0]].shape
        ok = ok and len(multiples) == len(shape) and all(m == 1 or d == 1 for m, d in zip(multiples, shape))
    if not ok:
        return None
    if kind == "pow":  # only the rewritten forms: a constant scalar exponent of 0.5, 2, 3 or -1
        exponent = constants.get(kernel.inputs[1])
        if exponent is None or exponent.size != 1 or _broadcast(tensors[kernel.inputs[0]].shape, out.shape) != "f":
            return None
        op = _POW.get(float(exponent.reshape(-1)[0]))
        return None if op is None else _Op(kernel, op, [kernel.inputs[0]])
    arity = {"to_half": 1, "tile": 1, "rsqrt": 1, "tanh": 1, "squared_difference": 2, "select": 3}.get(kind)
    if arity is None:
        arity = 1 if kind in _UNARY or kind == "logical_not" else 2
    if kind != "add_n" and len(kernel.inputs) != arity:
        return None
    return _Op(kernel, kind, list(kernel.inputs))


class _Open:
    """A chain being grown."""

    def __init__(self, op: _Op, shape: list[int], at: int) -> None:
        self.ops = [op]
        self.shape = shape
        self.members = {op.kernel.id}
        self.at = at  # the position the chain runs at

    def produced(self) -> set[int]:
        return {o.kernel.outputs[0] for o in self.ops}


def fuse_chains(kernels: Sequence[ir.Kernel], readers: Mapping[int, Sequence[int]], keep: Collection[int], *,
                tensors: Sequence[ir.Tensor], half_dtype: str, constants: Mapping[int, np.ndarray] | None = None,
                exclude: Collection[int] = (), volatile: Collection[int] = ()) -> list[Chain]:
    """The chains among `kernels` (one phase, in program order), each of at least two kernels, or one of
    SINGLE_KINDS.

    `readers` maps every tensor of the program to the ids of the kernels that read it; `keep`: tensors
    that must be stored (outputs, gradients); `tensors`: the program's tensors by id; `half_dtype`: what
    `to_half` rounds to; `constants`: constant tensor values (a pow's exponent); `exclude`: kernels that
    may not be members (e.g. fused pairs); `volatile`: tensors that may view a variable (a shared
    read_variable): a member reading one is not moved past a kernel that writes a variable."""
    constants = constants or {}
    position = {k.id: i for i, k in enumerate(kernels)}
    writes = [i for i, k in enumerate(kernels) if k.vars and k.kind not in ir.READS_VARIABLES]
    made_at = {t: i for i, k in enumerate(kernels) for t in k.outputs}
    producer: dict[int, _Open] = {}  # member output -> its open chain
    chains: list[_Open] = []

    def outside_before(c: _Open, members: set[int], at: int) -> bool:
        """Whether a kernel outside `members` reads an output of c at a position before `at`."""
        for t in c.produced():
            for r in readers.get(t, ()):
                if r not in members and position.get(r, len(kernels)) < at:
                    return True
        return False

    def moved_past_write(ops: list[_Op], at: int) -> bool:
        """Whether a member reading a volatile tensor would run after a variable write it preceded."""
        for o in ops:
            if volatile and any(t in volatile for t in o.operands):
                i = bisect.bisect_right(writes, position[o.kernel.id])
                if i < len(writes) and writes[i] < at:
                    return True
        return False

    def run_earlier(op: _Op, join: list[_Open], members: set[int], at: int) -> int | None:
        """The earlier position the chains of `join` and `op` (at `at`) may run at together: the latest of the
        chains' own, if nothing outside reads their outputs before it, and everything op reads exists there
        and is not a variable's array written between there and `at`; else None."""
        place = max(c.at for c in join)
        if any(outside_before(c, members, place) or moved_past_write(c.ops, place) for c in join):
            return None
        produced = set().union(*(c.produced() for c in join))
        for t in op.operands:
            if t not in produced and made_at.get(t, -1) >= place:
                return None
            if t in volatile and bisect.bisect_right(writes, place) < bisect.bisect_left(writes, at):
                return None
        return place

    for kernel in kernels:
        if kernel.id in exclude:
            continue
        op = _member(kernel, tensors, constants)
        if op is None:
            continue
        shape = list(tensors[kernel.outputs[0]].shape)
        if any(_broadcast(tensors[t].shape, shape) is None for t in op.operands):
            continue
        at = position[kernel.id]
        join = list(dict.fromkeys(producer[t] for t in op.operands if t in producer and producer[t].shape == shape))
        run_at = at
        while join:  # drop the chains that cannot wait until `at` (read in between by a kernel outside them)
            members = set().union(*(c.members for c in join)) | {kernel.id}
            blocked = [c for c in join if outside_before(c, members, at) or moved_past_write(c.ops, at)]
            if not blocked:
                break
            earlier = run_earlier(op, join, members, at)
            if earlier is not None:  # the kernel comes to them
                run_at = earlier
                break
            join = [c for c in join if c not in blocked]
        grown = _Open(op, shape, run_at)
        if join:
            grown.ops = sorted([o for c in join for o in c.ops] + [op], key=lambda o: position[o.kernel.id])
            grown.members = {o.kernel.id for o in grown.ops}
            chains = [c for c in chains if c not in join]
        chains.append(grown)
        for o in grown.ops:
            producer[o.kernel.outputs[0]] = grown
    result = []
    for c in chains:
        if len(c.ops) < 2 and c.ops[0].op not in SINGLE_KINDS:
            continue
        chain = _build(c.ops, c.shape, c.members, readers, keep, tensors, half_dtype, kernels[c.at])
        if chain is not None:
            result.append(chain)
    return sorted(result, key=lambda ch: position[ch.place.id])


def defer_to_update(phases: tuple[list[ir.Kernel], list[ir.Kernel], list[ir.Kernel]], tensors: Sequence[ir.Tensor],
                    keep: Collection[int]) -> tuple[list[ir.Kernel], list[ir.Kernel], list[ir.Kernel]]:
    """`phases` (ir.phases) with the first phase's would-be chain members that only the optimizer reads and
    that read only constants and read_variable outputs (an Adam slot times its decay: role "forward", as it
    needs no gradient) moved into the optimizer phase, just before their first reader, so they can join its
    chains. The value is the same: such a kernel reads no batch, and a variable written in between makes
    the executor copy its read (Executor._reads_without_copy runs on the new order)."""
    forward, update, step = phases
    producer = {t: k for k in forward for t in k.outputs}
    in_update = {k.id for k in update}
    readers = ir.readers((*forward, *update, *step))
    moved: dict[int, list[ir.Kernel]] = {}  # first reader id -> kernels to put before it
    kept = []
    for k in forward:
        out = k.outputs[0] if len(k.outputs) == 1 else None
        reading = set(readers.get(out, ())) if out is not None else set()
        if (k.kind in KINDS and not k.vars and k.guard is None and k.check_guard is None and out not in keep
                and reading and reading <= in_update
                and all(tensors[t].const is not None
                        or (t in producer and producer[t].kind == "read_variable") for t in k.inputs)):
            first = next(u.id for u in update if u.id in reading)
            moved.setdefault(first, []).append(k)
        else:
            kept.append(k)
    if not moved:
        return phases
    return kept, [m for u in update for m in (*moved.get(u.id, ()), u)], step


def _build(ops: list[_Op], shape: list[int], members: set[int], readers: Mapping[int, Sequence[int]],
           keep: Collection[int], tensors: Sequence[ir.Tensor], half_dtype: str, place: ir.Kernel) -> Chain | None:
    produced = {o.kernel.outputs[0] for o in ops}
    inputs = list(dict.fromkeys(t for o in ops for t in o.operands if t not in produced))
    outputs = [o.kernel.outputs[0] for o in ops
               if o.kernel.outputs[0] in keep or any(r not in members for r in readers.get(o.kernel.outputs[0], ()))]
    if not outputs:
        return None
    kinds = [_broadcast(tensors[t].shape, shape) or "f" for t in inputs]
    flat = not any(k in "rcg" for k in kinds)
    source = _source(ops, inputs, kinds, outputs, flat, half_dtype)
    out_dtypes = [np.dtype(np.bool_) if tensors[t].dtype == "bool" else np.dtype(np.float32) for t in outputs]
    in_dtypes = [np.dtype(np.bool_) if tensors[t].dtype == "bool" else np.dtype(np.float32) for t in inputs]

    def in_place(same: tuple[int, ...]) -> tuple[Callable[..., None], Callable[..., None]]:
        return _compiled(_source(ops, inputs, kinds, outputs, flat, half_dtype, same))
    fn = _runner(*_compiled(source), in_place, shape, kinds, in_dtypes, out_dtypes, flat)
    return Chain([o.kernel for o in ops], inputs, outputs, fn, source, place)


# ---- code generation --------------------------------------------------------------------------------------

def _to_half_lines(x: str, out: str, half_dtype: str) -> list[str]:
    """`out = round_half(x)` for one float32 value: kernels/half.py's loops, the same operations."""
    if half_dtype == FLOAT32_MODE:
        return [f"{out} = {x}"]
    fmt = half_format(half_dtype)
    if fmt.name == "float16":  # the hardware's conversion (half.to_float16)
        return [f"{out} = _to_float16({x})"]
    if fmt.exponent_bits == 8:  # _round_bfloat16
        return [f"{out}u = np.int64(_f2u({x}))",
                f"{out} = {x} if {x} != {x} else _u2f(np.uint32(((({out}u >> 16) & 1) + {out}u + 0x7FFF) "
                f"& 0xFFFF0000))"]
    shift = 23 - fmt.mantissa_bits
    lo, hi, step = (fmt.min_exponent + 127) << 23, (254 - shift) << 23, shift << 23
    up, down = float(2.0 ** (127 - fmt.bias)), float(2.0 ** (fmt.bias - 127))
    return [f"{out}u = np.int64(_f2u({x}))",  # _round_narrow
            f"{out}b = _u2f(np.uint32(min(max({out}u & 0x7F800000, {lo}), {hi}) + {step}))",
            f"{out}r = (((abs({x}) + {out}b) - {out}b) * np.float32({up!r})) * np.float32({down!r})",
            f"{out} = _u2f(np.uint32(np.int64(_f2u({out}r)) | ({out}u & 0x80000000)))"]


def _op_lines(op: _Op, args: list[str], out: str, half_dtype: str) -> list[str]:
    kind = op.op
    if kind in _BINARY:
        return [f"{out} = {_BINARY[kind].format(*args)}"]
    if kind in _UNARY:
        return [f"{out} = {_UNARY[kind].format(*args)}"]
    if kind in _COMPARE:
        return [f"{out} = {args[0]} {_COMPARE[kind]} {args[1]}"]
    if kind in _LOGICAL:
        return [f"{out} = {_LOGICAL[kind].format(*args)}"]
    if kind == "rsqrt":  # reciprocal(sqrt(x)): two roundings
        return [f"{out}s = np.sqrt({args[0]})", f"{out} = np.float32(1.0) / {out}s"]
    if kind == "squared_difference":
        return [f"{out}d = {args[0]} - {args[1]}", f"{out} = {out}d * {out}d"]
    if kind == "tanh":  # TF's float32 form (kernels/eigen_tanh.py): a rational function of exactly rounded ops
        return eigen_tanh.chain_lines(args[0], out)
    if kind == "cube":  # square(x) * x
        return [f"{out}q = {args[0]} * {args[0]}", f"{out} = {out}q * {args[0]}"]
    if kind == "select":
        return [f"{out} = {args[1]} if {args[0]} else {args[2]}"]
    if kind == "add_n":  # copy of the first, then += each in order
        lines = [f"{out} = {args[0]}"]
        return lines + [f"{out} = {out} + {a}" for a in args[1:]]
    if kind == "to_half":
        return _to_half_lines(args[0], out, half_dtype)
    if kind == "tile":  # its input is read broadcast (a column, row or scalar of the chain's shape)
        return [f"{out} = {args[0]}"]
    if kind in _GRAD:
        return [line.format(*args, o=out) for line in _GRAD[kind]]
    raise AssertionError(kind)


def _source(ops: list[_Op], inputs: list[int], kinds: list[str], outputs: list[int], flat: bool,
            half_dtype: str, same: Sequence[int] = ()) -> str:
    """The loop's module source: `loop(a0.., o0.., lo, hi)` over flat elements or over rows [lo, hi).

    `same` (`_same_arrays`), when given: per input, then per output, the index of the input whose array it is
    (-1 for none; an input's own index for itself). The loop then takes each array once: an input that is an
    earlier one is read through it, an output that is an input is written into it (after the iteration has read
    it). Else LLVM's overlap check fails on the arrays that are one and the loop runs scalar (an Adam update
    2.9x slower)."""
    sources = list(range(len(inputs))) if not same else list(same[:len(inputs)])
    name = {t: f"a{sources[i]}" for i, t in enumerate(inputs)}
    local = {t: f"x{i}" for i, t in enumerate(inputs)}
    store = [f"o{j}" if not same or same[len(inputs) + j] < 0 else f"a{same[len(inputs) + j]}"
             for j in range(len(outputs))]
    args = [f"a{i}" for i in range(len(inputs)) if sources[i] == i] + [o for o in store if o.startswith("o")]
    outer = [f"    {local[t]} = {name[t]}[0]" for t, k in zip(inputs, kinds) if k == "s"]
    at = "e" if flat else "r, c"
    # Unsigned bounds: with a signed index numba wraps negative ones around, and LLVM, unable to rule out
    # lo < 0, leaves the loop scalar (an optimizer update's chain ran 2.4-4.4x slower).
    bounds = "range(np.uint64(lo), np.uint64(hi))"
    if flat:
        header = [f"    for e in {bounds}:"]
        indent = "        "
    else:
        header = [f"    cols = {store[0]}.shape[1]"]
        header += [f"    {local[t]}g = {store[0]}.shape[0] // {name[t]}.shape[0]"
                   for t, k in zip(inputs, kinds) if k == "g"]
        header += [f"    for r in {bounds}:"]
        header += [f"        {local[t]} = {name[t]}[r]" for t, k in zip(inputs, kinds) if k == "c"]
        header += [f"        {local[t]}r = {name[t]}[r // {local[t]}g]" for t, k in zip(inputs, kinds) if k == "g"]
        header += ["        for c in range(cols):"]
        indent = "            "
    body = [f"{indent}{local[t]} = {name[t]}[{at if k == 'f' else 'c'}]" for t, k in zip(inputs, kinds) if k in "fr"]
    body += [f"{indent}{local[t]} = {local[t]}r[c]" for t, k in zip(inputs, kinds) if k == "g"]
    for i, op in enumerate(ops):
        out = f"t{i}"
        body += [indent + line for line in _op_lines(op, [local[t] for t in op.operands], out, half_dtype)]
        local[op.kernel.outputs[0]] = out
    body += [f"{indent}{store[j]}[{at}] = {local[t]}" for j, t in enumerate(outputs)]
    return "\n".join([f"# cerebras_tf chain loop, generated by wse/chains.py {_CODEGEN_STAMP}",
                      "import numpy as np",
                      "from numba import prange",
                      "from cerebras_tf.wse.chains import _f2u, _u2f",
                      "from cerebras_tf.wse.denormals import enter_in_loop, leave_in_loop",
                      "from cerebras_tf.wse.kernels.half import to_float16 as _to_float16",
                      "",
                      "",
                      f"def loop({', '.join(args)}, lo, hi):  # pragma: no cover",
                      *outer, *header, *body,
                      "",
                      "",
                      f"def parallel_loop(state, parts, lo, hi, {', '.join(args)}):  # pragma: no cover",
                      "    for p in prange(parts):",
                      "        before = enter_in_loop(state)",
                      f"        loop({', '.join(args)}, lo + (hi - lo) * p // parts,"
                      " lo + (hi - lo) * (p + 1) // parts)",
                      "        leave_in_loop(before)",
                      ""])


# ---- bit casts for to_half (kernels/_jit's intrinsics, under the names the generated sources import) ---------

_f2u = _jit.f2u
_u2f = _jit.u2f


# ---- compiling and caching --------------------------------------------------------------------------------

_compiled_loops: dict[str, tuple[Callable[..., None], Callable[..., None]]] = {}
_lock = threading.Lock()


def cache_dir() -> str:
    """Where generated loop sources (and numba's cache of them, in __pycache__) are kept."""
    configured = os.environ.get(CACHE_ENV_VAR)
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cerebras_tf", "chains")


# Loops of another code generation (another cerebras_tf) are removed once their directory has gone this long
# without a new loop or a process that uses it: an install that still runs them writes them again.
STALE_AFTER_SECONDS = 14 * 24 * 3600
_pruned: set[str] = set()  # cache dirs this process has pruned


def _loop_dir() -> str:
    """This code generation's directory in cache_dir() (named after _CODEGEN_STAMP); on the first call in a
    process, marked as in use (its mtime) and every stale loop of another generation removed."""
    root = cache_dir()
    directory = os.path.join(root, _CODEGEN_STAMP)
    if root not in _pruned:
        _pruned.add(root)
        try:
            os.makedirs(directory, exist_ok=True)
            os.utime(directory)
            _remove_stale(root)
        except OSError:
            pass
    return directory


def _remove_stale(root: str) -> None:
    """Remove what in `root` is not this generation's and has not changed for STALE_AFTER_SECONDS: the
    directories of other generations, and the chain_*.py files (with numba's caches of them) that versions
    before the per-generation directories wrote straight into `root`."""
    now = time.time()

    def stale(path: str) -> bool:
        try:
            return now - os.stat(path).st_mtime > STALE_AFTER_SECONDS
        except OSError:
            return False
    with os.scandir(root) as entries:
        for entry in entries:
            generation = len(entry.name) == len(_CODEGEN_STAMP) and set(entry.name) <= set(string.hexdigits)
            if generation and entry.name != _CODEGEN_STAMP and entry.is_dir() and stale(entry.path):
                shutil.rmtree(entry.path, ignore_errors=True)
            elif entry.name.startswith("chain_") and entry.name.endswith(".py") and stale(entry.path):
                with contextlib.suppress(OSError):
                    os.remove(entry.path)
    legacy = os.path.join(root, "__pycache__")
    if os.path.isdir(legacy):
        for name in os.listdir(legacy):
            path = os.path.join(legacy, name)
            if name.startswith("chain_") and stale(path):
                with contextlib.suppress(OSError):
                    os.remove(path)


def _write_source(source: str, digest: str) -> str | None:
    """The path of a file holding `source` (written once, atomically), or None where none can be written."""
    directory = _loop_dir()
    path = os.path.join(directory, f"chain_{digest}.py")
    try:
        with open(path, encoding="utf-8") as existing:
            if existing.read() == source:
                return path
    except OSError:
        pass
    try:
        os.makedirs(directory, exist_ok=True)
        fd, temp = tempfile.mkstemp(suffix=".tmp", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(source)
        os.replace(temp, path)
    except OSError:
        return None
    return path


def _compiled(source: str) -> tuple[Callable[..., None], Callable[..., None]]:
    """The numba dispatchers for `source`'s loop and parallel_loop (threads.run_loop's), one per source per
    process, each compiled on its first call: from a file in cache_dir() (so numba's disk cache keeps their
    machine code) where one can be written, else exec'd (compiled every run)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    with _lock:
        pair = _compiled_loops.get(digest)
        if pair is not None:
            return pair
        path = _write_source(source, digest)
        namespace: dict[str, Any]
        cache = path is not None
        if path is not None:
            name = f"cerebras_tf_chain_{digest}"
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            namespace = vars(module)
        else:
            namespace = {}
            exec(compile(source, f"<chain {digest}>", "exec"), namespace)
        options = dict(cache=cache, nogil=True, fastmath=False, error_model="numpy")
        loop = _jit._numba.njit(**options)(namespace["loop"])
        namespace["loop"] = loop  # what parallel_loop calls
        pair = loop, _jit._numba.njit(parallel=True, **options)(namespace["parallel_loop"])
        _compiled_loops[digest] = pair
        return pair


def _writable(x: np.ndarray, dtype: np.dtype) -> bool:
    """Whether the loop can write `x` as it is: a writable C-contiguous array of `dtype`."""
    return x.dtype == dtype and x.flags.c_contiguous and x.flags.writeable


def _same_arrays(inputs: Sequence[np.ndarray], kinds: Sequence[str], in_dtypes: Sequence[np.dtype],
                 outs: Sequence[np.ndarray]) -> tuple[int, ...]:
    """Per input, then per output: the index of the first input read element by element ("f") that is the very
    same array (an input's own index, an output's -1, where none is); () where no two are one. Only an array
    the loop reads as it is (C-contiguous, of its dtype) counts."""
    full = [i for i, (x, kind, dtype) in enumerate(zip(inputs, kinds, in_dtypes))
            if kind == "f" and x.dtype == dtype and x.flags.c_contiguous]
    same = [next((i for i in full if i < k and inputs[i] is x), k) if k in full else k for k, x in enumerate(inputs)]
    same += [next((i for i in full if inputs[i] is o), -1) for o in outs]
    if all(i == k for k, i in enumerate(same[:len(inputs)])) and all(i < 0 for i in same[len(inputs):]):
        return ()
    return tuple(same)


def _runner(loop: Callable[..., None], parallel_loop: Callable[..., None],
            in_place: Callable[[tuple[int, ...]], tuple[Callable[..., None], Callable[..., None]]], shape: list[int],
            kinds: list[str], in_dtypes: list[np.dtype], out_dtypes: list[np.dtype], flat: bool) -> KernelFn:
    """The KernelFn that lays out the arrays for `loop` and runs it (split over numba's threads when big). An
    output goes into a new array, the variable attrs["into"] names, or the input attrs["reuse"] names (the
    executor's `_reuse_dead_inputs`, where that input is an array the loop can write). Where an output is an
    input's array, or two inputs are one, it runs `in_place(same)`'s loops instead (`_same_arrays`; compiled
    on first use, kept per pattern)."""
    size = math.prod(shape)
    cols = shape[-1] if shape and shape[-1] > 0 else 1
    rows = size // cols
    if flat:
        span, per = size, LOOP_MIN_ELEMENTS_PER_THREAD
    else:
        span, per = rows, max(1, LOOP_MIN_ELEMENTS_PER_THREAD // cols)
    variants: dict[tuple[int, ...], tuple[Callable[..., None], Callable[..., None]]] = {}

    def fn(inputs: list[np.ndarray], attrs: Mapping[str, Any], ctx: KernelContext) -> list[np.ndarray]:
        args = []
        for x, kind, dtype in zip(inputs, kinds, in_dtypes):
            x = np.ascontiguousarray(x, dtype=dtype)
            args.append(x.reshape(-1, cols) if kind in "fg" and not flat else x.reshape(-1))
        into = attrs.get("into")  # per output: the index of the variable it is written into, or -1
        reuse = attrs.get("reuse")  # per output: the index of the input (nothing else reads) it may take, or -1
        if into or reuse:
            outs = []
            for j, dtype in enumerate(out_dtypes):
                var, take = into[j] if into else -1, reuse[j] if reuse else -1
                outs.append(ctx.variables[var] if var >= 0 else inputs[take] if take >= 0 and _writable(
                    inputs[take], dtype) else empty_aligned(shape, dtype))
        else:
            outs = [empty_aligned(shape, dtype) for dtype in out_dtypes]
        views = [o.reshape(-1) if flat else o.reshape(rows, cols) for o in outs]
        same = _same_arrays(inputs, kinds, in_dtypes, outs) if into or reuse else ()
        if same:
            pair = variants.get(same)
            if pair is None:
                pair = variants[same] = in_place(same)
            arrays = [a for i, a in enumerate(args) if same[i] == i]
            arrays += [v for j, v in enumerate(views) if same[len(args) + j] < 0]
            run_loop(*pair, arrays, span, per)
        else:
            run_loop(loop, parallel_loop, [*args, *views], span, per)
        return [o for o, j in zip(outs, into) if j < 0] if into else outs
    return fn
