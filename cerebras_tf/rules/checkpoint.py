"""Rules on the checkpoint a CS-system run starts from: it must fit the model.

The most common real mistake is a model edited (layer sizes, names, another
optimizer) while model_dir keeps the old model's checkpoints. Plain TF fails
when it restores one ("Key ... not found in checkpoint", or "Assign requires
shapes of both tensors to match"); a run on the system compares the
checkpoint's variables with the graph's before anything is compiled or
written, and names every variable that is missing or has another shape or
dtype, with both.

As in TF, the graph's global variables are what is restored (tf.estimator's
Saver restores exactly those); variables the checkpoint holds but the graph
lacks are ignored (e.g. the loss-scale state of a run that used amp on CPU, or
a layer that was removed); `extra_variables` lists them so the run can say so.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from cerebras_tf.errors import CerebrasError, CheckpointMismatchError
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


def check_checkpoint(graph: tf.Graph, path: str) -> list[CerebrasError]:
    """Every global variable of `graph` is in checkpoint `path` with the same shape and dtype (or one error
    naming each that is not, with both shapes; or that the checkpoint cannot be read)."""
    try:
        stored = checkpoint_variables(path)
    except (tf.errors.OpError, ValueError) as error:
        return [CheckpointMismatchError(
            f"The checkpoint {path} cannot be read: {getattr(error, 'message', error)}",
            fix="Point checkpoint_path at a checkpoint prefix (e.g. model_dir/model.ckpt-1000, without .index), or "
                "remove the damaged checkpoint (the `checkpoint` file in model_dir names the latest) and resume "
                "from an earlier one.")]
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


def extra_variables(graph: tf.Graph, path: str, ignore_prefixes: tuple[str, ...] = ()) -> list[str]:
    """Checkpoint variables the graph does not have (ignored when it is restored, as TF ignores them), but for
    those under `ignore_prefixes` (state the run itself reads, e.g. the executor's loss scale)."""
    try:
        stored: dict[str, Any] = checkpoint_variables(path)
    except (tf.errors.OpError, ValueError):
        return []
    known = graph_variables(graph)
    return sorted(name for name in stored if name not in known and not name.startswith(ignore_prefixes))
