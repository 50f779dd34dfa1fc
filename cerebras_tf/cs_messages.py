"""The Cerebras configuration messages the Model Zoo builds, as real protobuf messages.

The zoo's scripts build ``CSConfig(**params["csconfig"])`` (the container's
``cerebras.pb.tf.csconfig_pb2``), a ``FullConfig`` of compiler settings for
``stack_params`` (``cerebras.pb.stack.full_pb2``, with the enums of
``tri_state_pb2``, ``autogen_pb2`` and ``cerebras_type_pb2``) and, in R1.8's
appliance flow, ``DebugArgs`` with the ``ExecutionStrategy`` enum
(``cerebras_appliance.pb.workflow.appliance.common.common_config_pb2``), into
which the FullConfig goes serialised as JSON. Here those messages are
declared with the fields the zoo sets (R1.6-R1.8), in a descriptor pool of
their own, so they behave as generated code does: unknown fields and values
of the wrong type raise, ``json_format`` and ``text_format`` work, nested
enums are attributes of their message. The simulated compiler takes none of
these settings (see cerebras_tf/cs_config.py); they exist so the zoo's code
runs unchanged and its settings can be checked.

:data:`PROTO_FILES` maps each ``*_pb2`` module's stem to the names that
module defines (messages, enum types, top-level enum values), which
:mod:`cerebras_tf.csoft.names` serves under the Cerebras module names.
"""
from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal import enum_type_wrapper

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"bool": _F.TYPE_BOOL, "int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64, "double": _F.TYPE_DOUBLE,
            "string": _F.TYPE_STRING}

# Each file: its package, enums {name: [values]} (value i numbered i), and messages. A message is
# {"fields": [(name, type, label)], "messages": {...nested...}, "enums": {...nested...}}; a field's type is a
# scalar name, or the dotted full name of a message or enum (".pkg.Msg"), or ("map", key type, value type).
_PACKAGE = "cerebras_tf.csoft.pb"
_P = "." + _PACKAGE + "."
_FILES: dict[str, dict[str, Any]] = {
    "tri_state": {"enums": {"TriState": ["TS_UNSPECIFIED", "TS_DISABLED", "TS_ENABLED"]}},
    "autogen": {"enums": {"AutogenPolicy": ["AP_UNSPECIFIED", "AP_DISABLED", "AP_ENABLED"]}},
    "cerebras_type": {"enums": {"CerebrasType": ["T_UNSPECIFIED", "T_F16", "T_CB16", "T_BF16", "T_F32", "T_I16",
                                                 "T_I32"]}},
    "full": {"deps": ["tri_state", "autogen", "cerebras_type"], "messages": {"FullConfig": {
        "fields": [("target_num_replicas", "int32"), ("matching", _P + "FullConfig.Matching"),
                   ("placement", _P + "FullConfig.Placement")],
        "messages": {
            "Matching": {
                "fields": [("add_pack_and_unpack", _P + "FullConfig.Matching.AddPackAndUnpack"),
                           ("autogen_policy", _P + "AutogenPolicy"),
                           ("kernel", _P + "FullConfig.Matching.Kernel"),
                           ("match_lair", _P + "FullConfig.Matching.MatchLair"),
                           ("optimize_graph", _P + "FullConfig.Matching.OptimizeGraph"),
                           ("remove_meta_kernels", _P + "FullConfig.Matching.RemoveMetaKernels")],
                "messages": {
                    "AddPackAndUnpack": {"fields": [("max_egress_per_pack", "int32")]},
                    "Kernel": {
                        "fields": [("autogen_config", _P + "FullConfig.Matching.Kernel.AutogenConfig"),
                                   ("enable_pipelined_mlm_loss", "bool"), ("inc_pwt_estimate", "bool"),
                                   ("no_dcache_spill_splits", "bool"),
                                   ("numerics", _P + "FullConfig.Matching.Kernel.Numerics"),
                                   ("use_legacy_vsl", "bool")],
                        "messages": {
                            "AutogenConfig": {"fields": [("always_store_inputs", _P + "TriState"),
                                                         ("enable_task_based_estimator", _P + "TriState"),
                                                         ("try_strip_outer_dim", _P + "TriState")]},
                            "Numerics": {"fields": [("layernorm_compute_dtype", _P + "CerebrasType")]},
                        }},
                    "MatchLair": {"fields": [("disabled_converters", "string", "repeated")]},
                    "OptimizeGraph": {"fields": [("placement_prediction",
                                                  _P + "FullConfig.Matching.OptimizeGraph.PlacementPrediction")],
                                      "messages": {"PlacementPrediction": {"fields": [("max_fill_rate", "double")]}}},
                    "RemoveMetaKernels": {"fields": [("remove_reshape_meta", _P + "TriState")]},
                }},
            "Placement": {
                "fields": [("optimize_buses", _P + "FullConfig.Placement.DeltaMargin"),
                           ("pathfinder", _P + "FullConfig.Placement.DeltaMargin"),
                           ("pathfinder_inter_replica", _P + "FullConfig.Placement.PathfinderInterReplica"),
                           ("prep_recolor_kernels", _P + "FullConfig.Placement.PrepRecolorKernels")],
                "messages": {
                    "DeltaMargin": {"fields": [("deltat_relative_margin", "double")]},
                    "PathfinderInterReplica": {"fields": [("allow_infeasible_initial_state", _P + "TriState"),
                                                          ("fix_existing", _P + "TriState")]},
                    "PrepRecolorKernels": {"fields": [("wrap_pack_kernel", "bool")]},
                }},
        }}}},
    "csconfig": {"messages": {"CSConfig": {"fields": [("use_cbfloat16", "bool"), ("num_csx", "int32"),
                                                      ("num_workers_per_csx", "int32")]}}},
    "common_config": {
        "enums": {"ExecutionStrategy": ["ES_UNSPECIFIED", "ES_PIPELINE", "ES_WEIGHT_STREAMING"]},
        "messages": {"DebugArgs": {
            "fields": [("debug_ini", _P + "DebugArgs.DebugINI"), ("debug_mgr", _P + "DebugArgs.DebugMGR"),
                       ("debug_crd", _P + "DebugArgs.DebugCRD")],
            "messages": {
                "DebugINI": {"fields": [("frozen_content", "string")]},
                "DebugMGR": {
                    "fields": [("clean_pod_policy", _P + "DebugArgs.DebugMGR.CleanPodPolicy"),
                               ("task_spec_hints", ("map", "string", _P + "DebugArgs.DebugMGR.TaskSpecHint")),
                               ("scheduler_hints", ("map", "string", "string")),
                               ("labels", ("map", "string", "string"))],
                    "enums": {"CleanPodPolicy": ["ALL", "NONE", "RUNNING"]},
                    "messages": {"TaskSpecHint": {"fields": [("container_image", "string")]}}},
                "DebugCRD": {"fields": [("pipeline_options", _P + "DebugArgs.DebugCRD.PipelineOptions")],
                             "messages": {"PipelineOptions": {"fields": [("full_config", "string")]}}},
            }}}},
}


