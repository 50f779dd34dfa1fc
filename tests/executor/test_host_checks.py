"""cerebras_tf.run.host_checks on a hand-built program: what the host prints and raises after a step."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

from cerebras_tf.run.host_checks import HostChecks
from tests.ir.conftest import program_with_checks


def _outputs(holds: bool, loss: float = 0.5) -> dict[str, np.ndarray]:
    return {"assert/0/condition": np.bool_(holds), "assert/0/data/1": np.float32(loss),
            "print/0/data/1": np.float32(loss)}


def test_a_passing_step_prints_and_raises_nothing(capfd):
    HostChecks(program_with_checks(), "training").after_step(_outputs(True, 1 / 3), global_step=7)
    assert capfd.readouterr().err == "loss 0.333333343\n"


def test_a_failing_assertion_raises_tfs_message_and_skips_the_print_waiting_for_it(capfd):
    checks = HostChecks(program_with_checks(), "training")
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        checks.after_step(_outputs(False, 2.5), global_step=7)
    assert str(info.value) == ("assertion failed: [loss is] [2.5] [[1 2]]\n"
                               "\t [[{{node Assert/AssertGuard/Assert}}]]\n"
                               "Assertion made at model.py:3; it failed on the simulated WSE in training "
                               "(global step 7).")
    assert capfd.readouterr().err == ""  # the print depends on the assertion ("after")


def test_a_condition_missing_from_the_step_is_not_checked():
    HostChecks(program_with_checks(), "evaluation").after_step({"print/0/data/1": np.float32(1)})


def test_when_first_n_and_the_streams(tmp_path, capfd, caplog):
    program = program_with_checks()
    entry = program.prints[0]
    entry.update(after=[], first_n=2, when="print/0/when", output_stream="stdout", end="|\n")
    checks = HostChecks(program, "prediction")
    for taken in (False, True, True, True):
        checks.after_step({**_outputs(True), "print/0/when": np.bool_(taken)})
    assert capfd.readouterr().out == "loss 0.5|\nloss 0.5|\n"  # not on the untaken step, then first_n=2

    entry.update(when=None, first_n=-1, output_stream=f"file://{tmp_path / 'prints.txt'}")
    checks = HostChecks(program, "prediction")
    checks.after_step(_outputs(True))
    checks.after_step(_outputs(True, 1.0))
    assert (tmp_path / "prints.txt").read_text() == "loss 0.5|\nloss 1|\n"

    entry.update(output_stream="log(warning)", end="\n")
    with caplog.at_level(logging.WARNING):
        HostChecks(program, "prediction").after_step(_outputs(True))
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == ["loss 0.5"]
