"""Program.verify() accepts a well-formed program and names every way a broken one is malformed."""
from __future__ import annotations

import subprocess
import sys
from typing import Callable

import numpy as np
import pytest

from cerebras_tf import ir
from tests.ir.conftest import tiny_train_program


def test_a_well_formed_program_verifies_and_is_returned(program):
    assert program.verify() is program


def test_a_saved_program_still_verifies(program, tmp_path):
    program.save(str(tmp_path))
    assert ir.Program.load(str(tmp_path)).verify() == program


def _swap_first_kernels(p: ir.Program) -> None:
    p.kernels[0], p.kernels[1] = p.kernels[1], p.kernels[0]
    p.kernels[0].id, p.kernels[1].id = 0, 1


def _set(obj_of: Callable[[ir.Program], object], **changes: object) -> Callable[[ir.Program], None]:
    def apply(p: ir.Program) -> None:
        for name, value in changes.items():
            setattr(obj_of(p), name, value)
    return apply


BROKEN: dict[str, tuple[Callable[[ir.Program], None], str]] = {
    "unknown kind": (_set(lambda p: p.kernels[1], kind="matmul_fast"),
                     "kernel 1 (matmul_fast, dense/MatMul) has a kind no kernel library implements"),
    "unknown role": (_set(lambda p: p.kernels[1], role="sideways"), "has unknown role 'sideways'"),
    "read before defined": (_swap_first_kernels, "reads tensors [1] before any kernel defines them"),
    "defined twice": (_set(lambda p: p.kernels[7], outputs=[2]), "defines tensors [2], which are already defined"),
    "tensor does not exist": (_set(lambda p: p.kernels[2], inputs=[42]), "refers to tensors [42], which do not exist"),
    "kernel id": (_set(lambda p: p.kernels[2], id=9), "kernel at index 2 has id 9"),
    "tensor id": (_set(lambda p: p.tensors[2], id=5), "tensor at index 2 has id 5"),
    "unknown dtype": (_set(lambda p: p.tensors[2], dtype="float8"), "unknown dtype 'float8'"),
    "dynamic shape": (_set(lambda p: p.tensors[0], shape=[-1, 3]), "has shape [-1, 3], not fully static"),
    "constant without value": (_set(lambda p: p.tensors[6], const=ir.Const(splat=None)),
                               "constant tensor 6 (lr) has no value"),
    "undeclared variable": (_set(lambda p: p.kernels[0], vars=["dense/v"]),
                            "uses variables ['dense/v'], which the program does not declare"),
    "write names no variable": (_set(lambda p: p.kernels[5], vars=[]), "writes a variable but names none"),
    "variable role": (_set(lambda p: p.variables[0], role="weights"), "unknown role 'weights'"),
    "trainable but state": (_set(lambda p: p.variables[0], role="state"),
                            "has role 'state' but trainable=True"),
    "slot of nothing": (_set(lambda p: p.variables[1], slot_of="dense/x"),
                        "is a slot of 'dense/x', which is not a variable"),
    "global step role": (_set(lambda p: p, global_step="dense/w"),
                         "global_step 'dense/w' does not have the role 'global_step'"),
    "guard not bool": (_set(lambda p: p.kernels[5], guard=3),
                       "is guarded by tensor 3, a float32 [], not a scalar bool"),
    "guard on a non-write": (_set(lambda p: p.kernels[1], guard=0),
                             "is guarded but writes no variable"),
    "check guard not bool": (_set(lambda p: p.kernels[1], kind="gather", check_guard=3),
                             "kernel 1 (gather, dense/MatMul) is check-guarded by tensor 3, a float32 [], not a "
                             "scalar bool"),
    "check guard defined later": (_set(lambda p: p.kernels[1], kind="gather", check_guard=8),
                                  "is check-guarded by tensor 8, which no earlier kernel defines"),
    "check guard on a kind that checks nothing": (_set(lambda p: p.kernels[1], check_guard=0),
                                                  "is check-guarded but is not a kind that checks its input"),
    "input side": (lambda p: p.inputs.update({"weights": p.inputs.pop("features")}),
                   "input 'weights' is neither features nor labels"),
    "input is a constant": (lambda p: p.inputs.update({"labels": 6}),
                            "input 'labels' is tensor 6, which is a constant"),
    "output undefined": (lambda p: p.outputs.update({"loss": 42}), "output 'loss' is tensor 42, which nothing defines"),
    "output key": (lambda p: p.outputs.update({"logits": 2}), "output 'logits' is none of"),
    "host_call structure": (_set(lambda p: p, host_call={"args": [{"tensor": "host_call/1"}]}),
                            "host_call's structure has tensors ['host_call/1'] but the program streams"),
    "summary not a host kind": (lambda p: p.summaries.update({"abs_loss": "image"}),
                                "output 'summary/abs_loss' is not a scalar or histogram summary"),
    "gradient seed": (_set(lambda p: p, gradient_seed=2), "gradient_seed 2 is not a gradient_seed kernel"),
    "gradient not computed": (_set(lambda p: p, gradients=[0]), "gradients [0] are not computed by any kernel"),
    "version": (_set(lambda p: p, version=0), f"IR version 0 is not {ir.IR_VERSION}"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_malformation_is_named(name):
    program = tiny_train_program()
    breaks, message = BROKEN[name]
    breaks(program)
    with pytest.raises(ir.IRError) as info:
        program.verify()
    assert message in str(info.value)


def test_a_forward_kernel_reading_an_optimizer_result_breaks_the_phase_split(program):
    # the summary's abs() becomes an optimizer kernel at the end; the loss summary output then reads it
    # from a forward kernel inserted after it, which the executor would run before the optimizer
    program.kernels[7].role = "optimizer"
    program.tensors.append(ir.Tensor(9, [], "float32", "late"))
    program.kernels.append(ir.Kernel(8, "neg", [8], [9], {}, tf_name="late"))
    with pytest.raises(ir.IRError, match=r"kernel 8 \(neg, role forward\) reads tensor 8 produced by an optimizer "
                                         r"kernel, which runs after it: the program cannot be split"):
        program.verify()


def test_every_problem_is_listed_at_once(program):
    program.kernels[1].kind = "matmul_fast"
    program.outputs["loss"] = 42
    program.variables[0].role = "weights"
    with pytest.raises(ir.IRError) as info:
        program.verify()
    assert len(info.value.problems) == 3
    assert isinstance(info.value, ValueError)  # callers that catch ValueError keep working


def test_a_constant_array_of_the_wrong_shape_is_named(program):
    program.tensors[6].const = ir.Const()
    program.arrays[6] = np.zeros((2,), np.float32)
    with pytest.raises(ir.IRError, match=r"constant tensor 6 \(lr\) has shape \[\] but its value has shape \[2\]"):
        program.verify()


def test_a_prediction_program_need_not_declare_the_global_step(program):
    program.variables = [v for v in program.variables if v.name != "global_step"]
    program.kernels = program.kernels[:3]
    program.mode, program.outputs, program.host_call, program.summaries = "infer", {"predictions/y": 2}, None, {}
    program.gradient_seed, program.gradients = None, []
    assert program.verify() is program


def test_the_ir_package_loads_without_tensorflow():
    code = "import sys, cerebras_tf.ir, cerebras_tf.ir.costs, cerebras_tf.ir.passes; print('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_the_vocabulary_is_the_one_compiler_and_executor_share():
    from cerebras_tf.compiler.kernels import LIBRARY
    from cerebras_tf.wse.kernels import KERNELS

    emitted = {d.kind for d in LIBRARY.values()} | {"to_half", "gradient_seed"}
    assert emitted == set(ir.KINDS)  # no kind the compiler cannot emit, none it emits unknown
    assert set(KERNELS) | {"to_half", "gradient_seed"} == set(ir.KINDS)  # the executor runs these two itself
    assert ir.WRITES <= set(ir.KINDS) and ir.READS_VARIABLES <= set(ir.KINDS)
