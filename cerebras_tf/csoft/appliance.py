"""What R1.8's appliance flow imports from ``cerebras_appliance`` besides its config: DebugArgs files, environ.

``get_debug_args(path)`` reads a DebugArgs message from a file in protobuf
text format (the real tool's ``--debug_args_path``), checked as a CSConfig
checks the DebugArgs it is given. ``appliance_environ`` is the environment
the appliance's processes start with: here, this process's own
``os.environ`` (the simulated system runs in this process).
"""
from __future__ import annotations

import os
from typing import Any

from google.protobuf import text_format

from cerebras_tf.cs_config import check_debug_args
from cerebras_tf.cs_messages import DebugArgs
from cerebras_tf.errors import ConfigValueError

__all__ = ["appliance_environ", "get_debug_args"]

appliance_environ = os.environ


def get_debug_args(path: str) -> Any:
    """The DebugArgs message in the text-format file at `path`; a missing or malformed file raises
    ConfigValueError naming it."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as exc:
        raise ConfigValueError(f"debug_args_path {path!r} cannot be read: {exc.strerror}.",
                               fix="Give the path of a DebugArgs file in protobuf text format, or leave "
                                   "debug_args_path out.") from None
    try:
        debug_args = text_format.Parse(text, DebugArgs())
    except text_format.ParseError as exc:
        raise ConfigValueError(f"debug_args_path {path!r} is not a DebugArgs message in protobuf text format: {exc}",
                               fix="Fix the file (e.g. write it with google.protobuf.text_format.MessageToString), "
                                   "or leave debug_args_path out.") from None
    check_debug_args(debug_args)
    return debug_args
