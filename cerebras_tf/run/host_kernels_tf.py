"""TensorFlow's own CPU kernels (oneDNN) as the simulated WSE's host kernels, and the choice of provider.

The executor (wse/, TF-free) takes its dense arithmetic from a `HostKernels`
provider; this one runs TensorFlow's ops on the numpy operands: MatMul,
BatchMatMulV2, Conv2D, Conv2DBackpropInput/Filter, DepthwiseConv2dNative and
its two gradients. Each distinct call (op, operand shapes, attrs) becomes a
one-op graph with a tf.compat.v1.Session of its own, built on first use and
run through TF's C-level callable (no session.run in Python on each call):
TF's graph passes give it the oneDNN kernels a training graph gets, which
eager calls of the same raw ops miss for some shapes (a 3-channel first
layer's filter gradient: 2.0 ms eager, 0.95 ms in the session), and a call
costs less than an eager one, which the zoo CNN's step feels most (measured
alternating in one process: 30.8 -> 28.2 ms with the callables, then 27.8
-> 27.0 with its matmuls in sessions too, where they had been eager calls).
Kernels the executor hands over together (`together`: a convolution's input
and filter gradients) share one graph, whose executor runs them at once.
A call's plan (TF's or numpy's, the graph's callable, the operands' layout) is
made on its first call and kept per attrs object and operand shapes (`_Plans`):
the executor hands the same attrs every step, so a step's call is the callable
and a few microseconds of Python (the zoo CNN's step 1-1.6% faster).
A matmul of at most SMALL_MATMUL_MACS multiply-adds (a classifier's dense
layer) runs on numpy's OpenBLAS on the calling thread instead, held to one
thread: there TF's call, whose threads have to wake, costs more than the
arithmetic (the zoo CNN's step about 1% faster).
It is only the arithmetic: the WSE kernels around it keep the numerics
contract (float32 operands, already rounded to the half dtype; float32
accumulation; the result cast back), so a run differs from the numpy provider
only by the order in which float32 products are summed.

What TF's CPU kernels refuse goes to the numpy provider, call by call: integer
operands, dilated gradients (and dilated strided or depthwise forwards),
negative (cropping) explicit paddings. NCHW is transposed to NHWC around the
call, as the numpy provider does, so TF builds without NCHW CPU kernels work.

Two providers (`PROVIDERS`): "numpy" (numpy/OpenBLAS) and "tensorflow" (with
float32 numerics the run's convolutions and big matmuls are then TF's own,
summation order included). A run uses one of them: "auto" (`host_kernels_for`,
the default of `system_host_kernels`, which CEREBRAS_TF_HOST_KERNELS overrides)
takes TF's for a program with convolutions (1.5-5x faster than im2col on
OpenBLAS) and numpy's otherwise (OpenBLAS's matmuls beat TF's at every shape
benchmarks/kernels_bench.py times, by 0.1-1 ms a call: the MLP step 0.6x -> 0.9x
of TF's). TF's provider takes OpenBLAS only on one thread (the small matmuls):
OpenBLAS's own threads keep spinning after a call and slow TF's next
convolution on the same cores (the zoo CNN's step with TF's convolutions and
OpenBLAS's matmuls on all its threads: 55 ms, against 32 ms all on TF).
"""
from __future__ import annotations

import dataclasses
import enum
import os
import threading
from typing import Any, Callable, Mapping, Sequence, cast

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from cerebras_tf import ir
from cerebras_tf.wse import threads
from cerebras_tf.wse.kernels import NUMPY_HOST_KERNELS, DenseKernel, HostKernels

ENV_VAR = "CEREBRAS_TF_HOST_KERNELS"
_R = tf.raw_ops
_numpy = NUMPY_HOST_KERNELS
_logged: set[tuple[str, str]] = set()


def _floats(inputs: Sequence[np.ndarray]) -> bool:
    return all(x.dtype == np.float32 for x in inputs)


