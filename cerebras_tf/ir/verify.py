"""Program.verify(): is a Program well-formed, whoever built it (the compiler, an artifact on disk, a test)?

Checked: vocabularies (kinds, roles, dtypes), ids, every tensor defined
before it is read and defined once, guards (earlier scalar bools; `guard` on
variable writes only, `check_guard` on the kinds in CHECKS_INPUT only),
variables named by kernels exist, inputs/outputs/gradients exist,
host_call's structure matches its outputs, summaries match theirs,
assertions and prints match theirs (every "assert/..."/"print/..." output is
one an entry reads, conditions are scalar bools, constants have their shapes),
and the phase split loss scaling needs (no kernel reads a tensor a later phase
makes). Every problem is listed, so one run shows them all.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from cerebras_tf.ir.keys import (ASSERT_PREFIX, EVAL_METRIC_INPUT_PREFIX, FILE_STREAM_PREFIX, HOST_CALL_PREFIX,
                                 HOST_SUMMARY_KINDS, PRINT_PREFIX, PRINT_STREAMS, SUMMARY_PREFIX)
from cerebras_tf.ir.passes import phases
from cerebras_tf.ir.program import IR_VERSION, Kernel, Program
from cerebras_tf.ir.vocabulary import CHECKS_INPUT, DTYPES, KINDS, ROLES, VARIABLE_ROLES, WRITES

_INPUT_SIDES = ("features", "labels")
_OUTPUT_KEYS = ("loss", HOST_CALL_PREFIX, EVAL_METRIC_INPUT_PREFIX, SUMMARY_PREFIX, "predictions", ASSERT_PREFIX,
                PRINT_PREFIX)


class IRError(ValueError):
    """A Program is not well-formed: a compiler bug, or an artifact that was edited or damaged."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("malformed WSE program:\n  " + "\n  ".join(problems))


def verify(program: Program) -> None:
    """Raise IRError listing every way `program` is malformed (see the module docstring)."""
    problems: list[str] = []
    if program.version != IR_VERSION:
        problems.append(f"IR version {program.version} is not {IR_VERSION}")
    problems += _tensor_problems(program)
    problems += _variable_problems(program)
    defined = _input_problems(program, problems)
    problems += _kernel_problems(program, defined)
    problems += _output_problems(program, defined)
    problems += _check_problems(program)
    problems += _phase_problems(program)
    if problems:
        raise IRError(problems)


def _tensor_problems(program: Program) -> list[str]:
    problems = []
    for index, tensor in enumerate(program.tensors):
        if tensor.id != index:
            problems.append(f"tensor at index {index} has id {tensor.id}")
        if tensor.dtype not in DTYPES:
            problems.append(f"tensor {tensor.id} ({tensor.name}) has unknown dtype {tensor.dtype!r}")
        if not all(isinstance(d, int) and d >= 0 for d in tensor.shape):
            problems.append(f"tensor {tensor.id} ({tensor.name}) has shape {tensor.shape}, not fully static")
        if tensor.const is not None and tensor.const.splat is None:
            array = program.arrays.get(tensor.id)
            if array is None:
                problems.append(f"constant tensor {tensor.id} ({tensor.name}) has no value")
            elif list(array.shape) != list(tensor.shape):
                problems.append(f"constant tensor {tensor.id} ({tensor.name}) has shape {tensor.shape} "
                                f"but its value has shape {list(array.shape)}")
    return problems


def _variable_problems(program: Program) -> list[str]:
    problems, names = [], set()
    for variable in program.variables:
        if variable.name in names:
            problems.append(f"variable {variable.name!r} is declared twice")
        names.add(variable.name)
        if variable.role not in VARIABLE_ROLES:
            problems.append(f"variable {variable.name!r} has unknown role {variable.role!r}")
        if variable.dtype not in DTYPES:
            problems.append(f"variable {variable.name!r} has unknown dtype {variable.dtype!r}")
        if variable.role in VARIABLE_ROLES and variable.trainable != (variable.role == "trainable"):
            problems.append(f"variable {variable.name!r} has role {variable.role!r} but trainable={variable.trainable}")
    for variable in program.variables:
        if variable.slot_of is not None and variable.slot_of not in names:
            problems.append(f"variable {variable.name!r} is a slot of {variable.slot_of!r}, which is not a variable")
    # the graph's global step; a program that never reads it (prediction) does not declare it
    if program.global_step in names:
        if program.variable(program.global_step).role != "global_step":
            problems.append(f"global_step {program.global_step!r} does not have the role 'global_step'")
    return problems


