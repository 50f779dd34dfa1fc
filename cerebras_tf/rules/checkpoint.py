"""Rules on the checkpoint a CS-system run starts from: it must read whole and fit the model.

The most common real mistake is a model edited (layer sizes, names, another
optimizer) while model_dir keeps the old model's checkpoints. Plain TF fails
when it restores one ("Key ... not found in checkpoint", or "Assign requires
shapes of both tensors to match"); a run on the system compares the
checkpoint's variables with the graph's before anything is compiled or
written, and names every variable that is missing or has another shape or
dtype, with both.

A damaged checkpoint (a truncated or corrupted index or data file, as a
killed copy or a bad disk leaves) is named with the file and what is wrong
before anything runs, with the newest intact checkpoint beside it and how to
resume from that one (TF's reader fails deep inside the run, naming no file).

As in TF, the graph's global variables are what is restored (tf.estimator's
Saver restores exactly those); variables the checkpoint holds but the graph
lacks are ignored (e.g. the loss-scale state of a run that used amp on CPU, or
a layer that was removed); `extra_variables` lists them so the run can say so.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import tensorflow as tf

from cerebras_tf.errors import CerebrasError, CheckpointMismatchError, UnsupportedTensorFlowError
from estimator.source import op_location


@dataclasses.dataclass(frozen=True)
class VariableSpec:
    """A variable as the checkpoint stores it: its key, dtype name and full shape, and where it was created."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    location: str | None = None

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


def graph_variables(graph: tf.Graph) -> dict[str, VariableSpec]:
    """The global variables of `graph` under their checkpoint keys (a partitioned variable once, whole)."""
    found: dict[str, VariableSpec] = {}
    for variable in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
        info = getattr(variable, "_save_slice_info", None)
        name = info.full_name if info is not None else variable.op.name
        shape = tuple(info.full_shape) if info is not None else tuple(variable.shape.as_list())
        found.setdefault(name, VariableSpec(name, variable.dtype.base_dtype.name, shape, op_location(variable.op)))
    return found


def checkpoint_variables(path: str) -> dict[str, VariableSpec]:
    """The variables of checkpoint `path` (a prefix), by key."""
    reader = tf.train.load_checkpoint(path)
    dtypes = reader.get_variable_to_dtype_map()
    return {name: VariableSpec(name, dtypes[name].name, tuple(shape))
            for name, shape in reader.get_variable_to_shape_map().items()}


# What reading a damaged checkpoint raises: TF's errors, and the IndexError its reader raises on a truncated file.
_READ_ERRORS = (tf.errors.OpError, ValueError, IndexError, OSError)


def check_checkpoint(graph: tf.Graph, path: str) -> list[CerebrasError]:
    """Checkpoint `path` reads whole (index and every tensor's data, whose checksums TF checks as it reads),
    and every global variable of `graph` is in it with the same shape and dtype: or one error naming the
    damaged file and the newest intact checkpoint beside it, or each variable that does not fit, with both
    shapes."""
    if not tf.io.gfile.glob(path + ".index"):
        return [CheckpointMismatchError(
            f"The checkpoint {path} cannot be read: there is no {os.path.basename(path)}.index.",
            fix="Point checkpoint_path at a checkpoint prefix (e.g. model_dir/model.ckpt-1000, without .index).")]
    damage = damaged(path)
    if damage is not None:
        return [_damaged_error(path, damage)]
    stored = checkpoint_variables(path)
    lines, first = [], None
    for name, wanted in sorted(graph_variables(graph).items()):
        have = stored.get(name)
        if have is None:
            lines.append(f"{name}: the model has {wanted}, the checkpoint has no such variable")
        elif (have.dtype, have.shape) != (wanted.dtype, wanted.shape):
            lines.append(f"{name}: the model has {wanted}, the checkpoint {have}")
        else:
            continue
        if wanted.location:
            lines[-1] += f" (created at {wanted.location})"
        first = first or wanted.location
    if not lines:
        return []
    return [CheckpointMismatchError(
        f"The checkpoint {path} was written by a different model: {len(lines)} variable(s) of this model are "
        "missing from it or differ in shape or dtype (plain TensorFlow fails to restore it too):\n      "
        + "\n      ".join(lines),
        where=first,
        fix="Train the changed model in a new model_dir (or remove the old checkpoints from this one), or run the "
            "model code the checkpoint was written with. To start from the old weights that still fit, warm-start "
            "in a new model_dir: warm_start_from=tf.estimator.WarmStartSettings(old_model_dir, "
            "vars_to_warm_start=[...]).")]


def damaged(path: str) -> str | None:
    """What is wrong with checkpoint `path` (which file, and how), reading its index and then every tensor; None
    when it reads whole."""
    try:
        reader = tf.train.load_checkpoint(path)
    except _READ_ERRORS as error:
        return f"its index file {path}.index is {_how(error)}"
    for name in sorted(reader.get_variable_to_shape_map()):
        try:
            reader.get_tensor(name)
        except _READ_ERRORS as error:
            files = ", ".join(sorted(tf.io.gfile.glob(path + ".data-*"))) or f"{path}.data-*"
            return f"its data file {files} is {_how(error)} (reading variable {name!r})"
    return None


def newest_intact_checkpoint(model_dir: str, excluding: str = "") -> str | None:
    """The newest checkpoint in `model_dir` (by global step) that reads whole, other than `excluding`."""
    prefixes = {name[: -len(".index")] for name in tf.io.gfile.glob(os.path.join(model_dir, "*.index"))}
    for prefix in sorted(prefixes - {excluding}, key=_step, reverse=True):
        if damaged(prefix) is None:
            return prefix
    return None


