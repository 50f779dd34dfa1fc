"""Reading the text of a tf.data service error: which input worker failed, TF's message, the nodes it names.

tf.data service hands the chief a worker's pipeline error as text only, e.g.
"Failed to get element from worker 127.0.0.1:5001: assertion failed: ...
{{node assert_less/Assert}} ... [Op:IteratorGetNext]". The stream turns that
into an InputWorkerError naming the worker task and the user's line (see
stream.py); this module only takes the text apart.
"""
from __future__ import annotations

import dataclasses
import re

_WORKER_ERROR = re.compile(r"Failed to get element from worker (\S+?):\s")
_NODE = re.compile(r"\{\{node ([^}]+)\}\}")
_GET_NEXT_SUFFIX = re.compile(r"\s*\[Op:IteratorGetNext\].*$", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class WorkerErrorText:
    """A tf.data service error message taken apart."""

    address: str | None  # the worker's "host:port", when the message names one
    message: str  # TF's own message, without tf.data service's prefix and the iterator op suffix
    nodes: tuple[str, ...]  # the graph nodes the message names ({{node ...}}), first first


def parse_worker_error(text: str) -> WorkerErrorText:
    """Take apart the text of an error read from tf.data service (any text: unknown parts stay in `message`)."""
    match = _WORKER_ERROR.search(text)
    address = match.group(1) if match else None
    if match:
        text = text[match.end():]
    message = _GET_NEXT_SUFFIX.sub("", text.strip()).strip()
    return WorkerErrorText(address, message, tuple(_NODE.findall(message)))