def _input_problems(program: Program, problems: list[str]) -> set[int]:
    """Checks the inputs (appending to `problems`); returns the tensors defined before the first kernel."""
    constants = {t.id for t in program.tensors if t.const is not None}
    defined = set(constants)
    for key, tid in program.inputs.items():
        if key.split("/", 1)[0] not in _INPUT_SIDES:
            problems.append(f"input {key!r} is neither features nor labels")
        if not 0 <= tid < len(program.tensors):
            problems.append(f"input {key!r} is tensor {tid}, which does not exist")
        elif tid in defined:
            problems.append(f"input {key!r} is tensor {tid}, which is "
                            f"{'a constant' if tid in constants else 'another input too'}")
        defined.add(tid)
    return defined


def _kernel_problems(program: Program, defined: set[int]) -> list[str]:
    problems = []
    variables = {v.name for v in program.variables}
    count = len(program.tensors)
    for index, kernel in enumerate(program.kernels):
        what = f"kernel {kernel.id} ({kernel.kind}{', ' + kernel.tf_name if kernel.tf_name else ''})"
        if kernel.id != index:
            problems.append(f"kernel at index {index} has id {kernel.id}")
        if kernel.kind not in KINDS:
            problems.append(f"{what} has a kind no kernel library implements")
        if kernel.role not in ROLES:
            problems.append(f"{what} has unknown role {kernel.role!r}")
        unknown = [t for t in kernel.reads + kernel.outputs if not 0 <= t < count]
        if unknown:
            problems.append(f"{what} refers to tensors {unknown}, which do not exist")
        undefined = [t for t in kernel.inputs if t not in defined and 0 <= t < count]
        if undefined:
            problems.append(f"{what} reads tensors {undefined} before any kernel defines them")
        problems += _guard_problems(program, kernel, what, defined)
        missing = [name for name in kernel.vars if name not in variables]
        if missing:
            problems.append(f"{what} uses variables {missing}, which the program does not declare")
        if kernel.kind in WRITES and not kernel.vars:
            problems.append(f"{what} writes a variable but names none")
        again = [t for t in kernel.outputs if t in defined]
        if again:
            problems.append(f"{what} defines tensors {again}, which are already defined")
        defined.update(kernel.outputs)
    return problems


def _guard_problems(program: Program, kernel: Kernel, what: str, defined: set[int]) -> list[str]:
    problems = []
    if kernel.guard is not None:
        problems += _flag_problems(program, kernel.guard, f"{what} is guarded", defined)
        if kernel.kind not in WRITES:
            problems.append(f"{what} is guarded but writes no variable (only variable writes are guarded)")
    if kernel.check_guard is not None:
        problems += _flag_problems(program, kernel.check_guard, f"{what} is check-guarded", defined)
        if kernel.kind not in CHECKS_INPUT:
            problems.append(f"{what} is check-guarded but is not a kind that checks its input (CHECKS_INPUT)")
    return problems


def _flag_problems(program: Program, tid: int, what: str, defined: set[int]) -> list[str]:
    """A guard: a scalar bool an earlier kernel defines (an unknown id is reported with the other unknown tensors)."""
    if not 0 <= tid < len(program.tensors):
        return []
    problems = []
    if tid not in defined:
        problems.append(f"{what} by tensor {tid}, which no earlier kernel defines")
    tensor = program.tensors[tid]
    if tensor.dtype != "bool" or tensor.size != 1:
        problems.append(f"{what} by tensor {tid}, a {tensor.dtype} {tensor.shape}, not a scalar bool")
    return problems


def _output_problems(program: Program, defined: set[int]) -> list[str]:
    problems = []
    for key, tid in program.outputs.items():
        if key.split("/", 1)[0] not in _OUTPUT_KEYS:
            problems.append(f"output {key!r} is none of {', '.join(_OUTPUT_KEYS)}")
        if tid not in defined:
            problems.append(f"output {key!r} is tensor {tid}, which nothing defines")
    streamed = {key for key in program.outputs if key.startswith(HOST_CALL_PREFIX + "/")}
    leaves = _structure_leaves(program.host_call) if program.host_call is not None else set()
    if leaves != streamed:
        problems.append(f"host_call's structure has tensors {sorted(leaves)} but the program streams "
                        f"{sorted(streamed)}")
    for key in program.outputs:
        if key.startswith(SUMMARY_PREFIX + "/"):
            tag = key[len(SUMMARY_PREFIX) + 1:]
            if program.summaries.get(tag) not in HOST_SUMMARY_KINDS:
                problems.append(f"output {key!r} is not a scalar or histogram summary of the program")
    if program.gradient_seed is not None and (
            not 0 <= program.gradient_seed < len(program.kernels)
            or program.kernels[program.gradient_seed].kind != "gradient_seed"):
        problems.append(f"gradient_seed {program.gradient_seed} is not a gradient_seed kernel")
    produced = {t for k in program.kernels for t in k.outputs}
    stray = [t for t in program.gradients if t not in produced]
    if stray:
        problems.append(f"gradients {stray} are not computed by any kernel")
    return problems