def _damaged_error(path: str, damage: str) -> CheckpointMismatchError:
    model_dir = os.path.dirname(path)
    intact = newest_intact_checkpoint(model_dir, excluding=path)
    if intact is None:
        fix = (f"No intact checkpoint is left in {model_dir}: remove {path}.* and the `checkpoint` file to train "
               "from the initial values, or restore the files from a copy.")
    else:
        fix = (f"The newest intact checkpoint is {intact}. To resume from it, move {os.path.basename(path)}.* out "
               f"of {model_dir} and point the `checkpoint` file at it: python -c \"import tensorflow as tf; "
               f"tf.compat.v1.train.update_checkpoint_state('{model_dir}', '{intact}')\" (or evaluate/predict with "
               f"checkpoint_path='{intact}').")
    return CheckpointMismatchError(f"The checkpoint {path} cannot be read: {damage}.", fix=fix)


def _how(error: BaseException) -> str:
    """'truncated', 'corrupted (...)' or 'unreadable (...)' from what TF's reader raised."""
    text = str(getattr(error, "message", None) or error).strip().splitlines()[0]
    if "less bytes than requested" in text or "truncated" in text.lower():
        return f"truncated ({text})"
    if "checksum" in text.lower() or "corrupt" in text.lower() or isinstance(error, tf.errors.DataLossError):
        return f"corrupted ({text})"
    return f"unreadable ({text})"


def _step(prefix: str) -> int:
    """The global step in a checkpoint prefix's name (model.ckpt-1200 -> 1200; -1 when it has none)."""
    tail = prefix.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def warm_start_path(settings: Any) -> str:
    """The checkpoint prefix a tf.estimator.WarmStartSettings reads: its ckpt_to_initialize_from, or that
    directory's latest checkpoint, or a SavedModel's variables; UnsupportedTensorFlowError when it holds none
    or asks for vocabulary remapping (not supported on the CS system)."""
    if settings.var_name_to_vocab_info:
        raise UnsupportedTensorFlowError(
            "warm_start_from with var_name_to_vocab_info (vocabulary remapping) is not supported on the CS system.",
            fix="Remap the embedding once on CPU (warm-start a CPU run and save), then warm-start from that "
                "checkpoint.")
    path = settings.ckpt_to_initialize_from
    if tf.io.gfile.isdir(path):
        saved_model_variables = os.path.join(path, "variables", "variables")
        path = (saved_model_variables if tf.io.gfile.exists(saved_model_variables + ".index")
                else tf.train.latest_checkpoint(path))
    if not path:
        raise UnsupportedTensorFlowError(f"warm_start_from={settings.ckpt_to_initialize_from!r} holds no checkpoint.",
                                         fix="Point warm_start_from at a checkpoint, its directory or a SavedModel.")
    return str(path)


def warm_started_variables(settings: Any, variables: list[tuple[str, bool]]) -> dict[str, str]:
    """Of `variables` ((name, trainable) pairs), those WarmStartSettings selects, with TF's rules (a regex
    matches trainable variables, a list of names/prefixes any variable), each with its name in the
    checkpoint (var_name_to_prev_var_name renames)."""
    wanted = settings.vars_to_warm_start
    if wanted is None or isinstance(wanted, str):
        pattern = re.compile(wanted or ".*")
        chosen = [name for name, trainable in variables if trainable and pattern.match(name)]
    else:
        patterns = [re.compile(w if isinstance(w, str) else w.op.name) for w in wanted]
        chosen = [name for name, _ in variables if any(p.match(name) for p in patterns)]
    renames = settings.var_name_to_prev_var_name or {}
    return {name: renames.get(name, name) for name in chosen}


def check_warm_start(graph: tf.Graph, settings: Any) -> list[CerebrasError]:
    """The variables warm_start_from selects are in its checkpoint with the model's shapes and dtypes (or one
    error naming each that is not, with both); checked before anything is compiled or written."""
    path = warm_start_path(settings)
    trainable = {v.op.name for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
    model = graph_variables(graph)
    chosen = warm_started_variables(settings, [(name, name in trainable) for name in sorted(model)])
    try:
        stored = checkpoint_variables(path)
    except _READ_ERRORS as error:
        return [CheckpointMismatchError(f"The warm-start checkpoint {path} cannot be read: {_how(error)}.",
                                        fix="Point warm_start_from at a readable checkpoint.")]
    lines = []
    for name, source in sorted(chosen.items()):
        have, wanted = stored.get(source), model[name]
        if have is None:
            lines.append(f"{name}: the model has {wanted}, the checkpoint has no variable {source}")
        elif (have.dtype, have.shape) != (wanted.dtype, wanted.shape):
            lines.append(f"{name}: the model has {wanted}, the checkpoint's {source} is {have}")
    if not lines:
        return []
    return [CheckpointMismatchError(
        f"warm_start_from={settings.ckpt_to_initialize_from!r} ({path}) does not fit the model: {len(lines)} of "
        "the variables it selects are missing from it or differ in shape or dtype:\n      " + "\n      ".join(lines),
        where=model[sorted(chosen)[0]].location if chosen else None,
        fix="Select only the variables that fit (WarmStartSettings(vars_to_warm_start=[...])), map renamed ones "
            "with var_name_to_prev_var_name, or warm-start from a checkpoint of this model.")]


def extra_variables(graph: tf.Graph, path: str, ignore_prefixes: tuple[str, ...] = ()) -> list[str]:
    """Checkpoint variables the graph does not have (ignored when it is restored, as TF ignores them), but for
    those under `ignore_prefixes` (state the run itself reads, e.g. the executor's loss scale)."""
    try:
        stored: dict[str, Any] = checkpoint_variables(path)
    except (tf.errors.OpError, ValueError):
        return []
    known = graph_variables(graph)
    return sorted(name for name in stored if name not in known and not name.startswith(ignore_prefixes))
