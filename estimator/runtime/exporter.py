"""Exporters: what train_and_evaluate exports after each evaluation (tf.estimator's Exporter contract).

An exporter has a `name` (its directory under model_dir/export/) and
`export(estimator, export_path, checkpoint_path, eval_result,
is_the_final_export)`, returning the export's path or None when it skips.
LatestExporter exports after every evaluation and keeps the newest few,
FinalExporter only after the final one, BestExporter when the metrics beat the
best so far (read back from eval/ event files, so a restarted job remembers).
"""
from __future__ import annotations

import abc
import os
from typing import Any, Callable

import tensorflow as tf

from estimator.runtime.calls import fn_args
from estimator.runtime.spec import LOSS_METRIC_KEY


class Exporter(abc.ABC):
    """A kind of model export run by train_and_evaluate after evaluations."""

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The directory, under model_dir/export/, this exporter writes to (not None, not empty)."""

    @abc.abstractmethod
    def export(self, estimator: Any, export_path: str, checkpoint_path: str, eval_result: dict[str, Any],
               is_the_final_export: bool) -> Any:
        """Export `checkpoint_path` (evaluated as `eval_result`) under export_path; its path, or None if skipped."""


class _SavedModelExporter(Exporter):
    """export_saved_model with fixed arguments: the step the other exporters share."""

    def __init__(self, name: str, serving_input_receiver_fn: Callable[[], Any], assets_extra: Any = None,
                 as_text: bool = False) -> None:
        self._name = name
        self._serving_input_receiver_fn = serving_input_receiver_fn
        self._assets_extra = assets_extra
        self._as_text = as_text

    @property
    def name(self) -> str:
        return self._name

    def export(self, estimator: Any, export_path: str, checkpoint_path: str, eval_result: dict[str, Any],
               is_the_final_export: bool) -> Any:
        return estimator.export_saved_model(export_path, self._serving_input_receiver_fn,
                                            assets_extra=self._assets_extra, as_text=self._as_text,
                                            checkpoint_path=checkpoint_path)


def _garbage_collect(export_dir_base: str, keep: int | None) -> None:
    """Delete all but the `keep` newest exports (directories named by their 10-digit timestamps)."""
    if keep is None or not tf.io.gfile.isdir(export_dir_base):
        return
    versions = sorted(name.rstrip("/") for name in tf.io.gfile.listdir(export_dir_base)
                      if len(name.rstrip("/")) == 10 and name.rstrip("/").isdigit())
    for name in versions[:-keep]:
        path = os.path.join(export_dir_base, name)
        try:
            tf.io.gfile.rmtree(path)
        except tf.errors.NotFoundError as e:
            tf.compat.v1.logging.warning("Can not delete %s recursively: %s", path, e)


class LatestExporter(Exporter):
    """Exports after every evaluation, keeping the `exports_to_keep` newest exports (None: all)."""

    def __init__(self, name: str, serving_input_receiver_fn: Callable[[], Any], assets_extra: Any = None,
                 as_text: bool = False, exports_to_keep: int | None = 5) -> None:
        self._saved_model_exporter = _SavedModelExporter(name, serving_input_receiver_fn, assets_extra, as_text)
        self._exports_to_keep = exports_to_keep
        if exports_to_keep is not None and exports_to_keep <= 0:
            raise ValueError("`exports_to_keep`, if provided, must be positive number")

    @property
    def name(self) -> str:
        return self._saved_model_exporter.name

    def export(self, estimator: Any, export_path: str, checkpoint_path: str, eval_result: dict[str, Any],
               is_the_final_export: bool) -> Any:
        result = self._saved_model_exporter.export(estimator, export_path, checkpoint_path, eval_result,
                                                   is_the_final_export)
        _garbage_collect(export_path, self._exports_to_keep)
        return result


class FinalExporter(Exporter):
    """Exports once, after the evaluation at the end of training (train_spec.max_steps reached)."""

    def __init__(self, name: str, serving_input_receiver_fn: Callable[[], Any], assets_extra: Any = None,
                 as_text: bool = False) -> None:
        self._saved_model_exporter = _SavedModelExporter(name, serving_input_receiver_fn, assets_extra, as_text)

    @property
    def name(self) -> str:
        return self._saved_model_exporter.name

    def export(self, estimator: Any, export_path: str, checkpoint_path: str, eval_result: dict[str, Any],
               is_the_final_export: bool) -> Any:
        if not is_the_final_export:
            return None
        tf.compat.v1.logging.info("Performing the final export in the end of training.")
        return self._saved_model_exporter.export(estimator, export_path, checkpoint_path, eval_result,
                                                 is_the_final_export)


def _loss_smaller(best_eval_result: dict[str, Any], current_eval_result: dict[str, Any]) -> bool:
    """True when the current evaluation's loss is below the best one's."""
    if not best_eval_result or LOSS_METRIC_KEY not in best_eval_result:
        raise ValueError("best_eval_result cannot be empty or no loss is found in it.")
    if not current_eval_result or LOSS_METRIC_KEY not in current_eval_result:
        raise ValueError("current_eval_result cannot be empty or no loss is found in it.")
    return bool(best_eval_result[LOSS_METRIC_KEY] > current_eval_result[LOSS_METRIC_KEY])


def _verify_compare_fn_args(compare_fn: Callable[..., Any]) -> None:
    args = set(fn_args(compare_fn))
    if "best_eval_result" not in args:
        raise ValueError(f"compare_fn ({compare_fn}) must include best_eval_result argument.")
    if "current_eval_result" not in args:
        raise ValueError(f"compare_fn ({compare_fn}) must include current_eval_result argument.")
    unexpected = list(args - {"best_eval_result", "current_eval_result"})
    if unexpected:
        raise ValueError(f"compare_fn ({compare_fn}) has following not expected args: {unexpected}")


class BestExporter(Exporter):
    """Exports when compare_fn(best_eval_result=..., current_eval_result=...) says the evaluation is better
    (default: a lower loss); the best so far is first read from model_dir's `event_file_pattern` files."""

    def __init__(self, name: str = "best_exporter", serving_input_receiver_fn: Callable[[], Any] | None = None,
                 event_file_pattern: str | None = "eval/*.tfevents.*",
                 compare_fn: Callable[..., bool] = _loss_smaller, assets_extra: Any = None, as_text: bool = False,
                 exports_to_keep: int | None = 5) -> None:
        if compare_fn is None:
            raise ValueError("`compare_fn` must not be None.")
        _verify_compare_fn_args(compare_fn)
        self._compare_fn = compare_fn
        self._saved_model_exporter = _SavedModelExporter(name, serving_input_receiver_fn,  # type: ignore[arg-type]
                                                         assets_extra, as_text)
        self._event_file_pattern = event_file_pattern
        self._model_dir: str | None = None
        self._best_eval_result: dict[str, Any] | None = None
        self._has_exported = False
        self._exports_to_keep = exports_to_keep
        if exports_to_keep is not None and exports_to_keep <= 0:
            raise ValueError(f"`exports_to_keep`, if provided, must be a positive number. Got {exports_to_keep}")

    @property
    def name(self) -> str:
        return self._saved_model_exporter.name

    def export(self, estimator: Any, export_path: str, checkpoint_path: str, eval_result: dict[str, Any],
               is_the_final_export: bool) -> Any:
        if self._model_dir != estimator.model_dir and self._event_file_pattern:
            tf.compat.v1.logging.info("Loading best metric from event files.")
            self._model_dir = estimator.model_dir
            self._best_eval_result = self._best_in_events(os.path.join(self._model_dir, self._event_file_pattern))
        if (self._best_eval_result is None or not self._has_exported
                or self._compare_fn(best_eval_result=self._best_eval_result, current_eval_result=eval_result)):
            tf.compat.v1.logging.info("Performing best model export.")
            self._best_eval_result = eval_result
            result = self._saved_model_exporter.export(estimator, export_path, checkpoint_path, eval_result,
                                                       is_the_final_export)
            _garbage_collect(export_path, self._exports_to_keep)
            self._has_exported = True
            return result
        return None

    def _best_in_events(self, pattern: str) -> dict[str, Any] | None:
        """The best evaluation (its scalar summaries) recorded in the event files matching `pattern`."""
        best = None
        for path in tf.io.gfile.glob(pattern):
            for event in tf.compat.v1.train.summary_iterator(path):
                if not event.HasField("summary"):
                    continue
                values = {v.tag: v.simple_value for v in event.summary.value if v.HasField("simple_value")}
                if values and (best is None or self._compare_fn(best, values)):
                    best = values
        return best