class _CachedGraphs:
    """TF ops run as cached small graphs: `callable_for(key, build, operands)` is the callable feeding operands
    of these shapes to placeholders and returning the results of `build(*placeholders)` (a list of tensors),
    built once per key and shapes. Each has a graph and Session of its own, so one is built while another runs
    on a second thread (a graph must not change while a Session runs it)."""

    def __init__(self) -> None:
        self._calls: dict[Any, tuple[Any, Callable[..., list[np.ndarray]]]] = {}
        self._lock = threading.Lock()

    def callable_for(self, key: Any, build: Callable[..., list[Any]],
                     operands: Sequence[np.ndarray]) -> Callable[..., list[np.ndarray]]:
        key = (key, tuple(x.shape for x in operands))
        built = self._calls.get(key)
        if built is None:
            graph = tf.Graph()
            with graph.as_default():
                placeholders = [tf.compat.v1.placeholder(tf.as_dtype(x.dtype), x.shape) for x in operands]
                results = build(*placeholders)
            session = tf.compat.v1.Session(graph=graph)
            built = (session, _callable(session, results, placeholders))
            with self._lock:
                built = self._calls.setdefault(key, built)
        return built[1]


def _callable(session: Any, results: Sequence[Any], placeholders: Sequence[Any]) -> Callable[..., list[np.ndarray]]:
    """`session`'s callable computing `results` from the placeholders' values: TF's own C-level callable
    (Session._make_callable_from_options, which Keras's v1 backend uses too) where the Session has it; the
    public make_callable, which runs a whole session.run (feed dict, fetch handler) on each call when the
    callable takes feeds, otherwise: a 3x3 convolution of a 64x16x16x32 input, 2.30 -> 1.95 ms a call."""
    make = getattr(session, "_make_callable_from_options", None)
    if make is None:  # pragma: no cover - every supported TF has it
        return cast(Callable[..., list[np.ndarray]], session.make_callable(list(results), placeholders))
    return cast(Callable[..., list[np.ndarray]],
                make(config_pb2.CallableOptions(feed=[p.name for p in placeholders], fetch=[r.name for r in results])))


_graphs = _CachedGraphs()


