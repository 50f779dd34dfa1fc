"""Estimator.export_saved_model: the model, built from a serving input receiver, saved as a SavedModel.

For each exported mode a fresh graph is built as tf.estimator builds it
(global step, graph seed, the receiver, then model_fn), the checkpoint is
restored into a session, and tf.compat.v1's SavedModel builder writes one
MetaGraph with the signatures of the spec's export_outputs (PREDICT's default:
a PredictOutput of the predictions under "serving_default"). The variables
are saved once, from the first mode built (TRAIN, EVAL, then PREDICT, as
tf.estimator orders them). The SavedModel is written to a temporary
directory and renamed to export_dir_base/<timestamp> when complete, so a
reader never sees a half-written export.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable

import tensorflow as tf

from estimator.runtime import tf_internal
from estimator.runtime.mode_keys import ModeKeys

if TYPE_CHECKING:
    from estimator.runtime.estimator import Estimator

# The order modes are built in: the first one saves the variables.
_MODE_ORDER = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT)


def checkpoint_to_export(estimator: "Estimator", checkpoint_path: str | None) -> str:
    """The given checkpoint, else model_dir's latest, else the warm-start checkpoint; an error when none."""
    if checkpoint_path:
        return checkpoint_path
    latest = estimator.latest_checkpoint()
    if latest:
        return latest
    settings = estimator._warm_start_settings
    if settings:
        path = settings.ckpt_to_initialize_from
        return tf.train.latest_checkpoint(path) if tf.io.gfile.isdir(path) else path
    raise ValueError(f"Couldn't find trained model at {estimator.model_dir}.")


def export_all_saved_models(estimator: "Estimator", export_dir_base: Any,
                            input_receiver_fn_map: dict[str, Callable[[], Any]], assets_extra: dict[str, str] | None,
                            as_text: bool, checkpoint_path: str | None, strip_default_attrs: bool = True) -> bytes:
    """Write one SavedModel with a MetaGraph per mode in the map; returns its directory (bytes, as tf.estimator)."""
    checkpoint_path = checkpoint_to_export(estimator, checkpoint_path)
    export_dir = tf_internal.get_timestamped_export_dir(tf.compat.as_str_any(os.fspath(export_dir_base)))
    temp_dir = tf_internal.get_temp_export_dir(export_dir)
    builder = tf.compat.v1.saved_model.Builder(temp_dir)
    save_variables = True
    for mode in _MODE_ORDER:  # each mode builds its own graph (graph mode, also where eager execution is on)
        if input_receiver_fn_map.get(mode):
            _add_meta_graph_for_mode(estimator, builder, input_receiver_fn_map[mode], checkpoint_path,
                                     save_variables, mode, strip_default_attrs)
            save_variables = False
    if save_variables:
        raise ValueError(f"No valid modes for exporting found. Got {input_receiver_fn_map.keys()}.")
    builder.save(as_text)
    _copy_assets_extra(temp_dir, assets_extra)
    tf.io.gfile.rename(temp_dir, export_dir)
    return export_dir


def _add_meta_graph_for_mode(estimator: "Estimator", builder: Any, input_receiver_fn: Callable[[], Any],
                             checkpoint_path: str, save_variables: bool, mode: str,
                             strip_default_attrs: bool = True) -> None:
    """Build `mode`'s graph from the receiver, restore the checkpoint, and add its MetaGraph to `builder`."""
    with tf.Graph().as_default() as graph:
        estimator._create_and_assert_global_step(graph)
        tf.compat.v1.random.set_random_seed(estimator.config.tf_random_seed)
        receiver = input_receiver_fn()
        spec = estimator._call_model_fn(features=receiver.features, labels=getattr(receiver, "labels", None),
                                        mode=mode, config=estimator.config)
        export_outputs = tf_internal.export_outputs_for_mode(
            mode=spec.mode, serving_export_outputs=spec.export_outputs, predictions=spec.predictions,
            loss=spec.loss, metrics=spec.eval_metric_ops)
        signature_def_map = tf_internal.build_all_signature_defs(
            receiver.receiver_tensors, export_outputs, getattr(receiver, "receiver_tensors_alternatives", None),
            serving_only=(mode == ModeKeys.PREDICT))
        scaffold = spec.scaffold
        local_init_op = (scaffold.local_init_op if scaffold.local_init_op is not None
                         else tf.compat.v1.train.Scaffold.default_local_init_op())
        # One saver restores the checkpoint now and goes into the MetaGraph, so a model's own Saver
        # (from its Scaffold) is the one serving restores with too.
        saver = scaffold.saver or tf.compat.v1.train.Saver(sharded=True)
        with tf.compat.v1.Session(config=estimator._session_config) as session:
            try:
                saver.restore(session, checkpoint_path)
            except tf.errors.NotFoundError as e:
                raise ValueError(
                    "Could not load all requested variables from checkpoint. Please make sure your model_fn does not "
                    "expect variables that were not saved in the checkpoint.\n\nEncountered error with mode "
                    f"`{mode}` while restoring checkpoint from: `{checkpoint_path}`. Full Traceback:\n\n{e}") from e
            tf_internal.add_train_op(builder, spec.train_op)
            kwargs = dict(tags=tf_internal.export_tags(mode), signature_def_map=signature_def_map,
                          assets_collection=tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
                          main_op=local_init_op, saver=saver, strip_default_attrs=strip_default_attrs)
            if save_variables:
                builder.add_meta_graph_and_variables(session, **kwargs)
            else:
                builder.add_meta_graph(**kwargs)


def _copy_assets_extra(export_dir: bytes, assets_extra: dict[str, str] | None) -> None:
    """Copy each source file to assets.extra/<its destination path> in the export."""
    for destination, source in (assets_extra or {}).items():
        target = os.path.join(tf.compat.as_str_any(export_dir), "assets.extra", destination)
        tf.io.gfile.makedirs(os.path.dirname(target))
        tf.io.gfile.copy(source, target)
