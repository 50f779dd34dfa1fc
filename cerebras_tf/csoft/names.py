"""The opt-in step that makes the Cerebras package names of the Model Zoo (R1.6-R1.8) import cerebras-tf.

The zoo's scripts import the Cerebras software under the names of one of
three installations (flavours here), and pick their code path by which names
import:

- ``container`` (R1.6, R1.7 with ``--cs_ip``): ``cerebras.framework``,
  ``cerebras.tf.*`` and ``cerebras.pb.*``, as in the Cerebras container.
- ``weight_streaming`` (R1.6, R1.7's weight-streaming configs with
  ``--cs_ip``: GPT-2 ``*_ws``, GPT-3, GPT-J): the container's names plus
  ``tfwse`` (empty: the zoo only imports it) and
  ``cerebras.tf.ws.cs_estimator_ws.CerebrasEstimator``, as in the Cerebras
  weight-streaming container. The zoo's ``get_execution_mode()`` then says
  WeightStreaming and its estimator wrapper subclasses that estimator
  (:mod:`cerebras_tf.csoft.cs_estimator_ws`: weight streaming unless
  cs_config's execution_strategy says otherwise). ``cerebras.tf.cs_estimator``
  stays the pipelined stack's estimator, as the zoo's switch implies the
  container had both.
- ``appliance`` (R1.8's ``run_appliance``, ``python run.py CSX pipeline``):
  ``cerebras_appliance.*`` and ``cerebras_tensorflow.*``, as the appliance
  wheel installs them. R1.8 refuses to run where ``cerebras.framework``
  imports, so a process has one set, never both.

``install(flavour)`` adds an import hook that serves the flavour's names
(:data:`FLAVOURS` lists each name and what it is in cerebras-tf); ``python -m
cerebras_tf.csoft FLAVOUR run.py ARGS...`` runs a script with it. Nothing
is served by default, and a Cerebras package that is really installed is
never shadowed: the hook comes after Python's own finders, and a flavour
whose top-level package is installed is not served at all (with a warning).
The ``appliance`` flavour also lets protobuf's ``json_format`` take the
keyword R1.8's code passes and protobuf 5 removed (:mod:`protobuf_compat`).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any, Mapping, Sequence

from cerebras_tf.errors import ConfigError

# What a Cerebras module is in cerebras-tf: the public names of a module of the project ("module"), a module
# made of named attributes ({attribute: "module:attribute"}), or the names of a *_pb2 module (("pb2", stem):
# see cerebras_tf/cs_messages.py). Every prefix of a listed name is a package.
Target = str | Mapping[str, str] | tuple[str, str]

_SUMMARY_HELPERS = {name: f"cerebras_tf.tf_helper:{name}" for name in ("summary_layer", "summarize_tensor",
                                                                        "boundary_cast")}
_ESTIMATOR = "cerebras_tf.cs_estimator:CerebrasEstimator"
_SPEC = {"CSEstimatorSpec": "cerebras_tf.spec:CSEstimatorSpec"}
_RUN_CONFIG = "cerebras_tf.run_config:CSRunConfig"


def _protos(prefix: str, layout: Mapping[str, str]) -> dict[str, Target]:
    return {f"{prefix}.{path}_pb2": ("pb2", stem) for path, stem in layout.items()}


_PB_LAYOUT = {"common.tri_state": "tri_state", "common.cerebras_type": "cerebras_type",
              "stack.autogen": "autogen", "stack.full": "full"}

_CONTAINER: dict[str, Target] = {
    "cerebras.framework": {},
    "cerebras.tf.cs_estimator": {"CerebrasEstimator": _ESTIMATOR},
    "cerebras.tf.run_config": {"CSRunConfig": _RUN_CONFIG},
    "cerebras.tf.cs_estimator_spec": _SPEC,
    "cerebras.tf.tf_helper": "cerebras_tf.tf_helper",
    "cerebras.tf.summary": "cerebras_tf.csoft.summary",
    "cerebras.tf.host_call": "cerebras_tf.csoft.host_call",
    "cerebras.pb.tf.csconfig_pb2": ("pb2", "csconfig"),
    **_protos("cerebras.pb", _PB_LAYOUT),
}

FLAVOURS: dict[str, dict[str, Target]] = {
    "container": _CONTAINER,
    "weight_streaming": {
        **_CONTAINER,
        "tfwse": {},  # the zoo's canary for the weight-streaming container: imported, never used
        "cerebras.tf.ws.cs_estimator_ws": {"CerebrasEstimator": "cerebras_tf.csoft.cs_estimator_ws:CerebrasEstimator"},
    },
    "appliance": {
        "cerebras_appliance.CSConfig": {"CSConfig": "cerebras_tf.cs_config:ApplianceCSConfig"},
        "cerebras_appliance.cs_run_config": {"CSRunConfig": _RUN_CONFIG},
        "cerebras_appliance.run_utils": {"get_debug_args": "cerebras_tf.csoft.appliance:get_debug_args"},
        "cerebras_appliance.environment": {"appliance_environ": "cerebras_tf.csoft.appliance:appliance_environ"},
        "cerebras_appliance.pb.workflow.appliance.common.common_config_pb2": ("pb2", "common_config"),
        "cerebras_appliance.pb.client.common_config_pb2": ("pb2", "common_config"),  # R1.6's place for DebugArgs
        **_protos("cerebras_appliance.pb", _PB_LAYOUT),
        "cerebras_tensorflow.cs_estimator_app": {"CerebrasAppEstimator": _ESTIMATOR},
        "cerebras_tensorflow.cs_estimator_spec": _SPEC,
        "cerebras_tensorflow.summary": _SUMMARY_HELPERS,
        "cerebras_tensorflow.graph_extraction": {name: f"cerebras_tf.csoft.summary:{name}"
                                                 for name in ("cs1_enable_summaries", "cs1_disable_summaries")},
        "cerebras_tensorflow.saver.checkpoint_reader": {
            "CheckpointReader": "cerebras_tf.csoft.checkpoint_reader:CheckpointReader"},
    },
}

# The releases whose scripts each flavour runs, for messages.
RELEASES = {"container": "R1.6 and R1.7 with --cs_ip",
            "weight_streaming": "R1.6 and R1.7's weight-streaming configs (GPT-2 *_ws, GPT-3, GPT-J) with --cs_ip",
            "appliance": "R1.8 (run_appliance: run.py CSX pipeline)"}


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads the Cerebras module names of one flavour (after Python's own finders)."""

    def __init__(self, flavour: str, served: Mapping[str, Target]) -> None:
        self.flavour = flavour
        self.targets = dict(served)
        self.packages = {name.rsplit(".", depth)[0] for name in served for depth in range(1, name.count(".") + 1)}
        self.served: list[str] = []  # the names found so far (forgotten by uninstall)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.targets and fullname not in self.packages:
            return None
        self.served.append(fullname)
        return importlib.machinery.ModuleSpec(fullname, self, origin=f"cerebras-tf stand-in ({self.flavour})",
                                              is_package=fullname in self.packages)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # a new module, filled in by exec_module

    def exec_module(self, module: types.ModuleType) -> None:
        target = self.targets.get(module.__name__)
        module.__doc__ = f"cerebras-tf's stand-in for the Cerebras module {module.__name__} ({self.flavour})."
        if isinstance(target, str):  # the public names of one of the project's modules
            project_module = importlib.import_module(target)
            names = getattr(project_module, "__all__", None) or [
                name for name in vars(project_module) if not name.startswith("_")]
            module.__dict__.update((name, getattr(project_module, name)) for name in names)
            module.__doc__ = f"{module.__doc__[:-1]}: the names of {target}."
        elif isinstance(target, tuple):
            from cerebras_tf.cs_messages import PROTO_FILES

            module.__dict__.update(PROTO_FILES[target[1]])
        elif target is not None:
            for attribute, where in target.items():
                module_name, _, name = where.partition(":")
                setattr(module, attribute, getattr(importlib.import_module(module_name), name))


