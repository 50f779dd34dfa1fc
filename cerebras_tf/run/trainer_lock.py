"""One trainer per model_dir on the CS system: a lock file, taken over from a trainer that died.

Two trainers writing one model_dir overwrite each other's checkpoints under
the same names (tf.estimator lets them). A training run on the system holds
``model_dir/cerebras_tf.trainer.lock`` (its pid, host and start time, JSON)
while it runs. A second one is refused with a TrainerLockError naming the
holder. A lock left by a process that is gone (same host, no such pid: a kill
-9) is taken over with one log line. Evaluation, prediction and CPU/GPU runs
take no lock. While it holds the lock, a run also removes what killed saves
of earlier runs left behind: TF's ``*.tempstate*`` files (a partial
checkpoint file each).
"""
from __future__ import annotations

import contextlib
import datetime
import glob
import json
import logging
import os
import socket
import time
from typing import Any, Iterator

from cerebras_tf.errors import TrainerLockError
from cerebras_tf.write_failures import writing

LOCK_FILE = "cerebras_tf.trainer.lock"

_log = logging.getLogger("tensorflow")


@contextlib.contextmanager
def trainer_lock(model_dir: str) -> Iterator[None]:
    """Hold model_dir's trainer lock for the block (see the module docstring)."""
    path = os.path.join(model_dir, LOCK_FILE)
    os.makedirs(model_dir, exist_ok=True)
    mine = {"pid": os.getpid(), "host": socket.gethostname(),
            "since": datetime.datetime.now().isoformat(timespec="seconds")}
    while not _create(path, mine):
        holder = _read(path)
        if holder is None and _younger_than(path, seconds=5.0):  # its holder may be writing it this moment
            time.sleep(0.1)
            continue
        if holder is not None and _alive(holder):
            raise TrainerLockError(
                f"Another training run holds {model_dir}: pid {holder.get('pid')} on {holder.get('host')}, since "
                f"{holder.get('since')} ({path}).",
                fix="Wait for it to finish, or train in another model_dir. If that process is gone on another "
                    f"host, remove {path}.")
        _log.info("Taking over the trainer lock of %s from pid %s on %s (since %s), which is gone.", model_dir,
                  (holder or {}).get("pid"), (holder or {}).get("host"), (holder or {}).get("since"))
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    try:
        _remove_leftovers(model_dir)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            if _read(path) == mine:
                os.remove(path)


def _create(path: str, content: dict[str, Any]) -> bool:
    """Create the lock file with `content`, unless it exists. A full disk or an unwritable model_dir is a
    ModelDirWriteError, and leaves no lock file."""
    model_dir = os.path.dirname(path)
    with writing(model_dir, "writing the trainer lock", path):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            with os.fdopen(fd, "w") as file:
                json.dump(content, file)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(path)
            raise
    return True


def _read(path: str) -> dict[str, Any] | None:
    """The lock's holder, or None when the file is gone or unreadable (a holder killed while writing it)."""
    try:
        with open(path, encoding="utf-8") as file:
            holder = json.load(file)
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _younger_than(path: str, seconds: float) -> bool:
    try:
        return time.time() - os.path.getmtime(path) < seconds
    except OSError:
        return False


def _alive(holder: dict[str, Any]) -> bool:
    """Whether the holder may still run: another host's process counts as alive (it cannot be checked)."""
    if holder.get("host") != socket.gethostname():
        return True
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_leftovers(model_dir: str) -> None:
    """Remove the *.tempstate* files killed checkpoint saves left in model_dir, saying which."""
    leftovers = sorted(glob.glob(os.path.join(glob.escape(model_dir), "*.tempstate*")))
    for name in leftovers:
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)
    if leftovers:
        _log.info("Removed %d partial file(s) a killed checkpoint save left in %s: %s", len(leftovers), model_dir,
                  ", ".join(os.path.basename(name) for name in leftovers))
