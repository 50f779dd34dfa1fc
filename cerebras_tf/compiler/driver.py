"""compile_model: fold, match kernels, insert casts, and write or reuse the artifact."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import time

import tensorflow as tf

from cerebras_tf import ir
from cerebras_tf.compiler import artifact, layout, lower, report
from cerebras_tf.errors import CerebrasError
from cerebras_tf.wse.fabric import Fabric
from cerebras_tf.wse.placement import PlacementReport
from cerebras_tf.wse.streaming import StreamingReport
from estimator import CapturedModel

_log = tf.compat.v1.logging

PLACEMENT_REPORT_FILE = "report.json"
PLACEMENT_PICTURE_FILE = "placement.png"


@functools.lru_cache(maxsize=None)
def compiler_digest() -> str:
    """Digest of the compiler's and the IR's source: an artifact from another version of either is rebuilt."""
    digest = hashlib.sha256()
    for package in (pathlib.Path(__file__).parent, pathlib.Path(ir.__file__).parent):
        for path in sorted(package.glob("*.py")):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@dataclasses.dataclass
class CompileResult:
    program: ir.Program
    report: str
    graph_hash: str
    validate_only: bool
    reused: bool = False
    artifact_dir: str | None = None
    note: str = ""  # why the artifact was (re)built, or "reused"
    seconds: float = 0.0
    # full compile for a fabric: the pipelined placement, or the weight streaming timing
    placement: PlacementReport | StreamingReport | None = None
    # What a run in this environment would refuse that compile() does not need (e.g. TF_CONFIG for training);
    # also under "Warnings" at the end of `report` (not in the artifact's report, which is the program's).
    warnings: list[CerebrasError] = dataclasses.field(default_factory=list)
    execution_reason: str = ""  # the mode the layout is in, and why (e.g. "weight streaming: cs_config's ...")

    @property
    def kernel_counts(self) -> dict[str, int]:
        return self.program.kernel_counts()

    @property
    def kernel_summary(self) -> str:
        """The kernel count and what it counts, e.g. "84 kernels (75 + 9 precision casts)"."""
        return report.kernel_summary(self.program)

    def summary(self) -> str:
        """A few lines for the log: what was compiled, the placement's estimate and its note, where the full
        report is (the report itself, ~50 lines, is `report` and report.txt in the artifact)."""
        done = "Validated" if self.validate_only else "Compiled"
        lines = [f"{done} {self.kernel_summary}" + (f" to {self.artifact_dir}" if self.artifact_dir else "")
                 + f" ({self.note})."]
        if self.placement is not None:
            place = self.placement
            mode = "pipelined" if isinstance(place, PlacementReport) else (
                f"weight streaming, {place.num_systems} system{'s' if place.num_systems > 1 else ''}")
            lines.append(f"Estimated {place.estimated_samples_per_sec:,.0f} samples/s on {place.fabric.name} "
                         f"({mode}; limited by {place.limiting_bound}).")
            if self.execution_reason:
                lines.append(f"Execution mode: {self.execution_reason}.")
            lines += [f"Note: {note}" for note in place.notes]
        where = os.path.join(self.artifact_dir, artifact.REPORT_FILE) if self.artifact_dir else "CompileResult.report"
        lines.append(f"Full report (kernels by kind, inputs, layers{', placement' if self.placement else ''}): "
                     f"{where}")
        return "\n".join(lines)


def program_hash(model: CapturedModel, validate_only: bool = False, execution_strategy: str = layout.PIPELINE,
                 num_systems: int = 1) -> str:
    """The identity of the program `model` compiles to (graph, mode, casts, compiler version, and the execution
    mode it is laid out for)."""
    execution = "" if (execution_strategy, num_systems) == (layout.PIPELINE, 1) else \
        f"|execution={execution_strategy}x{num_systems}"
    return lower.graph_hash(model, extra=f"casts={not validate_only}|compiler={compiler_digest()}{execution}")


def compile_model(model: CapturedModel, *, validate_only: bool = False, compile_dir: str | None = None,
                  system_name: str | None = None, fabric: Fabric | None = None,
                  execution_strategy: str = layout.PIPELINE, num_systems: int = 1,
                  execution_reason: str = "") -> CompileResult:
    """Compile a captured model (already prechecked) for the CS system.

    validate_only: fold and match every op to a kernel, then stop (no casts,
      nothing written). Otherwise the full program (with precision casts) is
      built, and with a compile_dir written there as an artifact, or reused
      from there when the graph hash and target system match.
    fabric: the target fabric; a full compile then lays the program out on it
      (CompileResult.placement; report.json and placement.png in the artifact):
      placed for pipelined execution, or timed layer by layer for weight
      streaming on `num_systems` systems (execution_strategy="weight_streaming");
      `execution_reason` (why that mode) goes into the log summary and the report.
    Raises CompileError subclasses (or MultipleProblemsError) naming each
    unsupported op, its type and the user's file:line; ArtifactSystemMismatchError
    when compile_dir holds an artifact for another system; FabricCapacityError
    when the model does not fit on the fabric (or, weight streaming, in MemoryX).
    """
    start = time.perf_counter()
    graph_hash = program_hash(model, validate_only, execution_strategy, num_systems)
    system = artifact.system_identity(system_name, fabric)
    directory = artifact.artifact_dir(compile_dir, model.input.mode) if compile_dir and not validate_only else None
    note = "validate only" if validate_only else "no compile_dir"
    if directory is not None:
        program, note = artifact.load_artifact(directory, graph_hash, system)
        if program is not None:
            with open(os.path.join(directory, artifact.REPORT_FILE), encoding="utf-8") as f:
                text = f.read()
            _log.info("Reusing the compiled artifact in %s (graph hash %s, %s; report in %s).", directory,
                      graph_hash[:12], report.kernel_summary(program), artifact.REPORT_FILE)
            placement = (layout.lay_out(program, fabric, execution_strategy, num_systems)  # deterministic
                         if fabric is not None else None)
            return CompileResult(program, text, graph_hash, False, True, directory, note,
                                 time.perf_counter() - start, placement, execution_reason=execution_reason)
    program, stats = lower.lower(model, casts=not validate_only)
    program.verify()  # a malformed program here is a compiler bug: stop before it is written or run
    placement = (layout.lay_out(program, fabric, execution_strategy, num_systems)
                 if fabric is not None and not validate_only else None)
    seconds = time.perf_counter() - start
    text = report.render(program, stats, graph_hash=graph_hash, system=system, seconds=seconds)
    if placement is not None:
        text += ("\n" + (f"Execution mode: {execution_reason}.\n" if execution_reason else "")
                 + placement.render_table() + "\n")
    if directory is not None:
        extra = {} if placement is None else {
            PLACEMENT_REPORT_FILE: json.dumps(placement.to_dict(), indent=2, sort_keys=True).encode(),
            PLACEMENT_PICTURE_FILE: placement.to_png(),
        }
        artifact.write_artifact(directory, program, text, graph_hash, system, extra)
    return CompileResult(program, text, graph_hash, validate_only, False, directory, note,
                         time.perf_counter() - start, placement, execution_reason=execution_reason)


