"""The protobuf JSON arguments R1.8's appliance code passes, on a protobuf that removed them.

R1.8's ``run_appliance`` serialises the stack's FullConfig with
``json_format.MessageToJson(..., including_default_value_fields=False)``.
The appliance wheel ran on protobuf 3/4; protobuf 5 renamed that argument
``always_print_fields_with_no_presence`` and removed the old name, so on the
TF >= 2.16 stack (protobuf >= 5) the zoo's own code raised ``TypeError``
before reaching the system. While the ``appliance`` flavour is served,
:func:`install` makes ``MessageToJson`` and ``MessageToDict`` accept the old
keyword again (passed on under its new name); on a protobuf that still has it,
nothing is changed. :func:`uninstall` restores the originals.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from google.protobuf import json_format

OLD_NAME = "including_default_value_fields"
NEW_NAME = "always_print_fields_with_no_presence"
_FUNCTIONS = ("MessageToJson", "MessageToDict")
_ORIGINAL = "__cerebras_tf_original__"


def _accepting_old_name(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(message: Any, *args: Any, **kwargs: Any) -> Any:
        if OLD_NAME in kwargs:
            value = kwargs.pop(OLD_NAME)
            if NEW_NAME in kwargs and kwargs[NEW_NAME] != value:
                raise TypeError(f"{function.__name__}() got both {OLD_NAME}={value!r} and "
                                f"{NEW_NAME}={kwargs[NEW_NAME]!r}")
            kwargs[NEW_NAME] = value
        return function(message, *args, **kwargs)

    setattr(wrapper, _ORIGINAL, function)
    return wrapper


def needed() -> bool:
    """Whether this protobuf lacks the old keyword (protobuf >= 5)."""
    function = json_format.MessageToJson
    function = getattr(function, _ORIGINAL, function)
    return OLD_NAME not in inspect.signature(function).parameters


def install() -> None:
    """Accept ``including_default_value_fields`` again where this protobuf removed it. Idempotent."""
    if not needed():
        return
    for name in _FUNCTIONS:
        function = getattr(json_format, name)
        if not hasattr(function, _ORIGINAL):
            setattr(json_format, name, _accepting_old_name(function))


def uninstall() -> None:
    """Restore protobuf's own functions."""
    for name in _FUNCTIONS:
        function = getattr(json_format, name)
        setattr(json_format, name, getattr(function, _ORIGINAL, function))
