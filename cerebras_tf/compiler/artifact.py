"""The compiled artifact in compile_dir: IR, report, graph hash and target system, with checksums.

Layout: `<compile_dir>/<mode>/` holds program.json + constants.npz (the IR),
report.txt, and manifest.json (graph hash, target system, IR version, size
and sha256 of every file). Artifacts are data only (JSON, npz without
pickle): loading one cannot run code. They are written to a temporary
directory beside the target and renamed into place, so a reader sees either
the old artifact or the new one, never a half-written one. A full disk or an
unwritable compile_dir is a ModelDirWriteError naming compile_dir, and the
failed write leaves nothing behind.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from typing import Any, Mapping

import tensorflow as tf

from cerebras_tf import ir
from cerebras_tf.errors import ArtifactSystemMismatchError
from cerebras_tf.write_failures import writing

MANIFEST_FILE = "manifest.json"
REPORT_FILE = "report.txt"

_log = tf.compat.v1.logging


def system_identity(system_name: str | None, fabric: Any = None) -> dict[str, Any]:
    """What ties an artifact to a CS system: its name (cs_ip by default) and fabric (JSON data)."""
    if fabric is not None and not isinstance(fabric, (str, int, float)):
        fabric = fabric.to_dict() if hasattr(fabric, "to_dict") else repr(fabric)
    return {"system_name": system_name, "fabric": fabric}


def artifact_dir(compile_dir: str, mode: str) -> str:
    return os.path.join(compile_dir, mode)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_artifact(directory: str, graph_hash: str, system: dict[str, Any]) -> tuple[ir.Program | None, str]:
    """The program stored in `directory` if it is intact and matches; else (None, why it is rebuilt).

    Raises ArtifactSystemMismatchError if the artifact was built for another
    named system, as the real CS system refuses a model compiled for another.
    """
    manifest_path = os.path.join(directory, MANIFEST_FILE)
    if not os.path.exists(manifest_path):
        return None, "no artifact yet"
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
        stored_system, stored_hash, files = manifest["system"], manifest["graph_hash"], manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, _corrupt(directory, f"unreadable manifest ({exc})")
    if stored_system != system:
        if stored_system.get("system_name") and system.get("system_name"):
            raise ArtifactSystemMismatchError(
                f"The compiled artifact in {directory} was built for CS system "
                f"{_describe(stored_system)}, not {_describe(system)}: a model compiled for one CS system "
                "cannot run on another.",
                fix="Use a separate compile_dir per system (CerebrasEstimator(compile_dir=...)), or delete "
                f"{directory} to recompile for {_describe(system)}.")
        return None, f"artifact built for {_describe(stored_system)}; recompiling for {_describe(system)}"
    if manifest.get("ir_version") != ir.IR_VERSION:
        return None, f"artifact has IR version {manifest.get('ir_version')}, this compiler writes {ir.IR_VERSION}"
    if stored_hash != graph_hash:
        return None, "the model's graph (or the compiler) changed since the artifact was compiled"
    for name, meta in files.items():
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            return None, _corrupt(directory, f"{name} is missing")
        if os.path.getsize(path) != meta["size"] or _sha256(path) != meta["sha256"]:
            return None, _corrupt(directory, f"{name} does not match its checksum (truncated or modified)")
    try:
        program = ir.Program.load(directory)
    except Exception as exc:  # any unreadable content means rebuild
        return None, _corrupt(directory, f"cannot be loaded ({exc})")
    try:
        return program.verify(), "reused"
    except ir.IRError as exc:  # intact files holding a malformed program (edited by hand, an older bug)
        return None, _corrupt(directory, f"holds a malformed program ({'; '.join(exc.problems[:3])})")


def _corrupt(directory: str, why: str) -> str:
    message = f"Compiled artifact in {directory} is corrupt: {why}. Rebuilding it."
    _log.warning(message)
    return message


def _describe(system: dict[str, Any]) -> str:
    name = system.get("system_name") or "<no system>"
    fabric = system.get("fabric")
    fabric = fabric.get("name", fabric) if isinstance(fabric, dict) else fabric
    return f"{name!r}" + (f" (fabric {fabric!r})" if fabric else "")


def write_artifact(directory: str, program: ir.Program, report: str, graph_hash: str,
                   system: dict[str, Any], extra_files: Mapping[str, bytes] | None = None) -> None:
    """Write the artifact atomically (temp dir + rename) to `directory`.

    `extra_files` (name -> content, e.g. the placement's report.json and PNG)
    are written beside the IR and covered by the manifest's checksums.
    A full disk or an unwritable compile_dir (the parent of `directory`) is a
    ModelDirWriteError naming compile_dir (write_failures.writing); a failed
    write leaves nothing behind: the temporary directory and the directories
    it created are removed, and an artifact already in `directory` stays as
    it was.
    """
    compile_dir = os.path.dirname(os.path.abspath(directory))
    kept = ("the artifact already there is untouched" if os.path.isdir(directory)
            else "the failed write left nothing there")
    then = f"compile or train again: the model is compiled again into {directory} ({kept})"
    with writing(compile_dir, f"writing the compile artifact of mode {program.mode}", directory, then,
                 name="compile_dir"):
        _write_artifact(compile_dir, directory, program, report, graph_hash, system, extra_files or {})


def _write_artifact(compile_dir: str, directory: str, program: ir.Program, report: str, graph_hash: str,
                    system: dict[str, Any], extra_files: Mapping[str, bytes]) -> None:
    missing = _missing_dirs(compile_dir)
    staging = None
    try:
        os.makedirs(compile_dir, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.tmp-", dir=compile_dir)
        names = program.save(staging)
        with open(os.path.join(staging, REPORT_FILE), "w", encoding="utf-8") as f:
            f.write(report)
        names.append(REPORT_FILE)
        for name, content in extra_files.items():
            with open(os.path.join(staging, name), "wb") as f:
                f.write(content)
            names.append(name)
        files = {name: {"size": os.path.getsize(os.path.join(staging, name)),
                        "sha256": _sha256(os.path.join(staging, name))} for name in names}
        manifest = {"graph_hash": graph_hash, "system": system, "ir_version": ir.IR_VERSION,
                    "mode": program.mode, "files": files}
        with open(os.path.join(staging, MANIFEST_FILE), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
        _replace_dir(staging, directory)
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        for made in missing:  # deepest first; one another process wrote into since stays
            with contextlib.suppress(OSError):
                os.rmdir(made)
        raise


def _missing_dirs(path: str) -> list[str]:
    """`path` and its parents that do not exist yet, deepest first."""
    missing = []
    while not os.path.exists(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def _replace_dir(staging: str, directory: str) -> None:
    if not os.path.exists(directory):
        os.rename(staging, directory)
        return
    retired = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.old-", dir=os.path.dirname(staging))
    os.rmdir(retired)
    os.rename(directory, retired)
    try:
        os.rename(staging, directory)
    except BaseException:
        os.rename(retired, directory)  # the old artifact back in place
        raise
    shutil.rmtree(retired, ignore_errors=True)