def install(flavour: str) -> None:
    """Serve the Cerebras module names of `flavour` ("container", "weight_streaming" or "appliance") from
    cerebras-tf.

    Idempotent; installing another flavour replaces this one (modules
    already imported stay). A flavour whose top-level package (``cerebras``,
    ``tfwse``, ``cerebras_appliance``/``cerebras_tensorflow``) is really
    installed is not served: a ConfigWarning names it, and the real package
    is used.
    """
    if flavour not in FLAVOURS:
        raise ConfigError(
            f"Unknown Cerebras software flavour {flavour!r}.",
            fix="Use 'container' for Model Zoo R1.6/R1.7 scripts run with --cs_ip, 'weight_streaming' for their "
                "weight-streaming configs (GPT-2 *_ws, GPT-3, GPT-J) with --cs_ip, or 'appliance' for R1.8's "
                "run_appliance scripts (python run.py CSX pipeline ...).")
    current = _installed()
    if current is not None and current.flavour == flavour:
        return
    uninstall()
    served = FLAVOURS[flavour]
    real = sorted(top for top in {name.split(".")[0] for name in served}
                  if importlib.machinery.PathFinder.find_spec(top) is not None)
    if real:
        from cerebras_tf.errors import ConfigWarning

        warnings.warn(f"A Cerebras installation provides {', '.join(real)}: cerebras-tf does not stand in for "
                      f"it (the {flavour} names under it come from that installation).", ConfigWarning,
                      stacklevel=2)
        served = {name: target for name, target in served.items() if name.split(".")[0] not in real}
    sys.meta_path.append(_StandInFinder(flavour, served))
    if flavour == "appliance":
        from cerebras_tf.csoft import protobuf_compat

        protobuf_compat.install()  # R1.8's appliance code passes protobuf 3/4's JSON keyword


def uninstall() -> None:
    """Stop serving the Cerebras names, and forget the stand-in modules imported so far."""
    finder = _installed()
    if finder is None:
        return
    sys.meta_path.remove(finder)
    if finder.flavour == "appliance":
        from cerebras_tf.csoft import protobuf_compat

        protobuf_compat.uninstall()
    for name in finder.served:
        sys.modules.pop(name, None)


def installed_flavour() -> str | None:
    """The flavour being served, or None."""
    finder = _installed()
    return finder.flavour if finder is not None else None


def _installed() -> Any:
    return next((finder for finder in sys.meta_path if isinstance(finder, _StandInFinder)), None)
