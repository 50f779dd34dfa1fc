"""A full disk or an unwritable model_dir during a run: one clear ModelDirWriteError, nothing half-written.

TF reports a full disk as a ResourceExhaustedError ("...; No space left on
device", under "Graph execution error:" when the checkpoint's save op hits it)
and an unwritable directory as a PermissionDeniedError ("Permission denied",
"Read-only file system"); Python writes raise OSError with ENOSPC, EDQUOT,
EACCES, EPERM or EROFS. `writing` turns any of them, raised while a run writes
into model_dir, into a ModelDirWriteError naming model_dir, the file being
written, the space left on that filesystem and the fix: free space or move
model_dir, and train again from the newest checkpoint, which it names. The
compiled artifact's writes name compile_dir instead (name="compile_dir"),
which may be a directory of its own. Other errors pass unchanged.
`remove_new_files` removes what a failed write created and nothing else.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import logging
import os
import re
import shutil
from typing import Iterator

import tensorflow as tf

from cerebras_tf.errors import ModelDirWriteError
from cerebras_tf.wse.units import fmt_bytes

_log = logging.getLogger("tensorflow")

# errno -> (the system's words, whether the disk is full rather than unwritable)
_ERRNOS = {errno.ENOSPC: ("No space left on device", True), errno.EDQUOT: ("Disk quota exceeded", True),
           errno.EACCES: ("Permission denied", False), errno.EPERM: ("Operation not permitted", False),
           errno.EROFS: ("Read-only file system", False)}

FileSignatures = dict[str, tuple[int, int, int]]


def write_failure(error: BaseException) -> tuple[str, bool] | None:
    """(the system's words, whether the disk is full) when `error` is a write that failed for lack of space or
    permission; None for any other error."""
    if isinstance(error, OSError):
        return _ERRNOS.get(error.errno) if error.errno is not None else None
    if isinstance(error, (tf.errors.ResourceExhaustedError, tf.errors.PermissionDeniedError)):
        text = str(getattr(error, "message", "") or error)
        for words, full in _ERRNOS.values():
            if words.lower() in text.lower():
                return words, full
        if isinstance(error, tf.errors.PermissionDeniedError):
            return text.strip().splitlines()[0].rpartition("; ")[2] or "Permission denied", False
    return None


def free_bytes(path: str) -> int | None:
    """The bytes free on the filesystem holding `path` (or its nearest existing parent); None if unknown."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def resume_text(model_dir: str, step: int | None = None) -> str:
    """Where training again starts: the checkpoint the `checkpoint` state file names (the newest one whose
    save completed), or the initial values; `step` the global step whose progress is lost."""
    latest = tf.train.latest_checkpoint(model_dir)
    if latest is None:
        return (f"no checkpoint was saved in {model_dir} before, so the run starts again from the initial values "
                "(or its warm start)")
    match = re.search(r"-(\d+)$", latest)
    at = f" (global step {match.group(1)})" if match else ""
    lost = f"; the steps after it up to {step} are trained again" if match and step is not None else ""
    return f"the run resumes from {latest}{at}, the newest checkpoint, which the failed write left intact{lost}"


# what each directory a run writes keeps (the fix says to copy it to keep that), and where it is set
_DIRECTORIES = {"model_dir": ("its checkpoints", "model_dir"),
                "compile_dir": ("its compiled artifacts", "compile_dir (CerebrasEstimator(compile_dir=...))")}


def write_error(model_dir: str, what: str, path: str, failure: tuple[str, bool], *, step: int | None = None,
                needed: int | None = None, then: str | None = None, name: str = "model_dir") -> ModelDirWriteError:
    """The ModelDirWriteError for `what` (e.g. "saving the checkpoint of global step 200") failing on `path`;
    `needed` the bytes the write needs (said when known); `then` what to do after the fix (default: train
    again, from the checkpoint it names). `name` is what the directory is to the user: "model_dir", or
    "compile_dir" (then `model_dir` is the compile_dir, and `then` should be given: it holds no checkpoints)."""
    reason, full = failure
    keeps, setting = _DIRECTORIES[name]
    then = then or (f"train again: {resume_text(model_dir, step)}" if name == "model_dir" else "run again")
    free = free_bytes(model_dir)
    free_text = f"{fmt_bytes(free)} free on that filesystem" if free is not None else "free space unknown"
    needs = f"; it needs about {fmt_bytes(needed)}" if needed else ""
    if full:
        message = f"The disk holding {name} {model_dir} is full: {what} failed ({reason}); {free_text}{needs}."
        fix = (f"Free space on that filesystem, or point {setting} at a disk with room (copy {model_dir} there to "
               f"keep {keeps}). Then {then}.")
    else:
        message = f"{name} {model_dir} is not writable: {what} failed ({reason}); {free_text}."
        fix = (f"Make {model_dir} writable again (its permissions, or a filesystem mounted read-only), or point "
               f"{setting} at a writable directory (copy {model_dir} there to keep {keeps}). Then {then}.")
    return ModelDirWriteError(message, where=path, fix=fix, path=path, reason=reason, free_bytes=free)


@contextlib.contextmanager
def writing(model_dir: str, what: str, path: str, then: str | None = None, *, cleanup: list[str] | None = None,
            step: int | None = None, needed: int | None = None, name: str = "model_dir") -> Iterator[None]:
    """Raise a full disk's or an unwritable model_dir's error inside the block as a ModelDirWriteError
    (write_error with `then`, `step`, `needed` and `name`: "compile_dir" for the compiled artifact's directory);
    any other error passes unchanged. On any error, the files matching the glob patterns `cleanup` that the block
    created or changed are removed first (logged)."""
    before = signatures(cleanup) if cleanup else {}
    try:
        yield
    except Exception as error:
        removed = remove_new_files(cleanup, before) if cleanup else []
        if removed:
            _log.info("Removed the partial files left by %s: %s", what,
                      ", ".join(os.path.basename(name) for name in removed))
        failure = write_failure(error)
        if failure is None:
            raise
        raise write_error(model_dir, what, path, failure, step=step, needed=needed, then=then, name=name) from error


def signatures(patterns: list[str]) -> FileSignatures:
    """path -> (inode, mtime_ns, size) of the files matching the glob `patterns` now."""
    found: FileSignatures = {}
    for pattern in patterns:
        for name in glob.glob(pattern):
            with contextlib.suppress(OSError):
                stat = os.stat(name)
                found[name] = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    return found


def remove_new_files(patterns: list[str], before: FileSignatures) -> list[str]:
    """Remove the files matching `patterns` that are not in `before` or changed since (what a failed write
    created or half-rewrote); returns their paths."""
    removed = []
    for name, signature in sorted(signatures(patterns).items()):
        if before.get(name) != signature:
            try:
                os.remove(name)
            except OSError as error:
                _log.warning("Could not remove %s, a partial file of the failed write: %s", name, error)
            else:
                removed.append(name)
    return removed