def _freeze(attrs: Mapping[str, Any]) -> tuple:
    """attrs as a hashable key."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))


def _as_is(y: np.ndarray) -> np.ndarray:
    return y


def _same(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    return list(inputs)


@dataclasses.dataclass(frozen=True)
class _Call:
    """One TF op (a tf.raw_ops function) on a provider field's inputs: `names` its operands as the op names them,
    `feed` makes them from the inputs (NCHW transposed to NHWC), `finish` turns its result into the provider's
    (NHWC back to NCHW)."""

    op: Any
    names: tuple[str, ...]
    attrs: Mapping[str, Any]
    feed: Callable[[Sequence[np.ndarray]], list[np.ndarray]] = _same
    finish: Callable[[np.ndarray], np.ndarray] = _as_is

    def key(self) -> tuple:
        return (self.op.__name__, _freeze(self.attrs), self.names)

    def build(self, fed: Sequence[Any]) -> Any:
        return self.op(**dict(zip(self.names, fed)), **self.attrs)


# A provider field's TF call for its operands and attrs, or None where TF's CPU kernels refuse the call (or
# _OnBlas where numpy's kernel on one OpenBLAS thread is faster).
_CallFor = Callable[[Sequence[np.ndarray], Mapping[str, Any]], "_Call | _OnBlas | None"]


class _OnBlas(enum.Enum):
    """A call numpy's kernel makes on one OpenBLAS thread, faster than TF's: a small matmul."""

    SMALL = enum.auto()


# Matmuls of at most this many multiply-adds run on OpenBLAS on the calling thread: TF's call costs more than their
# arithmetic (measured in a loop here: 64x4096x10, the zoo CNN's dense layer, 0.113 ms in TF against 0.086 on one
# OpenBLAS thread, and 0.22 against 0.11 inside its step, where TF's threads have to wake first; 64x1024x256
# 0.194 against 0.176; from 128x512x512 TF's two threads win). Held to one thread, OpenBLAS leaves no thread
# spinning on the cores TF's next call needs.
SMALL_MATMUL_MACS = 1 << 24


def _matmul_call(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> _Call | _OnBlas | None:
    """MatMul (TF's oneDNN sgemm); integer operands on numpy; a small one (SMALL_MATMUL_MACS) on one OpenBLAS
    thread."""
    if not _floats(inputs):
        return None
    a, b = inputs
    transpose_a, transpose_b = bool(attrs.get("transpose_a", False)), bool(attrs.get("transpose_b", False))
    rows, depth = (a.shape[1], a.shape[0]) if transpose_a else a.shape
    columns = b.shape[0] if transpose_b else b.shape[1]
    if rows * depth * columns <= SMALL_MATMUL_MACS:
        return _OnBlas.SMALL
    return _Call(_R.MatMul, ("a", "b"), {"transpose_a": transpose_a, "transpose_b": transpose_b})


def _batch_matmul_call(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> _Call | None:
    """BatchMatMulV2, broadcasting batch dimensions; integer operands on numpy."""
    if not _floats(inputs):
        return None
    a, b = inputs
    return _Call(_R.BatchMatMulV2, ("x", "y"), {"adj_x": bool(attrs.get("adj_x", False)),
                                                "adj_y": bool(attrs.get("adj_y", False))})


class _Conv:
    """A convolution's attrs in TF's NHWC form (NCHW operands are transposed around the call)."""

    def __init__(self, attrs: Mapping[str, Any]) -> None:
        self.nchw = str(attrs.get("data_format", "NHWC")).startswith("NC")
        padding = attrs.get("padding", "VALID")
        self.padding = padding.decode() if isinstance(padding, bytes) else str(padding)
        self.strides = self._nhwc(attrs.get("strides"))
        self.dilations = self._nhwc(attrs.get("dilations"))
        pairs = [int(v) for v in attrs.get("explicit_paddings") or []]
        if pairs and self.nchw:
            pairs = pairs[0:2] + pairs[4:8] + pairs[2:4]
        self.explicit = pairs if self.padding == "EXPLICIT" else []

    def _nhwc(self, values: Sequence[int] | None) -> list[int]:
        v = [int(x) for x in values] if values else [1, 1, 1, 1]
        if len(v) == 2:
            return [1, v[0], v[1], 1]
        return [v[0], v[2], v[3], v[1]] if self.nchw else v

    @property
    def dilated(self) -> bool:
        return self.dilations != [1, 1, 1, 1]

    def supported(self, backprop: bool = False, depthwise: bool = False) -> bool:
        """What TF's CPU kernels run: no cropping paddings; dilations only in a plain stride-1 forward."""
        if any(p < 0 for p in self.explicit):
            return False
        if self.dilated and (backprop or depthwise or self.strides != [1, 1, 1, 1]):
            return False
        return True

    def kw(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"strides": self.strides, "padding": self.padding, "dilations": self.dilations}
        if self.explicit:
            kw["explicit_paddings"] = self.explicit
        return kw

    def to_nhwc(self, x: np.ndarray) -> np.ndarray:
        return x.transpose(0, 2, 3, 1) if self.nchw else x

    def sizes(self, sizes: Sequence[int]) -> list[int]:
        s = [int(v) for v in sizes]
        return [s[0], s[2], s[3], s[1]] if self.nchw else s

    def back(self, y: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(y.transpose(0, 3, 1, 2)) if self.nchw else y


def _conv_call(op: Any, operands: tuple[str, str], sizes: str | None = None, backprop: bool = False,
               depthwise: bool = False) -> _CallFor:
    """The TF call of `op` on the two operands (named as `op` names them; the "input"/"out_backprop" ones in
    NHWC) and the static sizes attr, or None for a call TF refuses. Its result is NHWC but for a filter
    gradient (HWIO in every data format)."""
    def call(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> _Call | None:
        c = _Conv(attrs)
        if not c.supported(backprop=backprop, depthwise=depthwise):
            return None
        kw = c.kw()
        if sizes == "input_sizes":
            kw[sizes] = c.sizes(attrs[sizes])
        elif sizes == "filter_sizes":
            kw[sizes] = [int(v) for v in attrs[sizes]]
        data = [name in ("input", "out_backprop") for name in operands]

        def feed(values: Sequence[np.ndarray]) -> list[np.ndarray]:
            return [np.ascontiguousarray(c.to_nhwc(x)) if d else x for d, x in zip(data, values)]
        return _Call(op, operands, kw, feed, _as_is if sizes == "filter_sizes" else c.back)
    return call


_CALLS: dict[str, _CallFor] = {
    "matmul": _matmul_call,
    "batch_matmul": _batch_matmul_call,
    "conv2d": _conv_call(_R.Conv2D, ("input", "filter")),
    "conv2d_backprop_input": _conv_call(_R.Conv2DBackpropInput, ("filter", "out_backprop"), "input_sizes",
                                        backprop=True),
    "conv2d_backprop_filter": _conv_call(_R.Conv2DBackpropFilter, ("input", "out_backprop"), "filter_sizes",
                                         backprop=True),
    "depthwise_conv2d": _conv_call(_R.DepthwiseConv2dNative, ("input", "filter"), depthwise=True),
    "depthwise_conv2d_backprop_input": _conv_call(_R.DepthwiseConv2dNativeBackpropInput, ("filter", "out_backprop"),
                                                  "input_sizes", backprop=True, depthwise=True),
    "depthwise_conv2d_backprop_filter": _conv_call(_R.DepthwiseConv2dNativeBackpropFilter,
                                                   ("input", "out_backprop"), "filter_sizes", backprop=True,
                                                   depthwise=True),
}


def _not_in_tf(field: str, call: _OnBlas | None, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
    """The numpy provider's `field` where TF refuses the call (None), on one OpenBLAS thread for an _OnBlas call."""
    if call is None:
        return getattr(_numpy, field)(inputs, attrs)
    with threads.one_blas_thread():
        return getattr(_numpy, field)(inputs, attrs)


_Member = tuple[str, Sequence[np.ndarray], Mapping[str, Any]]  # a provider field, its inputs and attrs
_Plan = Callable[[Sequence[Sequence[np.ndarray]]], list[np.ndarray]]  # members' inputs -> their results


def _plan(members: Sequence[_Member]) -> _Plan:
    """How the members (provider calls given together, or one) run: TF's calls in one graph, whose executor runs
    independent ones at once, resolved to its callable here; the rest on numpy; each member alone where TF
    refuses any of several. The plan takes the members' inputs of another call of the same shapes."""
    calls = [_CALLS[field](inputs, attrs) for field, inputs, attrs in members]
    if len(members) > 1 and any(call is None for call in calls):
        alone = [_plan([member]) for member in members]
        return lambda inputs: [plan([x])[0] for plan, x in zip(alone, inputs)]
    in_graph = [(i, call) for i, call in enumerate(calls) if isinstance(call, _Call)]
    bounds = [0]
    for _, call in in_graph:
        bounds.append(bounds[-1] + len(call.names))

    def build(*fed: Any) -> list[Any]:
        return [call.build(fed[bounds[j]:bounds[j + 1]]) for j, (_, call) in enumerate(in_graph)]

    def operands(inputs: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
        return [x for i, call in in_graph for x in call.feed(inputs[i])]
    graph = (_graphs.callable_for(tuple(call.key() for _, call in in_graph), build,
                                  operands([m[1] for m in members])) if in_graph else None)
    others = [(i, field, call, attrs) for i, (call, (field, _, attrs)) in enumerate(zip(calls, members))
              if not isinstance(call, _Call)]

    def run(inputs: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
        results: list[Any] = [None] * len(inputs)
        if graph is not None:
            for (i, call), y in zip(in_graph, graph(*operands(inputs))):
                results[i] = call.finish(np.asarray(y))
        for i, field, other, attrs in others:
            results[i] = _not_in_tf(field, other, inputs[i], attrs)
        return results
    return run


class _Plans:
    """Each provider call's plan (`_plan`), made on its first call and reused for calls of the same fields,
    attrs (the same objects: the executor's kernels hand theirs on every step) and operand shapes and dtypes:
    the attrs are read, the graph found and the operands' layout decided once, not on every call (in a loop, a
    conv call's Python about 30 -> 3 us, a pair's about 70 -> 12 us)."""

    LIMIT = 4096  # plans kept; all are dropped past it (a program has a few dozen)

    def __init__(self) -> None:
        self._plans: dict[tuple, tuple[tuple[Mapping[str, Any], ...], _Plan]] = {}

    def run(self, members: Sequence[_Member]) -> list[np.ndarray]:
        key = tuple((field, id(attrs), tuple((x.shape, x.dtype.char) for x in inputs))
                    for field, inputs, attrs in members)
        found = self._plans.get(key)
        if found is None or any(kept is not attrs for kept, (_, _, attrs) in zip(found[0], members)):
            plan = _plan(members)
            if len(self._plans) >= self.LIMIT:
                self._plans.clear()
            self._plans[key] = (tuple(attrs for _, _, attrs in members), plan)  # kept: their ids are not reused
        else:
            plan = found[1]
        return plan([inputs for _, inputs, _ in members])


_plans = _Plans()


def _kernel(field: str) -> DenseKernel:
    """The provider function `field`: its TF call in a one-op graph, or the numpy provider's `field` for a call
    TF refuses."""
    def kernel(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
        return _plans.run([(field, inputs, attrs)])[0]
    kernel.__name__ = kernel.__qualname__ = field
    return kernel


def together(calls: Sequence[tuple[str, Sequence[np.ndarray], Mapping[str, Any]]]) -> list[np.ndarray]:
    """Several dense kernels (field, operands, attrs) in one graph, which TF's executor runs side by side (the
    zoo CNN's input and filter gradients of a 3x3 convolution: 4.2 -> 3.7 ms together, the same bits); one by
    one where TF refuses any of them."""
    return _plans.run(calls)


TENSORFLOW_HOST_KERNELS = HostKernels(
    name="tensorflow",
    **{field: _kernel(field) for field in _CALLS},
    together=together,
    spinning_pool=True,
)

PROVIDERS = {p.name: p for p in (NUMPY_HOST_KERNELS, TENSORFLOW_HOST_KERNELS)}
CHOICES = ("auto", *PROVIDERS)


def host_kernels_for(program: ir.Program, choice: str = "auto") -> HostKernels:
    """The provider `choice` names, or for "auto" the faster one for `program`: TensorFlow's kernels when it
    has convolutions, numpy/OpenBLAS otherwise (its matmuls are faster than TF's at every shape measured)."""
    if choice != "auto":
        return PROVIDERS[choice]
    has_conv = any(ir.KINDS[k.kind] == "conv" for k in program.kernels)
    return TENSORFLOW_HOST_KERNELS if has_conv else NUMPY_HOST_KERNELS


def system_host_kernels(program: ir.Program) -> HostKernels:
    """The provider for a run of `program` on the simulated system: CEREBRAS_TF_HOST_KERNELS's choice (auto,
    tensorflow, numpy; default auto, see host_kernels_for). Logged once per process, choice and provider."""
    choice = os.environ.get(ENV_VAR, "").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"{ENV_VAR}={os.environ[ENV_VAR]!r}: expected one of {', '.join(sorted(CHOICES))}")
    provider = host_kernels_for(program, choice)
    if (choice, provider.name) not in _logged:
        _logged.add((choice, provider.name))
        library = ("TensorFlow's CPU kernels (oneDNN)" if provider is TENSORFLOW_HOST_KERNELS
                   else "numpy/OpenBLAS")
        why = (f"{ENV_VAR}={choice}" if choice != "auto" else "the program has convolutions"
               if provider is TENSORFLOW_HOST_KERNELS else "the program has no convolutions")
        tf.compat.v1.logging.info("The simulated WSE computes its matmuls and convolutions with %s (%s), in the "
                                  "WSE's numerics (half inputs, float32 accumulation).", library, why)
    return provider
