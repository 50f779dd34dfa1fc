"""Program.verify() on runtime assertions and prints: entries and "assert/..."/"print/..." outputs agree."""
from __future__ import annotations

from typing import Callable

import pytest

from cerebras_tf import ir
from tests.ir.conftest import program_with_checks


def test_a_program_with_checks_verifies_and_round_trips(tmp_path):
    program = program_with_checks()
    assert program.verify() is program
    program.save(str(tmp_path))
    assert ir.Program.load(str(tmp_path)).verify() == program


def _entry(kind: str, **changes: object) -> Callable[[ir.Program], None]:
    def apply(p: ir.Program) -> None:
        getattr(p, kind)[0].update(changes)
    return apply


BROKEN: dict[str, tuple[Callable[[ir.Program], None], str]] = {
    "condition not streamed": (_entry("assertions", condition="assert/7/condition"),
                               "assertion 0 (Assert/AssertGuard/Assert) reads output 'assert/7/condition', which "
                               "the program does not stream"),
    "condition not a bool": (lambda p: p.outputs.update({"assert/0/condition": 3}),
                             "reads output 'assert/0/condition' as a condition, but it is a float32 [], "
                             "not a scalar bool"),
    "stray output": (lambda p: p.outputs.update({"print/3/data/0": 2}),
                     "outputs ['print/3/data/0'] are read by no assertion or print"),
    "unknown prefix": (lambda p: p.outputs.update({"asserts/0": 2}), "output 'asserts/0' is none of"),
    "constant shape": (lambda p: p.assertions[0]["data"][2].update(shape=[2]),
                       "assertion 0 (Assert/AssertGuard/Assert) data 2 is a constant of shape [1, 2] but says [2]"),
    "neither output nor constant": (lambda p: p.prints[0]["pieces"].append({"tensor": 3}),
                                    "print 0 (PrintV2) piece 2 is neither an output nor a constant"),
    "stream": (_entry("prints", output_stream="printer"), "print 0 (PrintV2) writes to 'printer'"),
    "style": (_entry("prints", style="v3"), "has style 'v3'"),
    "after": (_entry("prints", after=[4]), "waits for assertions [4], which do not exist"),
    "when not streamed": (_entry("prints", when="print/0/when"), "reads output 'print/0/when'"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_malformed_check_is_named(name):
    program = program_with_checks()
    breaks, message = BROKEN[name]
    breaks(program)
    with pytest.raises(ir.IRError) as info:
        program.verify()
    assert message in str(info.value)


def test_a_file_stream_is_accepted():
    program = program_with_checks()
    program.prints[0]["output_stream"] = "file:///tmp/prints.txt"
    program.verify()