def _add_enum(enum: descriptor_pb2.EnumDescriptorProto, values: list[str]) -> None:
    for number, value in enumerate(values):
        enum.value.add(name=value, number=number)


def _add_message(message: descriptor_pb2.DescriptorProto, spec: dict[str, Any], full_name: str,
                 enum_names: set[str]) -> None:
    for name, values in spec.get("enums", {}).items():
        _add_enum(message.enum_type.add(name=name), values)
    for name, nested in spec.get("messages", {}).items():
        _add_message(message.nested_type.add(name=name), nested, f"{full_name}.{name}", enum_names)
    for number, (name, kind, *label) in enumerate(spec.get("fields", []), start=1):
        field = message.field.add(name=name, number=number, json_name=name,
                                  label=_F.LABEL_REPEATED if label == ["repeated"] else _F.LABEL_OPTIONAL)
        if isinstance(kind, tuple):  # a map: a repeated nested entry message, as protoc writes it
            entry_name = "".join(part.capitalize() for part in name.split("_")) + "Entry"
            entry = message.nested_type.add(name=entry_name)
            entry.options.map_entry = True
            _add_message(entry, {"fields": [("key", kind[1]), ("value", kind[2])]}, f"{full_name}.{entry_name}",
                         enum_names)
            field.label, field.type, field.type_name = _F.LABEL_REPEATED, _F.TYPE_MESSAGE, f".{full_name}.{entry_name}"
        elif kind in _SCALARS:
            field.type = _SCALARS[kind]
        else:
            field.type = _F.TYPE_ENUM if kind.rsplit(".", 1)[-1] in enum_names else _F.TYPE_MESSAGE
            field.type_name = kind


def _enum_names() -> set[str]:
    """The (simple) names of every enum declared above: a field of such a type is an enum field."""
    names: set[str] = set()

    def walk(spec: dict[str, Any]) -> None:
        names.update(spec.get("enums", {}))
        for nested in spec.get("messages", {}).values():
            walk(nested)

    for spec in _FILES.values():
        walk(spec)
    return names


def _build() -> dict[str, dict[str, Any]]:
    pool = descriptor_pool.DescriptorPool()
    enum_names = _enum_names()
    files: dict[str, dict[str, Any]] = {}
    for stem, spec in _FILES.items():
        proto = descriptor_pb2.FileDescriptorProto(name=f"cerebras_tf/csoft/{stem}.proto", package=_PACKAGE,
                                                   syntax="proto3",
                                                   dependency=[f"cerebras_tf/csoft/{d}.proto"
                                                               for d in spec.get("deps", [])])
        for name, values in spec.get("enums", {}).items():
            _add_enum(proto.enum_type.add(name=name), values)
        for name, message in spec.get("messages", {}).items():
            _add_message(proto.message_type.add(name=name), message, f"{_PACKAGE}.{name}", enum_names)
        pool.Add(proto)
        file = pool.FindFileByName(proto.name)
        names: dict[str, Any] = {}
        for enum in file.enum_types_by_name.values():
            names[enum.name] = enum_type_wrapper.EnumTypeWrapper(enum)
            names.update((value.name, value.number) for value in enum.values)
        for message in file.message_types_by_name.values():
            names[message.name] = message_factory.GetMessageClass(message)
        files[stem] = names
    return files


# stem of the Cerebras *_pb2 module -> the names it defines
PROTO_FILES: dict[str, dict[str, Any]] = _build()

FullConfig = PROTO_FILES["full"]["FullConfig"]
CSConfigMessage = PROTO_FILES["csconfig"]["CSConfig"]
DebugArgs = PROTO_FILES["common_config"]["DebugArgs"]
ExecutionStrategy = PROTO_FILES["common_config"]["ExecutionStrategy"]
