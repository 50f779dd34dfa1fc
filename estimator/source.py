"""Find where in the user's code something was created."""
from __future__ import annotations

import inspect
import os
import sys
import sysconfig
import traceback
from typing import Any, Iterable

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Frames under these directories are machinery (our layers, installed
# packages, the standard library), never the user's code.
_MACHINERY_DIRS = tuple(
    os.path.abspath(path) + os.sep
    for path in (
        os.path.join(_REPO_ROOT, "estimator"),
        os.path.join(_REPO_ROOT, "cerebras_tf"),
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
    )
)


def is_user_file(filename: str) -> bool:
    """True unless `filename` belongs to this project's layers, an installed package or the stdlib."""
    if filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    if "site-packages" in path or "dist-packages" in path:
        return False
    return not path.startswith(_MACHINERY_DIRS)


def user_frame(frames: Iterable[Any]) -> str | None:
    """'file:line' of the innermost frame of `frames` that lies in user code.

    `frames` is a sequence of frame summaries, outermost first (a TF op's
    `traceback`, or `traceback.extract_stack()`).
    """
    found = None
    for frame in frames:
        filename, lineno = frame[0], frame[1]
        if is_user_file(filename):
            found = f"{filename}:{lineno}"
    return found


def op_location(op: Any) -> str | None:
    """'file:line' of the user code that created a TF graph operation, if known."""
    try:
        return user_frame(op.traceback)
    except (AttributeError, ValueError):  # e.g. an op imported from a GraphDef
        return None


def creation_location(value: Any) -> str | None:
    """'file:line' of the user code that created a TF tensor, variable or operation, or the first of a nest
    (dicts, lists, tuples) of them whose creation TF recorded; None for anything else (Python objects)."""
    if isinstance(value, dict):
        items = [value[key] for key in sorted(value, key=str)]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        op = getattr(value, "op", value)  # a tensor's or variable's op, or an operation itself
        return op_location(op) if hasattr(op, "traceback") else None
    return next((location for item in items if (location := creation_location(item))), None)


def caller_location() -> str | None:
    """'file:line' of the innermost user frame calling into this project now (e.g. the user's train(...) line)."""
    return user_frame(traceback.extract_stack())


def function_location(fn: Any) -> str:
    """'file:line' where a Python callable is defined (its repr if unknown)."""
    target = inspect.unwrap(getattr(fn, "func", fn))  # functools.partial -> its function
    try:
        return f"{inspect.getsourcefile(target)}:{inspect.getsourcelines(target)[1]}"
    except (TypeError, OSError):
        return repr(fn)


def raised_within_module_of(error: BaseException, obj: Any) -> bool:
    """Whether a frame of `error`'s traceback runs code of the module that defines `obj` (e.g. the checks
    tf.estimator's EstimatorSpec makes of its fields while it is constructed)."""
    filename = getattr(sys.modules.get(getattr(obj, "__module__", "")), "__file__", None)
    if filename is None:
        return False
    filename = os.path.abspath(filename)
    return any(os.path.abspath(frame.filename) == filename for frame in traceback.extract_tb(error.__traceback__))


def error_location(error: BaseException) -> str | None:
    """'file:line' of the innermost user frame of `error`'s traceback (the user's line that led to it)."""
    return user_frame(traceback.extract_tb(error.__traceback__))
