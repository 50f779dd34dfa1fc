"""The host's side of the model's runtime assertions and prints on the simulated CS system.

TF runs tf.debugging.assert_* / tf.Assert and tf.print as ops of the graph;
nothing on the wafer can raise or print, so the compiler streams their
conditions and shown tensors off the wafer as program outputs
(compiler/checks.py, Program.assertions / .prints). After every step of
train, evaluate and predict on the system, `HostChecks.after_step` does what
those ops would have done in that step, before anything of the step is
written: prints the prints (in graph order, to the stream tf.print names, text
formatted as TF formats it), then raises tf.errors.InvalidArgumentError for the
first assertion that failed, with TF's message ("assertion failed: [...] ...")
and the user's file:line. A print that depends on a failed assertion does not
print, as in TF.
"""
from __future__ import annotations

import sys
from typing import Any, Mapping

import numpy as np
import tensorflow as tf

from cerebras_tf import ir
from cerebras_tf.run.tensor_text import summarize_value

_log = tf.compat.v1.logging
_LOG_STREAMS = {"log(info)": _log.info, "log(warning)": _log.warning, "log(error)": _log.error}


class HostChecks:
    """A program's assertions and prints, run on the host after each step of one run (`what`: "training",
    "evaluation" or "prediction", named in the error)."""

    def __init__(self, program: ir.Program, what: str) -> None:
        self.assertions = list(program.assertions)
        self.prints = list(program.prints)
        self.what = what
        self._steps = 0
        self._printed = [0] * len(self.prints)  # for tf.compat.v1.Print's first_n

    def after_step(self, outputs: Mapping[str, np.ndarray], global_step: int | None = None) -> None:
        """Print this step's prints, then raise InvalidArgumentError if an assertion failed.

        `outputs` are the step's program outputs; `global_step` (training) is the global step the step
        reached. A condition the step did not compute is not checked.
        """
        self._steps += 1
        failed = [index for index, entry in enumerate(self.assertions)
                  if entry["condition"] in outputs and not bool(np.asarray(outputs[entry["condition"]]))]
        for index, entry in enumerate(self.prints):
            if any(a in failed for a in entry["after"]):
                continue  # TF does not run a print whose assertion failed
            if entry["when"] is not None and not bool(np.asarray(outputs.get(entry["when"], False))):
                continue  # in an untaken tf.cond branch
            if 0 <= entry["first_n"] <= self._printed[index]:
                continue
            self._printed[index] += 1
            write(entry, print_text(entry, outputs))
        if failed:
            raise tf.errors.InvalidArgumentError(None, None, self.message(failed[0], outputs, global_step))

    def message(self, index: int, outputs: Mapping[str, np.ndarray], global_step: int | None = None) -> str:
        """TF's message for failed assertion `index` (Assert: "assertion failed: " and each datum in
        brackets), its node, and where it was made and checked."""
        entry = self.assertions[index]
        data = " ".join(f"[{summarize_value(_value(item, outputs), entry['summarize'], 'v1')}]"
                        for item in entry["data"])
        step = f"global step {global_step}" if global_step is not None else f"batch {self._steps}"
        made = f"made at {entry['location']}" if entry.get("location") else "made outside your code"
        return (f"assertion failed: {data}\n\t [[{{{{node {entry['name']}}}}}]]\n"
                f"Assertion {made}; it failed on the simulated WSE in {self.what} ({step}).")


def print_text(entry: Mapping[str, Any], outputs: Mapping[str, np.ndarray]) -> str:
    """What print `entry` writes this step (its end included), formatted as TF formats it."""
    parts = [item["text"] if "text" in item else summarize_value(_value(item, outputs), entry["summarize"],
                                                                  entry["style"])
             for item in entry["pieces"]]
    return "".join(parts) + entry["end"]


def write(entry: Mapping[str, Any], text: str) -> None:
    """Write a print's text where TF's kernel would: stderr, stdout, TF's log, or appended to a file."""
    stream = entry["output_stream"]
    if stream.startswith(ir.FILE_STREAM_PREFIX):
        with open(stream[len(ir.FILE_STREAM_PREFIX):], "ab") as handle:
            handle.write(text.encode("utf-8", "surrogateescape"))
        return
    readable = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if stream in _LOG_STREAMS:
        _LOG_STREAMS[stream]("%s", readable[:-1] if readable.endswith("\n") else readable)
        return
    target = sys.stdout if stream == "stdout" else sys.stderr
    target.write(readable)
    target.flush()


def _value(item: Mapping[str, Any], outputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """A datum's value: a constant of the entry, or this step's output in the TF dtype it had."""
    if "constant" in item:
        if item["dtype"] == "string":
            return np.asarray(item["constant"], dtype=object).reshape(item["shape"])
        return np.asarray(item["constant"], dtype=item["dtype"]).reshape(item["shape"])
    value = np.asarray(outputs[item["output"]])
    try:
        dtype = np.dtype(item["dtype"])
    except TypeError:  # bfloat16: the values already are bfloat16 values
        return value
    return value.astype(dtype, copy=False)
