"""Keep TensorFlow's log readable: each message once, no deprecation notices the user cannot act on.

Two sources of noise in a script run under absl (`app.run`, as the examples
and many Model Zoo scripts are):

- Every record of the "tensorflow" logger is printed twice. TensorFlow gives
  its logger a stderr handler of its own when it is imported (the root logger
  has none yet), and `app.run` later puts absl's handler on the root logger,
  where the same records arrive by propagation. absl removes other stderr
  handlers from the root logger, but not TensorFlow's. We keep TensorFlow's
  handler (its `INFO:tensorflow:...` lines are what tf.estimator users read)
  and have absl's handler skip the records TensorFlow's handler has printed.
- TensorFlow's deprecation notices ("From <file:line>: X is deprecated ...")
  for calls made by cerebras_tf, estimator/ or TensorFlow itself: the user
  did not write those calls and cannot change them. Notices located in the
  user's own code are kept.
- The Estimator's "Using config: {...}" dump, which spreads over a dozen lines
  (the session_config proto prints one field per line): it is kept, on one line.

`install()` is idempotent and needs neither TensorFlow nor absl to be
imported first (it configures the standard `logging` objects by name).
"""
from __future__ import annotations

import importlib.util
import logging
import os
from functools import lru_cache

__all__ = ["install", "is_library_deprecation"]

TF_LOGGER = "tensorflow"
_DEPRECATION_PREFIX = "From %s: "
# Packages whose own calls of deprecated TensorFlow APIs are not the user's to fix.
_LIBRARY_PACKAGES = ("cerebras_tf", "estimator", "tensorflow", "tensorflow_estimator", "keras", "tf_keras")


@lru_cache(maxsize=None)
def _library_dirs() -> tuple[str, ...]:
    """The source directories of _LIBRARY_PACKAGES that are installed (found without importing them)."""
    dirs = []
    for name in _LIBRARY_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            dirs.append(os.path.realpath(location) + os.sep)
    return tuple(dirs)


def is_library_deprecation(record: logging.LogRecord) -> bool:
    """True for a TensorFlow deprecation notice whose call site is in a library, not in the user's code."""
    if not isinstance(record.msg, str) or not record.msg.startswith(_DEPRECATION_PREFIX):
        return False
    if "deprecated" not in record.msg or not isinstance(record.args, tuple) or not record.args:
        return False
    path = os.path.realpath(str(record.args[0]).rsplit(":", 1)[0])
    return path.startswith(_library_dirs())


class _LibraryDeprecationFilter(logging.Filter):
    """On the "tensorflow" logger: drops deprecation notices located in library code."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not is_library_deprecation(record)


class _PrintedByTensorFlowFilter(logging.Filter):
    """On absl's handler: skips records of the "tensorflow" logger when its own handler printed them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != TF_LOGGER and not record.name.startswith(TF_LOGGER + "."):
            return True
        return not logging.getLogger(TF_LOGGER).handlers


class _OneLineConfigFilter(logging.Filter):
    """On the "tensorflow" logger: the Estimator's "Using config: %s" record, its text on one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Using config: %s" and isinstance(record.args, tuple) and len(record.args) == 1:
            record.args = (" ".join(str(record.args[0]).split()),)
        return True


def _has(filterer: logging.Filterer, kind: type) -> bool:
    return any(isinstance(existing, kind) for existing in filterer.filters)


def install() -> None:
    """Put the filters in place (once): on TensorFlow's logger and, if absl is installed, on absl's handler."""
    tf_logger = logging.getLogger(TF_LOGGER)
    for kind in (_LibraryDeprecationFilter, _OneLineConfigFilter):
        if not _has(tf_logger, kind):
            tf_logger.addFilter(kind())
    try:
        from absl import logging as absl_logging
    except ImportError:  # pragma: no cover - absl-py is a dependency
        return
    handler = absl_logging.get_absl_handler()
    if not _has(handler, _PrintedByTensorFlowFilter):
        handler.addFilter(_PrintedByTensorFlowFilter())
