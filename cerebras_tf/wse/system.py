"""The simulated CS systems of this process: each is programmed once, as on the real fabric.

The first train() or evaluate() on the system behind a cs_ip loads its program
onto the fabric. Running the same program again (e.g. a second train() call
that resumes from the checkpoint) reuses it; any other program (eval after
train, a changed graph) is refused with SystemProgrammedError, because the
fabric cannot be reprogrammed after its initial programming. Tests and
notebooks free a system with `release_system(cs_ip)` (or all with no
argument), which stands for restarting the process.
"""
from __future__ import annotations

import dataclasses
import threading
import time

from cerebras_tf.errors import SystemProgrammedError


@dataclasses.dataclass(frozen=True)
class ProgrammedSystem:
    """What a simulated system at `cs_ip` was programmed with."""

    cs_ip: str
    program_id: str  # the compiled program's graph hash
    mode: str  # "train" or "eval"
    model_dir: str
    programmed_at: float


_systems: dict[str, ProgrammedSystem] = {}
_lock = threading.Lock()  # registry updates only; check_system reads under it too


def check_system(cs_ip: str, program_id: str, mode: str, model_dir: str) -> None:
    """Raise SystemProgrammedError if the system at `cs_ip` already runs a different program."""
    with _lock:
        current = _systems.get(cs_ip)
    if current is None or current.program_id == program_id:
        return
    raise SystemProgrammedError(
        f"The CS system at {cs_ip} was programmed in this process with the {current.mode.upper()} program of "
        f"{current.model_dir} (graph {current.program_id[:12]}); it cannot also run the {mode.upper()} program of "
        f"{model_dir} (graph {program_id[:12]}): the fabric cannot be reprogrammed after its initial programming, "
        "and train_and_evaluate is not supported on the CS system.",
        fix="Run evaluation (or the changed model) in a new process, or evaluate on CPU/GPU with use_cs=False. "
            f"In tests and notebooks, cerebras_tf.release_system({cs_ip!r}) frees the simulated system.")


def program_system(cs_ip: str, program_id: str, mode: str, model_dir: str) -> ProgrammedSystem:
    """Program the system at `cs_ip` (first use), or check that it already runs this same program."""
    with _lock:
        current = _systems.get(cs_ip)
        if current is None:
            current = _systems[cs_ip] = ProgrammedSystem(cs_ip, program_id, mode, model_dir, time.time())
    check_system(cs_ip, program_id, mode, model_dir)
    return current


def release_system(cs_ip: str | None = None) -> None:
    """Free the simulated system at `cs_ip` (every system with None) so it can be programmed again."""
    with _lock:
        if cs_ip is None:
            _systems.clear()
        else:
            _systems.pop(cs_ip, None)


def programmed_system(cs_ip: str) -> ProgrammedSystem | None:
    """What the system at `cs_ip` runs, or None if it is not programmed in this process."""
    with _lock:
        return _systems.get(cs_ip)
