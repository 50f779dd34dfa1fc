"""The WSE program IR: plain dataclasses, saved as JSON plus an .npz of constant arrays.

A `Program` is what the executor runs and the placer places; it never refers
to TensorFlow objects. Conventions:

- Tensors have ids, fully static shapes and dtypes ("float32", "int32",
  "int64", "bool", ... and "half": the run-time half dtype, float16 by default,
  bfloat16 or cbfloat16; an executor may hold it as float32 values rounded to
  that format).
- A constant tensor has `const` set: either a scalar `splat` repeated over the
  tensor's shape (never materialised), or an array stored in the .npz under
  `array_key(tensor id)`.
- `kernels` are in execution order: running them one by one in list order
  respects every data dependency and every ordering the TF graph's control
  edges implied (e.g. batch-norm moving averages before the optimizer update).
- A kernel reads its `inputs` (tensor ids) and the variables named in `vars`
  (resource operands, in the TF op's operand order, e.g. apply_adam: [var, m, v]),
  and produces `outputs`. Variable writes happen in place, in kernel order.
- `kind` is one of vocabulary.KINDS, `role` one of vocabulary.ROLES; the gradient seed is a kernel of its own (kind
  "gradient_seed", a splat of ones shaped like the loss) so an executor can
  scale it (loss scaling) and unscale the tensors in `Program.gradients`.
- A kernel with `guard` set (the id of a scalar bool tensor, computed by an
  earlier kernel) runs only when that tensor is True: the variable writes of
  an if-converted tf.cond branch (both branches compute, a select picks the
  outputs, only the taken branch writes). Only variable writes are guarded.
- A kernel with `check_guard` set (likewise a scalar bool tensor id) refuses
  bad input (an index or label out of range: TF's InvalidArgumentError) only
  when that tensor is True, else computes on clamped input: the kinds in
  vocabulary.CHECKS_INPUT inside an if-converted tf.cond branch, which TF
  runs only when the branch is taken (the select discards what they compute).
- Runtime assertions and prints (`assertions`, `prints`) are not kernels: the
  tensors they need are program outputs (keys.ASSERT_PREFIX / PRINT_PREFIX),
  and the host checks and prints after each step what their entries describe.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from cerebras_tf.ir.vocabulary import HALF

IR_VERSION = 2  # 2: Kernel.check_guard


@dataclasses.dataclass
class Const:
    """A constant tensor's value: a scalar splat, or an array in the .npz (splat is None)."""

    splat: float | int | bool | None = None


@dataclasses.dataclass
class Tensor:
    id: int
    shape: list[int]
    dtype: str
    name: str  # the TF tensor it came from (or a synthesised name for inserted kernels)
    const: Const | None = None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclasses.dataclass
class Kernel:
    id: int
    kind: str
    inputs: list[int]
    outputs: list[int]
    attrs: dict[str, Any]
    role: str = "forward"
    layer: str = ""
    vars: list[str] = dataclasses.field(default_factory=list)
    tf_name: str = ""
    tf_type: str = ""
    location: str | None = None  # user's file:line
    flops: int = 0  # estimated per step (whole batch)
    guard: int | None = None  # scalar bool tensor id: run only when it is True (writes in tf.cond branches)
    check_guard: int | None = None  # scalar bool tensor id: refuse bad input only when it is True (see above)

    @property
    def reads(self) -> list[int]:
        """The tensors this kernel reads: its inputs and its guards."""
        if self.guard is None and self.check_guard is None:
            return self.inputs
        return [*self.inputs, *(t for t in (self.guard, self.check_guard) if t is not None)]


@dataclasses.dataclass
class Variable:
    name: str  # TF name, the checkpoint key
    shape: list[int]
    dtype: str
    trainable: bool
    role: str  # one of vocabulary.VARIABLE_ROLES
    slot_of: str | None = None  # for optimizer slots: the trainable variable

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclasses.dataclass
class Layer:
    name: str
    kernels: list[int]
    variables: list[str]


