"""The simulated WSE executor: runs a compiled Program with numpy (never imports TensorFlow).

One `Executor` holds the weights "on the wafer" between steps. A training
step runs in three phases, which the IR's kernel roles make safe:

1. every kernel except the optimizer-role and global_step_update kernels, in
   program order: forward, the gradient seed, backward and state updates
   (e.g. batch-norm moving averages); the gradient seed is multiplied by the
   loss scale when a GradScaler is given;
2. loss scaling: the tensors in `program.gradients` are unscaled and checked
   (and clipped, if the scaler has max_gradient_norm; without clipping in one
   pass each, kernels/unscale.py, into the arrays the step owns outright); then the
   optimizer-role kernels, in program order; if a gradient is not finite,
   their variable writes are skipped (so no weight or optimizer slot changes)
   but their other kernels run, so every program output (e.g. a gradient norm
   streamed to a host_call) exists on every step. `step` moves work from here
   into phase 1 where it may (`_early_layout`: no clipping, no phase-1 unit
   reading a gradient): each gradient's unscaling, a unit run once the gradient
   exists, and the optimizer-role units that write nothing and read only what
   phase 1 made (the l2_losses of a global norm), as TF runs them; the same bits;
3. the global-step update, which runs on every step (unless guarded).

A kernel with a `guard` (the writes of an if-converted tf.cond branch) runs
only when its guard tensor is True; one with a `check_guard` (a look-up in such
a branch) refuses bad input only when that tensor is True (KernelContext.check).
A model that guards its own weight update
(`program.model_loss_scaling`: TF's loss-scale optimizer) is run without a
GradScaler: its own scale variables are updated by its own kernels. No phase
reads a tensor a later phase produces: the constructor checks this on the
program and refuses it otherwise. Half precision: the compiler's `to_half`
kernels round their input to the half dtype (float32 storage); matmul/conv
accumulate in float32; weights and updates stay float32. With the half dtype
set to "float32" (`cerebras_tf.amp.set_half_dtype("float32")`) nothing is
rounded and a run matches TensorFlow on CPU step by step. The dense arithmetic
(matmul, convolutions and their gradients) comes from `host_kernels`, a provider
the caller may hand in (numpy/OpenBLAS by default; kernels/host_kernels.py). Within a phase,
kernels whose inputs are ready run at once on the host's threads (wse/dataflow.py: the same bits
as one at a time, in program order, which CEREBRAS_TF_EXECUTOR_THREADS=1 or `threads=1` selects).
A relu that is the only reader of a bias_add's or fused_batch_norm's output runs fused into it, as
does a relu_grad into the max_pool_grad or avg_pool_grad before it: one pass, the same bits (wse/fusion.py);
a max_pool keeps its windows' winning taps for its gradient, which then does not read the pooled input again
(fusion.winning_taps).
Chains of elementwise kernels (an Adam update, layer-norm and GELU arithmetic, a `to_half` after them)
run as one generated numba loop each, where the last member is, with the same bits (wse/chains.py; off
with CEREBRAS_TF_FUSE_CHAINS=0 or CEREBRAS_TF_JIT=0); with chains on, phase 1's elementwise kernels that
only the optimizer reads and that read only variables and constants (a slot times its decay) run in phase 2.
A chain writes an output into the array of an input nothing else reads, made new that step (as TF's kernels
forward an input's buffer; `_reuse_dead_inputs`), instead of into a new array; so does a lone bias_add, and a
to_half (float16, bfloat16) rounds such an array where it is.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from cerebras_tf.amp import FLOAT32_MODE, GradScaler, get_half_dtype
from cerebras_tf import ir
from cerebras_tf.wse import chains as _chains
from cerebras_tf.wse import dataflow, denormals, memory, spin_wait, threads
from cerebras_tf.wse.fusion import (WITH_KNOWN_MAXIMA, BatchNormReluPool, BiasReluPool, batch_norm_relu_pools,
                                    bias_relu_pools, dense_groups, fused_pairs, known_maxima, lazy_transposes,
                                    rounding_pairs, roundings_beside_sums, taken_by_tail, transposed_outputs,
                                    winning_taps)
from cerebras_tf.wse.kernels import (DENSE_KINDS, KERNELS, NUMPY_HOST_KERNELS, HostKernels, KernelContext,
                                    KernelInputError, np_dtype)
from cerebras_tf.wse.kernels._registry import KernelFn
from cerebras_tf.wse.kernels.data import transpose_view
from cerebras_tf.wse.kernels.fused import FUSED, ROUNDED_AS_WRITTEN, ROUNDED_BESIDE, batch_norm_relu_max_pool
from cerebras_tf.wse.kernels.half import NO_ROUNDING, round_half, round_half_in_layout, rounding_code, rounds_in_place
from cerebras_tf.wse.kernels.linalg import provided_together
from cerebras_tf.wse.kernels.pool import avg_pool_grad_of_bias_relu, avg_pool_of_bias_relu
from cerebras_tf.wse.kernels.unscale import unscale_gradients

# Kinds whose kernel hands on a view of its input (a copy only of an input that is not contiguous).
_VIEWS = frozenset({"reshape", "squeeze", "expand_dims"})
# Kinds whose output is a view of their input or a new array (a transpose is a view when lazy).
_VIEW_OR_NEW = _VIEWS | {"transpose"}
# Kinds whose output may be a view of (or the same array as) an input.
_MAY_ALIAS = frozenset({"reshape", "squeeze", "expand_dims", "unstack", "split", "split_v", "slice",
                        "strided_slice", "cast", "to_half", "transpose"})


@dataclasses.dataclass
class StepResult:
    """What a step streams back to the host."""

    outputs: dict[str, np.ndarray]  # program.outputs keys: "loss", "host_call/<path>", "summary/<tag>", ...
    finite: bool = True  # gradients were finite (the update was applied)
    loss_scale: float | None = None  # the scale used for this step (None without a GradScaler)

    @property
    def loss(self) -> float | None:
        loss = self.outputs.get("loss")
        return None if loss is None else float(loss)


@dataclasses.dataclass
class _Planned:
    """One kernel (or a fused pair: the kernel and its `tail`; or two dense kernels in one provider call: the
    kernel and the one `beside` it; or a chain), resolved once for every step.

    For a chain (wse/chains.py), `kernel` is a stand-in of kind "chain" (the id of the member it runs where:
    chain.place; the chain's inputs and outputs, no guard) and `chain` the chain itself."""

    kernel: ir.Kernel
    fn: Callable[[list[np.ndarray], Mapping, KernelContext], list[np.ndarray]]
    ctx: KernelContext
    writes: bool  # writes variables (skipped on a non-finite step with a GradScaler)
    tail: ir.Kernel | None = None  # fused into this one (wse/fusion.py): its output replaces kernel's first
    chain: _chains.Chain | None = None  # the chain this stands for
    beside: ir.Kernel | None = None  # computed in the same call (fusion.dense_groups: of the provider;
    # roundings_beside_sums: of a ROUNDED_BESIDE kernel); fn takes and returns both kernels' inputs and outputs,
    # the kernel's first
    absorbed: list[ir.Kernel] = dataclasses.field(default_factory=list)  # assigns the chain writes for
    taken: list[int] = dataclasses.field(default_factory=list)  # the tail's inputs fn takes after the kernel's

    @property
    def alone(self) -> bool:
        """Whether this is one kernel, run unguarded: no tail, nothing beside it, not a chain."""
        return self.tail is None and self.beside is None and self.chain is None and self.kernel.guard is None

    @property
    def members(self) -> list[ir.Kernel]:
        """The program's kernels this runs."""
        if self.chain is not None:
            return [*self.chain.kernels, *self.absorbed]
        return [self.kernel, *(k for k in (self.tail, self.beside) if k is not None)]

    @property
    def inputs(self) -> list[int]:
        """The tensors fn takes."""
        if self.beside is not None:
            return [*self.kernel.inputs, *self.beside.inputs]
        return [*self.kernel.inputs, *self.taken] if self.taken else self.kernel.inputs

    @property
    def outputs(self) -> list[int]:
        """The tensors fn's results are stored as."""
        if self.beside is not None:
            return [*self.kernel.outputs, *self.beside.outputs]
        if self.tail is None:
            return self.kernel.outputs
        return [self.tail.outputs[0], *self.kernel.outputs[1:]]

    @property
    def reads(self) -> list[int]:
        """Every tensor the unit reads (each once): the kernel's and its tail's, but not what passes between."""
        if self.beside is not None:
            return list(dict.fromkeys([*self.kernel.reads, *self.beside.reads]))
        if self.tail is None:
            return list(dict.fromkeys(self.kernel.reads))
        inner = self.kernel.outputs[0]
        return list(dict.fromkeys([*self.kernel.reads, *(t for t in self.tail.reads if t != inner)]))


class _InOrder(NamedTuple):
    """A unit as one thread runs it, in program order (`Executor._run_in_order`): its wiring resolved once per
    layout instead of through _Planned's properties and dataflow's callbacks on every step."""

    planned: _Planned  # its fn is read on each call (a profiler may wrap it)
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    guard: int | None
    check: int | None  # the kernel's check_guard
    writes: bool
    drops: tuple[int, ...]  # the tensors no later unit of the phase reads (dataflow.Schedule.drops_in_order)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """A step's units phase by phase (forward and backward; optimizer; global step), with their dependency
    graphs (wse/dataflow.py), and as one thread runs them (`in_order`)."""

    plans: tuple[list[_Planned], ...]
    schedules: tuple[dataflow.Schedule, ...]
    unscaled_early: bool = False  # units of the first phase unscale the gradients, not a pass between phases
    in_order: tuple[tuple[_InOrder, ...], ...] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "in_order", tuple(
            tuple(_InOrder(p, tuple(p.inputs), tuple(p.outputs), p.kernel.guard, p.kernel.check_guard, p.writes,
                           drops) for p, drops in zip(plan, schedule.drops_in_order()))
            for plan, schedule in zip(self.plans, self.schedules)))


def _average(arrays: list[np.ndarray]) -> np.ndarray:
    """The mean of the systems' arrays (float), in system order; a non-float array is the first system's."""
    first = arrays[0]
    if not np.issubdtype(first.dtype, np.floating):
        return first
    total = np.array(first, dtype=np.float32 if first.dtype.itemsize < 4 else first.dtype, copy=True)
    for array in arrays[1:]:
        total += array
    return (total / len(arrays)).astype(first.dtype, copy=False)


def _combine(arrays: list[np.ndarray]) -> np.ndarray:
    """One output of several systems: float scalars averaged, anything else the first system's (the host's
    summary and host_call graphs take one system's shapes)."""
    first = np.asarray(arrays[0])
    return _average([np.asarray(a) for a in arrays]) if first.ndim == 0 else first


# Rough host speeds for `dense_bound`: dense arithmetic (FLOP/s) and memory-bound kernels (bytes/s).
_DENSE_FLOPS_PER_SECOND = 100e9
_BYTES_PER_SECOND = 5e9


def estimated_seconds(program: ir.Program, kernel: ir.Kernel) -> float:
    """A rough run time of one kernel on the host: a dense one's FLOPs, any other's bytes read and written."""
    if kernel.kind in DENSE_KINDS:
        return kernel.flops / _DENSE_FLOPS_PER_SECOND
    return sum(program.tensors[t].size * np_dtype(program.tensors[t].dtype).itemsize
               for t in (*kernel.inputs, *kernel.outputs)) / _BYTES_PER_SECOND


def dense_bound(program: ir.Program) -> bool:
    """Whether the program's dense kernels (matmul, convolutions) take most of a step, by a rough estimate
    (`estimated_seconds`): the MLP yes (61%), the zoo transformer (24%) and CNN (38%) no."""
    dense = sum(estimated_seconds(program, k) for k in program.kernels if k.kind in DENSE_KINDS)
    other = sum(estimated_seconds(program, k) for k in program.kernels if k.kind not in DENSE_KINDS)
    return dense > other


# Kinds whose kernel hands out a new array of its own every call, or (bias_add) one of its dead inputs' (an array
# a later unit may write into).
_FRESH = frozenset({"unsorted_segment_sum", "random_uniform", "bias_add", "add_n", "pad", "bias_add_grad"})


def _with_out_perm(fn: KernelFn, perm: tuple[int, ...]) -> KernelFn:
    """`fn` (a batch_matmul) asked to lay its result out for the transpose by `perm` that reads it
    (fusion.transposed_outputs; a provider that takes no out_perm returns it contiguous)."""
    def laid_out(inputs: list[np.ndarray], attrs: Mapping, ctx: KernelContext) -> list[np.ndarray]:
        return fn(inputs, {**attrs, "out_perm": perm}, ctx)
    return laid_out


class Executor:
    """Runs `program` on numpy arrays; `variables` maps every program variable name to its value.
    `host_kernels` provides the dense arithmetic (numpy/OpenBLAS when None); `threads`: how many kernels
    may run at once (1: one at a time, in program order; None: CEREBRAS_TF_EXECUTOR_THREADS, else the
    faster of 1 and every core, measured on the first steps: dataflow.ThreadChoice; 1 where dense kernels
    dominate the step or the provider's library keeps its own threads on the cores: HostKernels.spinning_pool,
    whatever CEREBRAS_TF_EXECUTOR_THREADS asks, though a value that is no thread count is refused there too)."""

    def __init__(self, program: ir.Program, variables: Mapping[str, np.ndarray],
                 grad_scaler: GradScaler | None = None, half_dtype: str | None = None,
                 host_kernels: HostKernels | None = None, threads: int | None = None) -> None:
        missing = [v.name for v in program.variables if v.name not in variables]
        if missing:
            raise ValueError(f"no value for program variables {missing}")
        memory.keep_freed_memory()  # a step's arrays reuse the last step's memory instead of faulting in new pages
        self._pool = memory.BufferPool()  # big arrays' buffers, shared by the threads of a multi-thread step
        self.program = program
        self.grad_scaler = grad_scaler
        self.half_dtype = half_dtype or get_half_dtype()
        self.host_kernels = host_kernels or NUMPY_HOST_KERNELS
        self._variables = {  # on 64-byte boundaries, as TF's kernels (the "tensorflow" provider) read them uncopied
            v.name: memory.aligned_copy(variables[v.name], np_dtype(v.dtype)) for v in program.variables}
        self._constants = {t.id: program.constant_value(t.id) for t in program.tensors if t.const is not None}
        program.verify()  # among others: no kernel reads a tensor of a later phase
        self._phases = ir.phases(program)
        self._keep = set(program.outputs.values()) | set(program.gradients)
        if _chains.enabled():  # an optimizer slot's decay joins its update's chain
            self._phases = _chains.defer_to_update(self._phases, program.tensors, self._keep)
        ordered = [k for kernels in self._phases for k in kernels]  # the program's kernels, phase after phase
        self._readers = ir.readers(ordered)  # in program order
        self._known_maxima = known_maxima(ordered)
        pairs = [fused_pairs(kernels, self._readers, self._keep) for kernels in self._phases]  # per phase
        folds = [bias_relu_pools(kernels, self._readers, self._keep, phase_pairs)
                 for kernels, phase_pairs in zip(self._phases, pairs)]
        self._winning_taps = winning_taps(ordered, self._known_maxima, {p: t for d in pairs for p, t in d.items()},
                                          program.tensors)
        normalized_pools = [batch_norm_relu_pools(kernels, self._readers, self._keep, phase_pairs, self._winning_taps)
                            for kernels, phase_pairs in zip(self._phases, pairs)]
        self._lazy_transposes = lazy_transposes(ordered, self._readers, self._keep)
        self._out_perms = transposed_outputs(ordered, self._readers, self._keep)
        self._shared_reads, self._views = self._reads_without_copy(ordered)
        shared = {program.kernels[i].outputs[0]: self._variables[program.kernels[i].vars[0]]
                  for i in self._shared_reads}
        self._shared_values = set(shared)  # the tensors that are the variables' arrays
        self._bound = {**self._constants, **shared}  # what every step starts from (a shared read runs as no unit)
        self._scale: float | None = None
        # OpenBLAS sums some products (the MLP's 256x784x500) in another order on two threads than on one, so
        # how many it uses is fixed per program, never by timing: one (the executor splits big products
        # itself, into blocks fixed by their shapes: host_numpy._blocks) unless dense kernels dominate the
        # step, where side by side has little to win
        self._hold_blas = not dense_bound(program)
        # A provider whose library keeps its own threads on every core after each call (TF's pool): one kernel at
        # a time, as where dense kernels dominate. Side by side, our kernels and its threads oversubscribe the
        # cores (the zoo CNN's step 7% slower on two threads in float32, 14% in float16), and ThreadChoice's
        # trials, steps a few percent apart, still picked two in some runs.
        side_by_side = self._hold_blas and not self.host_kernels.spinning_pool
        requested = dataflow.thread_choices()  # a bad CEREBRAS_TF_EXECUTOR_THREADS is refused wherever it is set
        choices = requested if side_by_side else (1,)
        self._threads = dataflow.ThreadChoice((threads,) if threads is not None else choices)
        self._threads_now = self._threads.next()
        self._plans = tuple(self._plan(*phase) for phase in zip(self._phases, pairs, folds, normalized_pools))
        made_new = self._made_new()
        self._reuse_dead_inputs(*made_new)
        self._unscale_in_place = self._owned_gradients(*made_new)
        self._systems_layout = self._layout(self._plans)  # step_systems: the update after the gradients' average
        self._step_layout = self._early_layout() or self._systems_layout
        self._gradients_finite: list[bool] = []  # this step's, from the early layout's unscaling units

    # ---- public -------------------------------------------------------------------
    def variables(self) -> dict[str, np.ndarray]:
        """A copy of every variable (downloading the weights from the wafer)."""
        return {name: value.copy() for name, value in self._variables.items()}

    @property
    def threads(self) -> int | None:
        """The thread count kernels run on (None while the first steps still measure which is faster)."""
        return self._threads.chosen

    @property
    def global_step(self) -> int:
        name = self.program.global_step
        return int(self._variables[name]) if name in self._variables else 0

    def step(self, features: Any, labels: Any = None) -> StepResult:
        """Run the program once on one batch.

        Raises KernelInputError (with `kernel` set) where TF's CPU kernel would refuse the batch, e.g. a
        label out of range for sparse softmax cross entropy.

        `features` and `labels` are numpy arrays or nests of them (dict/tuple/list, as the input
        pipeline produced them); labels may be None when the program does not read labels. Their
        leaves are matched to the program inputs by `ir.input_leaves` keys; leaves the program has
        no input for are ignored.
        """
        values: dict[int, np.ndarray] = dict(self._bound)
        values.update(self._bind_inputs(features, labels))
        step = self.global_step
        scale = self.grad_scaler.scale if self.grad_scaler is not None else None
        self._gradients_finite = []
        with self._stepping():
            self._run(self._step_layout, 0, values, step, scale)
            finite = self._update(self._step_layout, values, step, scale)
        outputs = {key: values[tid] for key, tid in self.program.outputs.items()}
        return StepResult(outputs=outputs, finite=finite, loss_scale=scale)

    def step_systems(self, batches: Sequence[tuple[Any, Any]]) -> StepResult:
        """Run one data-parallel step on ``len(batches)`` systems, each on its own (features, labels) batch.

        As SwarmX does: every system runs the forward and backward pass from
        the same weights on its batch (phase 1); their gradients are averaged
        (the sum of each system's gradients of its loss divided by the number
        of systems, as R1.8's appliance scales the loss), then loss scaling and
        the one optimizer update run on the average (phases 2 and 3). A model
        whose loss is a mean over its batch so takes the step one system would
        take on all the batches together. State the forward pass updates
        (batch-norm moving averages) is averaged over the systems too. The
        outputs: each system's float scalars (the loss, scalar summaries)
        averaged, any other tensor the first system's (the host's summary and
        host_call graphs take one system's batch).

        Raises ValueError (see `ir.data_parallel_problem`) for a program the
        average does not cover.
        """
        if len(batches) == 1:
            return self.step(*batches[0])
        problem = ir.data_parallel_problem(self.program)
        if problem is not None:
            raise ValueError(problem)
        step = self.global_step
        scale = self.grad_scaler.scale if self.grad_scaler is not None else None
        written = sorted({name for p in self._plans[0] if p.writes for name in p.kernel.vars})
        before = {name: self._variables[name].copy() for name in written}
        runs: list[dict[int, np.ndarray]] = []
        after: list[dict[str, np.ndarray]] = []
        with self._stepping():
            for features, labels in batches:
                for name in written:  # every system starts from the same state
                    self._variables[name][...] = before[name]
                values: dict[int, np.ndarray] = dict(self._bound)
                values.update(self._bind_inputs(features, labels))
                self._run(self._systems_layout, 0, values, step, scale)
                runs.append(values)
                after.append({name: self._variables[name].copy() for name in written})
            for name in written:
                self._variables[name][...] = _average([state[name] for state in after])
            values = dict(runs[0])
            for tid in self.program.gradients:
                values[tid] = _average([run[tid] for run in runs])
            finite = self._update(self._systems_layout, values, step, scale)
        outputs = {}
        for key, tid in self.program.outputs.items():
            produced_later = tid not in runs[1]  # by the optimizer or global-step phase: computed once
            outputs[key] = values[tid] if produced_later else _combine([run[tid] for run in runs])
        return StepResult(outputs=outputs, finite=finite, loss_scale=scale)

    # ---- internals ----------------------------------------------------------------
    @contextlib.contextmanager
    def _stepping(self) -> Iterator[None]:
        """One step: on the thread count the ThreadChoice gives (its time is what the choice measures), with
        denormals flushed as TF's kernels flush them, and numpy's floating-point warnings off: non-finite
        values are the GradScaler's (or the model's own loss scaling's) to handle, and the untaken branch of
        an if-converted tf.cond may compute anything. OpenBLAS is held to one thread for the step where the
        executor splits work itself (`_hold_blas`), and compiled loops to the calling thread where the provider's
        threads spin (HostKernels.spinning_pool): once a step, not once a phase. Unless the ThreadChoice has
        chosen one thread, big arrays' buffers come from the executor's BufferPool (memory.py: one pool for
        every thread, where malloc would keep a heap per thread; in the trial's one-thread steps too, which
        would otherwise grow malloc's heap beside the pool). With a provider whose threads spin, the host's cores
        are kept from idling meanwhile (spin_wait.cores_awake): each of its calls wakes its pool's threads, which wait
        for their cores to wake too where those idle (the zoo CNN's step 0.95x the time; the numpy provider's
        models, whose threads hand work to each other within the step, measured no faster)."""
        self._threads_now = self._threads.next()
        start = time.perf_counter()
        with (spin_wait.cores_awake() if self.host_kernels.spinning_pool else contextlib.nullcontext(),
              denormals.flushing(), np.errstate(over="ignore", invalid="ignore", divide="ignore"),
              threads.one_blas_thread() if self._hold_blas else contextlib.nullcontext(),
              threads.one_loop_thread() if self.host_kernels.spinning_pool else contextlib.nullcontext(),
              memory.pooled(self._pool) if self._threads.chosen != 1 else contextlib.nullcontext()):
            yield
        self._threads.record(self._threads_now, time.perf_counter() - start)
        if self._threads.chosen == 1:  # the pool's buffers back to malloc, whose one heap serves one thread better
            self._pool.clear()

    def _update(self, layout: _Layout, values: dict[int, np.ndarray], step: int, scale: float | None) -> bool:
        """Phases 2 and 3 on phase 1's `values`: unscale and check the gradients (unless the layout's first
        phase did), the optimizer kernels (their writes skipped on a non-finite step), the loss scale's update,
        the global step. Whether the gradients were finite."""
        finite = True
        if self._plans[1]:
            finite = all(self._gradients_finite) if layout.unscaled_early else self._unscale_and_check(values)
            self._run(layout, 1, values, step, scale, skip_writes=not finite)
            if self.grad_scaler is not None:
                self.grad_scaler.update(finite)
        self._run(layout, 2, values, step, scale)
        return finite

    def _bind_inputs(self, features: Any, labels: Any) -> dict[int, np.ndarray]:
        """Program input tensor id -> the batch's array, checked against the compiled shapes."""
        given = {**ir.input_leaves("features", features), **ir.input_leaves("labels", labels)}
        bound = {}
        for key, tid in self.program.inputs.items():
            tensor = self.program.tensors[tid]
            if key not in given:
                side = key.split("/", 1)[0]
                have = sorted(k for k in given if k.split("/", 1)[0] == side)
                raise ValueError(f"the program needs {key} (shape {tensor.shape}), but the batch has "
                                 f"{', '.join(have) if have else f'no {side}'}")
            bound[tid] = self._as_input(key, given[key], tensor)
        return bound

    def _as_input(self, key: str, array: np.ndarray, tensor: ir.Tensor) -> np.ndarray:
        array = np.asarray(array, dtype=np_dtype(tensor.dtype))
        if list(array.shape) != list(tensor.shape):
            raise ValueError(f"{key} has shape {list(array.shape)}, the compiled program expects {tensor.shape} "
                             "(the batch size is fixed at compile time)")
        return array

    def _plan(self, kernels: list[ir.Kernel], pairs: Mapping[int, ir.Kernel], folds: Sequence[BiasReluPool] = (),
              normalized_pools: Sequence[BatchNormReluPool] = ()) -> list[_Planned]:
        """Resolve each kernel (or fused pair, or chain) of a phase once: its function and context. Pairs
        (`pairs`: the phase's fusion.fused_pairs) first, then chains (wse/chains.py) among the other kernels;
        a bias_add -> relu of `folds` (fusion.bias_relu_pools) runs as no unit of its own: its pool and
        the pool's gradient take its inputs; the max_pool of a fused_batch_norm -> relu of `normalized_pools`
        (fusion.batch_norm_relu_pools) runs in the batch norm's unit (with the to_half of its output, which
        then runs as no unit), and its gradient from the taps alone."""
        planned = []
        pairs = dict(pairs)  # the roundings in place join them
        # float16, bfloat16: a normalized pool's output rounded as the pool writes it (BatchNormReluPool.rounding)
        round_pooled = self.half_dtype != FLOAT32_MODE and rounds_in_place(self.half_dtype)
        folded = ({k.id for f in folds for k in (f.bias_add, f.relu)} | {f.pool.id for f in normalized_pools}
                  | {f.rounding.id for f in normalized_pools if f.rounding is not None and round_pooled})
        fold_of = {k.id: f for f in folds for k in (f.pool, f.grad)}
        normalized_of = {k.id: f for f in normalized_pools for k in (f.batch_norm, f.grad)}
        tails = {tail.id for tail in pairs.values()}
        chains = self._chains(kernels, exclude=set(pairs) | tails | folded)
        chain_of = {m.id: chain for chain in chains for m in chain.kernels}
        if self.half_dtype != FLOAT32_MODE and rounds_in_place(self.half_dtype):  # (float32: to_half is free)
            rounded = rounding_pairs(kernels, self._readers, self._keep, exclude={*pairs, *tails, *chain_of})
            pairs.update(rounded)
            tails.update(tail.id for tail in rounded.values())
        groups = (dense_groups(kernels, exclude={*pairs, *tails, *chain_of})
                  if self.host_kernels.together is not None else {})
        if rounding_code(self.half_dtype) != NO_ROUNDING:  # float16, bfloat16, with numba
            groups.update(roundings_beside_sums(kernels, exclude={*pairs, *tails, *chain_of, *groups,
                                                                  *(k.id for k in groups.values())}))
        by_id = {k.id: k for k in kernels}
        first_of = {second.id: by_id[first] for first, second in groups.items()}
        position = {k.id: i for i, k in enumerate(kernels)}
        into = {id(chain): self._assigns_into(chain, kernels, position) for chain in chains}
        absorbed = {a.id for assigns in into.values() for a in assigns.values()}
        for kernel in kernels:
            chain = chain_of.get(kernel.id)
            if (kernel.id in tails or kernel.id in absorbed or kernel.id in groups or kernel.id in self._shared_reads
                    or kernel.id in folded or (chain is not None and chain.place is not kernel)):
                continue
            beside = None
            if kernel.id in first_of:  # run at the second's place, the first kernel's outputs first
                kernel, beside = first_of[kernel.id], kernel
            tail = pairs.get(kernel.id)
            fn: Callable[..., list[np.ndarray]]
            assigns: dict[int, ir.Kernel] = {}
            taken: list[int] = []
            if chain is not None:
                fn = chain.fn
                assigns = into[id(chain)]
                written = [assigns[t].vars[0] for t in chain.outputs if t in assigns]
                kernel = ir.Kernel(id=kernel.id, kind="chain", inputs=chain.inputs,
                                   outputs=[t for t in chain.outputs if t not in assigns],
                                   attrs={"into": [written.index(assigns[t].vars[0]) if t in assigns else -1
                                                   for t in chain.outputs]} if assigns else {},
                                   role=kernel.role, layer=kernel.layer, vars=written,
                                   tf_name=" + ".join(m.tf_name or m.kind
                                                      for m in (*chain.kernels, *assigns.values())))
            elif beside is not None and beside.kind == "to_half":
                fn = ROUNDED_BESIDE[kernel.kind](self.half_dtype)
            elif beside is not None:
                fn = self._together(kernel, beside)
            elif kernel.id in normalized_of:  # the batch norm with its max pool; the pool's gradient
                normalized = normalized_of[kernel.id]
                taps = self._winning_taps[normalized.pool.id]
                if kernel.id == normalized.batch_norm.id:  # its first output the pool's (or its rounding's)
                    rounding = normalized.rounding if round_pooled else None
                    tail = dataclasses.replace(normalized.pool, inputs=kernel.outputs[:1],
                                               outputs=(rounding or normalized.pool).outputs)
                    fn = batch_norm_relu_max_pool(taps, normalized.pool.attrs,
                                                  self.half_dtype if rounding is not None else None)
                else:  # reads its own gradient input alone
                    y = self.program.tensors[kernel.inputs[0]]
                    kernel = dataclasses.replace(kernel, inputs=kernel.inputs[2:])
                    assert tail is not None  # its relu_grad
                    tail = dataclasses.replace(tail, inputs=tail.inputs[:1])
                    fn = taps.max_pool_grad_of_taps(y.shape, np_dtype(y.dtype))
            elif kernel.id in self._winning_taps:  # a max_pool or its gradient (tail: a relu_grad, a to_half)
                taps = self._winning_taps[kernel.id]
                fn = taps.max_pool if kernel.kind == "max_pool" else taps.max_pool_grad
                if tail is not None and tail.kind == "to_half":
                    fn = self._rounding_in_place(fn)
            elif kernel.id in self._known_maxima:
                fn = WITH_KNOWN_MAXIMA["" if tail is None or tail.kind == "to_half" else tail.kind]
                if tail is not None and tail.kind == "to_half":
                    fn = self._rounding_in_place(fn)
            elif kernel.id in fold_of:  # takes the folded bias_add's (x, bias) for the relu's output
                fold = fold_of[kernel.id]
                if kernel.id == fold.pool.id:
                    kernel, fn = dataclasses.replace(kernel, inputs=fold.taken), avg_pool_of_bias_relu
                    if tail is not None:  # a to_half
                        fn = self._rounding_in_place(fn)
                else:
                    assert tail is not None  # its relu_grad
                    tail, fn, taken = (dataclasses.replace(tail, inputs=[tail.inputs[0], *fold.taken]),
                                       avg_pool_grad_of_bias_relu, fold.taken)
            elif tail is not None and tail.kind == "to_half" and kernel.kind in ROUNDED_AS_WRITTEN:
                fn = ROUNDED_AS_WRITTEN[kernel.kind](self.half_dtype)
            elif tail is not None and tail.kind == "to_half":
                fn = self._rounding_in_place(KERNELS[kernel.kind])
            elif tail is not None:
                fn = FUSED[(kernel.kind, tail.kind)].fn
                taken = taken_by_tail(kernel, tail)
            elif kernel.kind in ("gradient_seed", "to_half"):
                fn = getattr(self, f"_{kernel.kind}")
            elif kernel.id in self._lazy_transposes:
                fn = transpose_view
            elif kernel.id in self._out_perms:
                fn = _with_out_perm(KERNELS[kernel.kind], self._out_perms[kernel.id])
            else:
                fn = KERNELS[kernel.kind]
            ctx = KernelContext(variables=[self._variables[name] for name in kernel.vars], salt=kernel.id,
                                host_kernels=self.host_kernels)
            writes = bool(kernel.vars) and kernel.kind not in ir.READS_VARIABLES
            planned.append(_Planned(kernel, fn, ctx, writes, tail=tail, chain=chain, absorbed=list(assigns.values()),
                                    beside=beside, taken=taken))
        return planned

    def _reuse_dead_inputs(self, fresh: set[int], made_by: Mapping[int, _Planned]) -> None:
        """Let units write into an input nothing else reads, as TF's kernels forward an input buffer, where that
        input is a float32 array made new this step (`_dead`): a chain (attrs["reuse"], per chain output: the
        index of the input it is written into, or -1) where the input has the output's shape; a bias_add
        (attrs["reuse"] = [0]) into its value; a to_half (attrs["in_place"]) rounding its input where it is,
        through views of it (float16, bfloat16: `rounds_in_place`). Each checks at run time that the array is
        one it can write. Saves the new array's cold memory: a 4 MB multiply 0.41 -> 0.28 ms."""
        tensors = self.program.tensors
        rounds = self.half_dtype != FLOAT32_MODE and rounds_in_place(self.half_dtype)
        for plan in self._plans:
            for p in plan:
                kernel = p.kernel
                if p.chain is None:
                    if p.alone and kernel.kind == "bias_add" and tensors[kernel.inputs[0]].dtype == "float32" and (
                            self._dead(kernel.inputs[0], {kernel.id}, fresh, made_by)):
                        p.kernel = dataclasses.replace(kernel, attrs={**kernel.attrs, "reuse": [0]})
                    elif p.alone and kernel.kind == "to_half" and rounds and (
                            self._dead(kernel.inputs[0], {kernel.id}, fresh, made_by)):
                        p.kernel = dataclasses.replace(kernel, attrs={**kernel.attrs, "in_place": True})
                    continue
                members = {k.id for k in p.chain.kernels}
                into = kernel.attrs.get("into") or [-1] * len(p.chain.outputs)
                dead = [i for i, t in enumerate(p.chain.inputs) if self._dead(t, members, fresh, made_by)]
                reuse = []
                for t, j in zip(p.chain.outputs, into):
                    fits = [i for i in dead if list(tensors[p.chain.inputs[i]].shape) == list(tensors[t].shape)]
                    take = fits[0] if j < 0 and tensors[t].dtype == "float32" and fits else -1
                    if take >= 0:
                        dead.remove(take)
                    reuse.append(take)
                if any(i >= 0 for i in reuse):
                    p.kernel = dataclasses.replace(kernel, attrs={**kernel.attrs, "reuse": reuse})

    def _made_new(self) -> tuple[set[int], dict[int, _Planned]]:
        """The tensors made new each step by an unguarded unit that hands out only arrays of its own (a chain; a
        kind in `_FRESH`, the numpy provider's dense kinds too), and every unit output's unit."""
        fresh_kinds = _FRESH | (DENSE_KINDS if self.host_kernels is NUMPY_HOST_KERNELS else frozenset())
        fresh = {t for plan in self._plans for p in plan  # (a chain's stand-in kernel has no guard)
                 if p.chain is not None or (p.alone and p.kernel.kind in fresh_kinds) for t in p.outputs}
        return fresh, {t: p for plan in self._plans for p in plan for t in p.outputs}

    def _owned_gradients(self, fresh: set[int], made_by: Mapping[int, _Planned]) -> frozenset[int]:
        """The gradients whose arrays the loss scale's unscaling may overwrite (`_unscale_and_check`): float32,
        named once among the gradients, read by no kernel of the first phase (so no view of one exists when it
        runs; an output that is the gradient itself shows it unscaled either way), and made new this step
        (`fresh`; a chain's outputs written into variables are not its unit's) or a view of such an array that
        nothing else read."""
        first_phase = {k.id for k in self._phases[0]}
        owned = set()
        for t, count in collections.Counter(self.program.gradients).items():
            p = made_by.get(t)
            if (count != 1 or p is None or self.program.tensors[t].dtype != "float32"
                    or first_phase & set(self._readers.get(t, ()))):
                continue
            if t in fresh or (p.alone and p.kernel.kind in _VIEW_OR_NEW and self._dead(
                    p.kernel.inputs[0], {p.kernel.id}, fresh, made_by)):
                owned.add(t)
        return frozenset(owned)

    def _dead(self, tensor: int, readers: set[int], fresh: set[int], made_by: Mapping[int, _Planned]) -> bool:
        """Whether `tensor`'s array is for `readers` (kernel ids) alone to overwrite: float32, not kept, read by
        them only, and made new this step (`fresh`: `_made_new`), or a view of such an array (a reshape,
        squeeze, expand_dims or transpose: a view of its input or a new array) that is dead in turn."""
        while True:
            if (tensor in self._keep or self.program.tensors[tensor].dtype != "float32"
                    or not set(self._readers.get(tensor, ())) <= readers):
                return False
            if tensor in fresh:
                return True
            p = made_by.get(tensor)
            if p is None or not p.alone or p.kernel.kind not in _VIEW_OR_NEW:
                return False
            tensor, readers = p.kernel.inputs[0], {p.kernel.id}

    def _assigns_into(self, chain: _chains.Chain, kernels: list[ir.Kernel],
                      position: Mapping[int, int]) -> dict[int, ir.Kernel]:
        """Chain output -> the assign_variable the chain may write it into directly (its variable's own array)
        instead of a new array the assign would copy: the only reader outside the chain of its every output is
        such an assign (so a step that skips variable writes skips the whole chain), unguarded, of a float32 variable
        of the output's shape, each variable once; nothing between the chain and the assign touches the
        variable; and every chain input that may be the variable's array (a shared read) has its full shape
        and is the array itself (a read_variable's output), read element by element before that element is
        written. Else {}. `kernels`: the phase, `position`: kernel id -> its index there."""
        at = position[chain.place.id]
        assigns: dict[int, ir.Kernel] = {}
        members = {k.id for k in chain.kernels}
        for t in chain.outputs:
            reading = [r for r in self._readers.get(t, []) if r not in members]
            assign = kernels[position[reading[0]]] if len(reading) == 1 and reading[0] in position else None
            if (assign is None or assign.kind != "assign_variable" or assign.guard is not None
                    or assign.check_guard is not None or t in self._keep or assign.inputs != [t]):
                return {}
            var = self.program.variable(assign.vars[0])
            tensor = self.program.tensors[t]
            if var.dtype != "float32" or tensor.dtype != "float32" or list(var.shape) != list(tensor.shape):
                return {}
            assigns[t] = assign
        names = [a.vars[0] for a in assigns.values()]
        if len(set(names)) != len(names):
            return {}
        ours = {a.id for a in assigns.values()}
        for k in kernels[at + 1:max(position[a.id] for a in assigns.values())]:
            if k.id in ours:
                continue
            touched = set(k.vars) | {name for r in k.reads for name in self._views.get(r, ())}
            if touched & set(names):
                return {}
        for r in chain.inputs:  # element i of a variable's array is read by the loop before it writes element i
            if self._views.get(r, set()) & set(names) and (r not in self._shared_values or list(
                    self.program.tensors[r].shape) != list(self.program.tensors[chain.outputs[0]].shape)):
                return {}
        return assigns

    def _chains(self, kernels: list[ir.Kernel], exclude: set[int]) -> list[_chains.Chain]:
        """The chains of elementwise kernels among `kernels` (none when switched off: chains.enabled())."""
        if not _chains.enabled():
            return []
        return _chains.fuse_chains(kernels, self._readers, self._keep, tensors=self.program.tensors,
                                   half_dtype=self.half_dtype, constants=self._constants, exclude=exclude,
                                   volatile=set(self._views))

    def _layout(self, plans: Sequence[list[_Planned]], unscaled_early: bool = False) -> _Layout:
        """`plans` (one list of units per phase) with each phase's dependency graph; a tensor is dropped in
        the last phase that reads it, once its readers there have finished (never one kept: `_keep`)."""
        last_phase = {t: i for i, plan in enumerate(plans) for p in plan for t in p.reads}
        return _Layout(tuple(plans), tuple(
            self._schedule(plan, {t for p in plan for t in p.reads if last_phase[t] == i and t not in self._keep})
            for i, plan in enumerate(plans)), unscaled_early)

    def _early_layout(self) -> _Layout | None:
        """The layout `step` runs where the optimizer phase's units that write nothing and read only what the
        first phase has (the l2_losses of a global norm, the clipping factor: the zoo transformer's 42 of 81
        units) can run in it, as soon as what they read exists, and the loss scale's unscaling with them, one
        unit per gradient (`_unscaling_unit`; the finiteness is known once the phase ends): as TF runs a
        gradient's ops once it is computed. The units compute what they did after the barrier (the same
        bits). None where there is nothing to move, or the gradients must all exist first: a GradScaler that
        clips (by their global norm), a gradient read in the first phase or named twice."""
        forward, optimizer, last = self._plans
        scaler, gradients = self.grad_scaler, self.program.gradients
        if (not optimizer or (scaler is not None and scaler.clips) or len(set(gradients)) != len(gradients)
                or set(gradients) & {t for p in forward for t in p.reads}):
            return None
        written = {name for p in (*optimizer, *last) if p.writes for name in p.kernel.vars}
        have = {t for p in forward for t in p.outputs} | set(self._bound) | set(gradients)
        early, late = [], []
        for p in optimizer:
            if ((p.alone or p.chain is not None) and not p.writes and p.kernel.check_guard is None
                    and p.kernel.kind not in ir.CHECKS_INPUT and set(p.reads) <= have
                    and not self._var_reads(p) & written):
                early.append(p)
                have.update(p.outputs)
            else:
                late.append(p)
        unscaling = [self._unscaling_unit(i, t) for i, t in enumerate(gradients)] if scaler is not None else []
        if not early and not unscaling:
            return None
        return self._layout((forward + unscaling + early, late, last), unscaled_early=scaler is not None)

    def _unscaling_unit(self, index: int, gradient: int) -> _Planned:
        """A unit that unscales `gradient` (into its own array where the step owns it: `_owned_gradients`) as
        `_unscale_and_check` would, its value then the unscaled one, and notes whether it is finite."""
        in_place = [gradient in self._unscale_in_place]

        def unscale(inputs: list[np.ndarray], attrs: Mapping, ctx: KernelContext) -> list[np.ndarray]:
            assert self.grad_scaler is not None
            grads, finite = unscale_gradients(inputs, self.grad_scaler.reciprocal, in_place)
            self._gradients_finite.append(finite)
            return grads
        kernel = ir.Kernel(id=-1 - index, kind="unscale", inputs=[gradient], outputs=[gradient], attrs={},
                           role="optimizer", tf_name=f"unscale {self.program.tensors[gradient].name}")
        return _Planned(kernel, unscale, KernelContext(variables=[], salt=kernel.id, host_kernels=self.host_kernels),
                        writes=False)

    def _var_reads(self, p: _Planned) -> set[str]:
        """The variables unit `p` reads: through a view of a variable's array (a shared read's), or itself."""
        var_reads = {name for t in p.reads for name in self._views.get(t, ())}
        if p.kernel.kind in ir.READS_VARIABLES:
            var_reads.update(p.kernel.vars)
        return var_reads

    def _schedule(self, plan: list[_Planned], droppable: set[int]) -> dataflow.Schedule:
        """The phase's dependency graph (wse/dataflow.py): what each unit reads, writes and may refuse;
        `droppable`: the tensors to drop once the phase's readers have finished."""
        units = [dataflow.Access(
            reads=p.reads, outputs=p.outputs, reads_vars=self._var_reads(p),
            writes_vars=p.kernel.vars if p.writes else (),
            checks_input=p.kernel.kind in ir.CHECKS_INPUT,
            cost=estimated_seconds(self.program, p.kernel) if p.chain is not None  # what it stores, not its
            else sum(estimated_seconds(self.program, k) for k in p.members),  # intermediates
            inline=self._is_view(p)) for p in plan]
        return dataflow.Schedule.build(units, droppable)

    def _is_view(self, p: _Planned) -> bool:
        """Whether the unit only hands on a view of its input (dataflow runs it inline): a reshape, squeeze or
        expand_dims, an uncopied transpose, or a to_half in float32 numerics."""
        kernel = p.kernel
        return p.alone and (kernel.kind in _VIEWS or kernel.id in self._lazy_transposes
                            or (kernel.kind == "to_half" and self.half_dtype == FLOAT32_MODE))

    def _run(self, layout: _Layout, phase: int, values: dict[int, np.ndarray], step: int, scale: float | None,
             skip_writes: bool = False) -> None:
        """Run a phase's units on `values`: each unit's outputs stored, each tensor dropped after its last
        reader; a unit that writes variables is skipped with `skip_writes`, a guarded one when its guard is
        False."""
        self._scale = scale
        if self._threads_now <= 1:
            self._run_in_order(layout.in_order[phase], values, step, skip_writes)
            return
        plan = layout.plans[phase]

        def compute(index: int) -> list[np.ndarray]:
            p = plan[index]
            return self._call(p, p.inputs, p.kernel.guard, p.kernel.check_guard, p.writes, values, step, skip_writes)

        def complete(index: int, outputs: list[np.ndarray]) -> None:
            for tid, value in zip(plan[index].outputs, outputs):
                values[tid] = value

        dataflow.run(layout.schedules[phase], compute, complete, values.__delitem__, self._threads_now)

    @staticmethod
    def _run_in_order(units: Sequence[_InOrder], values: dict[int, np.ndarray], step: int, skip_writes: bool) -> None:
        """`_run` on one thread: the units in program order, as dataflow.run's one-thread order runs them (the
        same results and drops), without its per-unit callbacks (the zoo CNN's step 1-2% faster)."""
        for p, inputs, outputs, guard, check, writes, drops in units:
            for t, value in zip(outputs, Executor._call(p, inputs, guard, check, writes, values, step, skip_writes)):
                values[t] = value
            for t in drops:
                del values[t]

    @staticmethod
    def _call(p: _Planned, inputs: Sequence[int], guard: int | None, check: int | None, writes: bool,
              values: Mapping[int, np.ndarray], step: int, skip_writes: bool) -> list[np.ndarray]:
        """`p`'s outputs on the `inputs` of `values`, or none where it is skipped: it writes variables and
        `skip_writes` says so, or its guard is False. Sets the kernel's check (its check guard's value) and step;
        a KernelInputError names the kernel."""
        if (skip_writes and writes) or (guard is not None and not bool(values[guard])):
            return []
        if check is not None:
            p.ctx.check = bool(values[check])
        p.ctx.step = step
        try:
            return p.fn([values[t] for t in inputs], p.kernel.attrs, p.ctx)
        except KernelInputError as error:  # TF's CPU kernel refuses this input: say which kernel
            error.kernel = p.kernel
            raise

    def _gradient_seed(self, inputs: list[np.ndarray], attrs: Mapping, ctx: KernelContext) -> list[np.ndarray]:
        out = self.program.tensors[self.program.kernels[ctx.salt].outputs[0]]
        value = attrs.get("value", 1.0) * (self._scale if self._scale is not None else 1.0)
        return [np.full(out.shape, value, dtype=np_dtype(out.dtype))]

    def _to_half(self, inputs: list[np.ndarray], attrs: Mapping, ctx: KernelContext) -> list[np.ndarray]:
        x = inputs[0]
        if self.half_dtype == FLOAT32_MODE:
            return [x]
        return [round_half_in_layout(x, self.half_dtype, in_place=bool(attrs.get("in_place")))]

    @staticmethod
    def _together(first: ir.Kernel, second: ir.Kernel) -> KernelFn:
        """Two dense kernels in one call of the provider's `together` (fusion.dense_groups): the first's inputs,
        then the second's, in; the first's output, then the second's, out."""
        split = len(first.inputs)

        def together(inputs: list[np.ndarray], attrs: Mapping, ctx: KernelContext) -> list[np.ndarray]:
            return provided_together([(first.kind, inputs[:split], first.attrs),
                                      (second.kind, inputs[split:], second.attrs)], ctx)
        return together

    def _rounding_in_place(self, fn: KernelFn) -> KernelFn:
        """`fn` (a kind in fusion.ROUNDS_IN_PLACE) with its first output rounded to the half dtype, in place where
        it is a writable C-contiguous float32 array sharing no memory with an input, on a 64-byte boundary as a
        new rounded array would be (TensorFlow's kernels copy an operand that is not); else into a new one."""
        def rounding(inputs: list[np.ndarray], attrs: Mapping, ctx: KernelContext) -> list[np.ndarray]:
            outputs = fn(inputs, attrs, ctx)
            first = outputs[0]
            own = (first.dtype == np.float32 and first.flags.c_contiguous and first.flags.writeable
                   and first.ctypes.data % memory.ALIGNMENT == 0
                   and not any(np.may_share_memory(first, x) for x in inputs))
            return [round_half(first, self.half_dtype, out=first if own else None), *outputs[1:]]
        return rounding

    def _reads_without_copy(self, order: list[ir.Kernel]) -> tuple[set[int], dict[int, set[str]]]:
        """read_variable kernels whose value (or a view of it) no kernel uses after the variable is
        next written, and which is not streamed out: their value is the variable's array itself, bound when a
        step starts (`_bound`: they run as no unit). Also
        each tensor that may view such a variable's array -> the variables (a kernel reading it reads them).
        `order`: the program's kernels, phase after phase."""
        position = {k.id: i for i, k in enumerate(order)}
        writes: dict[str, list[int]] = {}
        for k in order:
            if k.kind not in ir.READS_VARIABLES:  # conservatively: every other kernel with variables writes them all
                for name in k.vars:
                    writes.setdefault(name, []).append(position[k.id])
        consumers: dict[int, list[int]] = {}
        for k in order:
            for t in k.reads:
                consumers.setdefault(t, []).append(position[k.id])
        aliases: dict[int, list[int]] = {}  # tensor -> outputs that may view it
        for k in order:
            if k.kind in _MAY_ALIAS:
                for t in k.inputs:
                    aliases.setdefault(t, []).extend(k.outputs)
        shared: set[int] = set()
        views_of: dict[int, set[str]] = {}
        for k in order:
            if k.kind != "read_variable":
                continue
            views, pending = set(), [k.outputs[0]]
            while pending:
                t = pending.pop()
                if t not in views:
                    views.add(t)
                    pending.extend(aliases.get(t, []))
            if views & self._keep:
                continue
            later_writes = [w for w in writes.get(k.vars[0], []) if w > position[k.id]]
            last_read = max((p for t in views for p in consumers.get(t, [])), default=position[k.id])
            if not later_writes or last_read < min(later_writes):
                shared.add(k.id)
                for t in views:
                    views_of.setdefault(t, set()).add(k.vars[0])
        return shared, views_of

    def _unscale_and_check(self, values: dict[int, np.ndarray]) -> bool:
        """Unscale the gradients in `values` and say whether they are all finite (the GradScaler's contract).
        Without clipping, which needs their global norm, in one pass each (kernels/unscale.py), into the arrays
        of those the step owns outright (`_owned_gradients`)."""
        scaler = self.grad_scaler
        if scaler is None:
            return True
        ids = self.program.gradients
        grads = [values[t] for t in ids]
        if scaler.clips:
            result = scaler.unscale_and_check(grads)
            grads, finite = result.grads, bool(result.finite)
        else:
            grads, finite = unscale_gradients(grads, scaler.reciprocal, [t in self._unscale_in_place for t in ids])
        values.update(zip(ids, grads))
        return finite