def _check_problems(program: Program) -> list[str]:
    """Assertions and prints: their output keys exist and are scalar bools where a condition is read, their
    constants have their shapes, and every "assert/..." and "print/..." output is read by the entry it names."""
    problems: list[str] = []
    read: set[str] = set()

    def scalar_bool(key: Any, what: str) -> None:
        read.add(key)
        tid = program.outputs.get(key)
        if tid is None:
            problems.append(f"{what} reads output {key!r}, which the program does not stream")
        elif 0 <= tid < len(program.tensors) and (program.tensors[tid].dtype != "bool"
                                                  or program.tensors[tid].shape != []):
            problems.append(f"{what} reads output {key!r} as a condition, but it is a "
                            f"{program.tensors[tid].dtype} {program.tensors[tid].shape}, not a scalar bool")

    def value(item: Any, what: str) -> None:
        if not isinstance(item, dict) or ("output" in item) == ("constant" in item):
            problems.append(f"{what} is neither an output nor a constant: {item!r}")
        elif "output" in item:
            read.add(item["output"])
            if item["output"] not in program.outputs:
                problems.append(f"{what} reads output {item['output']!r}, which the program does not stream")
        else:
            shape = list(np.shape(np.asarray(item["constant"], dtype=object)))
            if shape != list(item.get("shape", [])):
                problems.append(f"{what} is a constant of shape {shape} but says {item.get('shape')}")

    for index, entry in enumerate(program.assertions):
        what = f"assertion {index} ({entry.get('name')})"
        scalar_bool(entry.get("condition"), what)
        for j, item in enumerate(entry.get("data", [])):
            value(item, f"{what} data {j}")
    for index, entry in enumerate(program.prints):
        what = f"print {index} ({entry.get('name')})"
        stream = entry.get("output_stream", "")
        if stream not in PRINT_STREAMS and not str(stream).startswith(FILE_STREAM_PREFIX):
            problems.append(f"{what} writes to {stream!r}, none of {', '.join(PRINT_STREAMS)} "
                            f"or {FILE_STREAM_PREFIX}<path>")
        if entry.get("style") not in ("v1", "v2"):
            problems.append(f"{what} has style {entry.get('style')!r}, not 'v1' or 'v2'")
        if entry.get("when") is not None:
            scalar_bool(entry["when"], what)
        for j, item in enumerate(entry.get("pieces", [])):
            if not (isinstance(item, dict) and set(item) == {"text"}):
                value(item, f"{what} piece {j}")
        stray = [a for a in entry.get("after", []) if not 0 <= a < len(program.assertions)]
        if stray:
            problems.append(f"{what} waits for assertions {stray}, which do not exist")
    streamed = {key for key in program.outputs if key.split("/", 1)[0] in (ASSERT_PREFIX, PRINT_PREFIX)}
    unread = sorted(streamed - read)
    if unread:
        problems.append(f"outputs {unread} are read by no assertion or print")
    return problems


def _structure_leaves(node: Any) -> set[str]:
    """The tensor keys in host_call_structure's description (names in [name, node] pairs are skipped)."""
    if node is None:
        return set()
    if isinstance(node, dict):
        if "tensor" in node:
            return {node["tensor"]}
        children = [v for part in node.values() for v in part]
        return {leaf for child in children for leaf in _structure_leaves(child)}
    if isinstance(node, list):  # [name, node] pairs of "kwargs" and "dict"
        return {leaf for item in node for leaf in _structure_leaves(item)}
    return set()


def _phase_problems(program: Program) -> list[str]:
    split = phases(program)
    phase_of = {t: index for index, kernels in enumerate(split) for k in kernels for t in k.outputs}
    problems = []
    for index, kernels in enumerate(split):
        for kernel in kernels:
            later = [t for t in kernel.reads if phase_of.get(t, index) > index]
            if later:
                producer = "an optimizer kernel" if phase_of[later[0]] == 1 else "the global-step update"
                problems.append(f"kernel {kernel.id} ({kernel.kind}, role {kernel.role}) reads tensor {later[0]} "
                                f"produced by {producer}, which runs after it: the program cannot be split "
                                "for loss scaling")
    missing = set(program.gradients) - {t for k in split[0] for t in k.outputs}
    if split[1] and missing:
        problems.append(f"gradient tensors {sorted(missing)} are not computed before the optimizer kernels")
    return problems