@dataclasses.dataclass
class Program:
    mode: str
    tensors: list[Tensor]
    kernels: list[Kernel]
    variables: list[Variable]
    inputs: dict[str, int]  # input_leaves keys ("features", "features/<key>", "labels", ...) -> tensor id (one batch)
    # "loss", "host_call/<path>" (one per tensor leaf, see host_call_structure), "summary/<tag>",
    # "predictions/<key>" -> tensor id
    outputs: dict[str, int]
    host_call: dict[str, Any] | None = None  # host_call_structure's description: how to rebuild the arguments
    gradient_seed: int | None = None  # kernel id
    gradients: list[int] = dataclasses.field(default_factory=list)  # tensor ids (scale these back)
    global_step: str | None = None  # variable name
    layers: list[Layer] = dataclasses.field(default_factory=list)
    precision_casts: bool = True
    # amp.optimizer_step's settings (GradScaler.config() incl. clipping); None: the default dynamic scaling
    loss_scaling: dict[str, Any] | None = None
    # the model scales its own loss (e.g. TF's loss-scale optimizer guards its weight update): an executor
    # applies no loss scaling of its own, and the model's scale variables are ordinary program variables
    model_loss_scaling: bool = False
    # TRAIN: the model_fn's tf.compat.v1 summaries, tag -> kind; "scalar" and "histogram" are computed as
    # outputs "summary/<tag>" and written by the host, other kinds ("image", "audio", "tensor", "tf2") are not
    summaries: dict[str, str] = dataclasses.field(default_factory=dict)
    # Runtime assertions (tf.debugging.assert_*, tf.Assert), in graph order; the host raises TF's
    # InvalidArgumentError when one fails. Each: {"name": the Assert op, "location": user's file:line or None,
    # "summarize": int, "condition": output key of a scalar bool, "data": [value...]}, where a value is
    # {"output": key, "dtype": str} (streamed each step) or {"constant": nested list, "dtype": str (or "string":
    # text as str, bytes >= 0x80 as surrogate escapes), "shape": [...]} (known at compile time).
    assertions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # tf.print (PrintV2, style "v2") and tf.compat.v1.Print ("v1"), in graph order. Each: {"name", "location",
    # "style", "summarize", "output_stream" (keys.PRINT_STREAMS or "file://<path>"), "end", "first_n" (-1: every
    # step), "pieces": [{"text": str} | value...] (concatenated, values formatted as TF does), "when": output key
    # of a scalar bool (inside a tf.cond branch: print only when it is True) or None, "after": [indices of the
    # assertions this print depends on: it does not print when one of them fails]}.
    prints: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    version: int = IR_VERSION
    arrays: dict[int, np.ndarray] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    # ---- look-ups -------------------------------------------------------
    def tensor(self, tensor_id: int) -> Tensor:
        return self.tensors[tensor_id]

    def variable(self, name: str) -> Variable:
        return next(v for v in self.variables if v.name == name)

    def constant_value(self, tensor_id: int) -> np.ndarray:
        """The value of a constant tensor (a splat is materialised here, on request only)."""
        tensor = self.tensors[tensor_id]
        if tensor.const is None:
            raise ValueError(f"tensor {tensor_id} ({tensor.name}) is not a constant")
        if tensor.const.splat is not None:
            return np.full(tensor.shape, tensor.const.splat, dtype=_np_dtype(tensor.dtype))
        return self.arrays[tensor_id]

    def optimizer_kernels(self) -> list[Kernel]:
        return [k for k in self.kernels if k.role == "optimizer"]

    def verify(self) -> "Program":
        """Check the program is well-formed (see `ir.verify`); returns it, raises IRError listing every problem."""
        from cerebras_tf.ir.verify import verify

        verify(self)
        return self

    def kernel_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for kernel in self.kernels:
            counts[kernel.kind] = counts.get(kernel.kind, 0) + 1
        return dict(sorted(counts.items()))

    # ---- serialisation --------------------------------------------------
    def to_json(self) -> str:
        data = {field.name: getattr(self, field.name) for field in dataclasses.fields(self) if field.name != "arrays"}
        data["tensors"] = [{**vars(t), "const": vars(t.const) if t.const is not None else None} for t in self.tensors]
        for name in ("kernels", "variables", "layers"):
            data[name] = [vars(item) for item in data[name]]
        return json.dumps(data, indent=None, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, arrays: dict[int, np.ndarray] | None = None) -> "Program":
        data = json.loads(text)
        if data.get("version") != IR_VERSION:
            raise ValueError(f"IR version {data.get('version')} is not {IR_VERSION}")
        tensors = [Tensor(**{**t, "const": Const(**t["const"]) if t["const"] is not None else None})
                   for t in data.pop("tensors")]
        kernels = [Kernel(**k) for k in data.pop("kernels")]
        variables = [Variable(**v) for v in data.pop("variables")]
        layers = [Layer(**layer) for layer in data.pop("layers")]
        return cls(tensors=tensors, kernels=kernels, variables=variables, layers=layers,
                   arrays=dict(arrays or {}), **data)

    def save(self, directory: str) -> list[str]:
        """Write program.json and constants.npz into `directory`; returns the file names."""
        with open(os.path.join(directory, PROGRAM_FILE), "w", encoding="utf-8") as f:
            f.write(self.to_json())
        arrays: dict[str, Any] = {array_key(tid): np.asarray(a) for tid, a in self.arrays.items()}
        np.savez(os.path.join(directory, CONSTANTS_FILE), **arrays)
        return [PROGRAM_FILE, CONSTANTS_FILE]

    @classmethod
    def load(cls, directory: str) -> "Program":
        """Read a program saved by `save` (no pickle: object arrays are refused)."""
        with np.load(os.path.join(directory, CONSTANTS_FILE), allow_pickle=False) as npz:
            arrays = {int(key[1:]): npz[key] for key in npz.files}
        with open(os.path.join(directory, PROGRAM_FILE), encoding="utf-8") as f:
            return cls.from_json(f.read(), arrays)


PROGRAM_FILE = "program.json"
CONSTANTS_FILE = "constants.npz"


def array_key(tensor_id: int) -> str:
    return f"t{tensor_id}"


def _np_dtype(dtype: str) -> Any:
    return np.float32 if dtype == HALF else np.dtype(dtype)
