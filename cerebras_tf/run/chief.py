"""The chief's side of a training run on the simulated CS system.

Given the compiled program: variables (and the loss-scale state) from the
latest checkpoint in model_dir, else TF's initial values -> for each step pull
one numpy batch from the input stream (the chief or its input workers), run it
on the Executor (dynamic loss scaling; a NaN loss, or steps that keep
overflowing at the minimum loss scale, stop the run with the Estimator's
NaN-loss error before the step is saved: divergence.py), log like the
Estimator, write summaries -> at save_checkpoints_steps and at the end write a standard TF
checkpoint of every variable, which plain
tf.estimator.Estimator.evaluate/predict/export_saved_model read. Evaluation
and prediction run their programs from a checkpoint the same way.
"""
from __future__ import annotations

import contextlib
import glob
import os
import time
from typing import Any, Callable, ContextManager, Iterator

import numpy as np
import tensorflow as tf

from cerebras_tf.amp import GradScaler
from cerebras_tf import ir, write_failures
from cerebras_tf.compiler import functions, initial
from cerebras_tf.compiler.lower import eval_metric_subgraph
from cerebras_tf.run.divergence import DivergenceGuard
from cerebras_tf.errors import InputWorkerError, RunArgumentError
from cerebras_tf.run.host_checks import HostChecks
from cerebras_tf.run.host_kernels_tf import system_host_kernels
from cerebras_tf.input_workers import InputStream, batch_size
from cerebras_tf.amp.tf_loss_scaling import STATE_SCOPE as LOSS_SCALE_SCOPE, STATE_VARIABLES
from cerebras_tf.rules.checkpoint import warm_start_path, warm_started_variables
from cerebras_tf.settings import CSSettings
from cerebras_tf.run.trainer_lock import trainer_lock
from cerebras_tf.run.tensorboard import GRAPH_FILE, EventWriter, scalar_summary, write_graph
from cerebras_tf.wse.executor import Executor, StepResult
from cerebras_tf.wse.kernels import KernelInputError
from estimator import CapturedModel, EstimatorBase, ModeKeys

_log = tf.compat.v1.logging


def train_on_system(estimator: EstimatorBase, settings: CSSettings, model: CapturedModel, program: ir.Program,
                    input_fn: Callable[..., Any], steps: int | None, max_steps: int | None,
                    estimated_samples_per_sec: float | None = None) -> int:
    """Train `model` (prechecked, compiled to `program`) on the simulated WSE; returns the final global step.

    The run holds model_dir's trainer lock (trainer_lock.py): a second trainer on the same model_dir is refused.

    Batches come from an InputStream: the chief's own process, or the input
    workers that CSRunConfig(num_input_workers=N) or TF_CONFIG ask for (as the
    run's `settings` resolved them).
    `estimated_samples_per_sec` (the compile's placement estimate) is
    summarised beside the measured rate. Training ends at the step target or
    when input_fn's data ends; if the input workers fail, the progress made
    since the last checkpoint is saved before the error is raised.
    """
    with trainer_lock(estimator.model_dir), \
            CheckpointWriter(program, model, estimator.model_dir, settings.keep_checkpoint_max) as checkpoints:
        return _train(checkpoints, estimator, settings, model, program, input_fn, steps, max_steps,
                      estimated_samples_per_sec)


def _train(checkpoints: "CheckpointWriter", estimator: EstimatorBase, settings: CSSettings, model: CapturedModel,
           program: ir.Program, input_fn: Callable[..., Any], steps: int | None, max_steps: int | None,
           estimated_samples_per_sec: float | None) -> int:
    """train_on_system's run, saving with `checkpoints` (which the caller closes)."""
    values = checkpoints.starting_values(getattr(estimator, "warm_start_settings", None))
    half = settings.half_dtype
    executor = Executor(program, values, grad_scaler=checkpoints.starting_grad_scaler(half), half_dtype=half,
                        host_kernels=system_host_kernels(program))
    host_checks = HostChecks(program, "training")  # the model's assertions and prints, after each step
    guard = DivergenceGuard(executor.grad_scaler)  # NaN loss, or stuck overflowing: stop before saving
    first = executor.global_step
    if max_steps is not None:
        last = max_steps
    else:
        assert steps is not None, "rules.run.check_train_call requires steps or max_steps"
        last = first + steps
    if first >= last:
        _log.info("Skipping training since max_steps has already saved (global step %d).", first)
        return first
    systems = settings.num_csx  # rules.config.check_data_parallel passed
    if systems > 1:
        _log.info("Training data parallel on %d simulated systems: each step runs %d batches, one per system, "
                  "and averages their gradients (SwarmX) before the one update.", systems, systems)
    stream = InputStream.from_settings(input_fn, estimator.params, settings.input_workers)
    every = settings.log_step_count_steps
    save_every = settings.save_checkpoints_steps
    started, saved = time.perf_counter(), first
    result = summaries = None
    try:
        try:
            summaries = TrainingSummaries(estimator.model_dir, stream, estimated_samples_per_sec, program,
                                          settings.save_summary_steps)
            summaries.write_graph(model.graph)
            while executor.global_step < last:
                try:  # one batch per system: several systems (weight streaming) are data parallel
                    batches = [next(stream) for _ in range(systems)]
                except StopIteration:
                    _log.info("The input data ended after global step %d.", executor.global_step)
                    break
                result = run_step(executor, *batches)
                host_checks.after_step(result.outputs, executor.global_step)  # raises before the step is saved
                step = executor.global_step
                guard.after_step(result, step, saved, batches[0])
                summaries.step_done(sum(batch_size(batch) for batch in batches))
                if (step % every == 0 or step == last) and result.loss is not None:
                    summaries.write(step, result.loss, result.loss_scale)
                summaries.write_model_summaries(step, result.outputs, result.loss_scale)
                if save_every and step % save_every == 0 and step != last:
                    checkpoints.save(executor, step)
                    saved = step
        except InputWorkerError:
            if executor.global_step > saved:
                _log.warning("Input failed: saving the weights trained so far (global step %d).",
                             executor.global_step)
                checkpoints.save(executor, executor.global_step)
            raise
        finally:
            stream.close()
        if executor.global_step > saved or result is None:
            checkpoints.save(executor, executor.global_step)  # before the event file's last write: it matters more
    except BaseException:
        if summaries is not None:
            summaries.close(quiet=True)  # the error that stopped the run is the one to see
        raise
    if summaries is not None:
        summaries.close()
    if result is not None:
        seconds = time.perf_counter() - started
        _log.info("Loss for final step: %g. Trained steps %d-%d in %.1f s on the simulated WSE (%s).",
                  result.loss, first + 1, executor.global_step, seconds, summaries.throughput_text(seconds))
    return executor.global_step


def run_step(executor: Executor, *batches: tuple[Any, Any]) -> StepResult:
    """executor.step on one (features, labels) batch, or step_systems on one per system; a batch that a
    kernel refuses as TF's CPU kernel does (e.g. a label out of range for sparse softmax) raises TF's
    InvalidArgumentError with TF's message, naming the op and the user's line."""
    try:
        return executor.step(*batches[0]) if len(batches) == 1 else executor.step_systems(batches)
    except KernelInputError as error:
        kernel = error.kernel
        node = f"\n\t [[{{{{node {kernel.tf_name}}}}}]]" if kernel is not None and kernel.tf_name else ""
        where = f" (defined at {kernel.location})" if kernel is not None and kernel.location else ""
        raise tf.errors.InvalidArgumentError(None, None, f"{error}{node}{where}") from None


class TrainingSummaries:
    """The chief's Estimator-style progress log and TensorBoard summaries of a run on the simulated WSE.

    Every log step: loss, loss_scale, global_step/sec, samples/sec (measured on
    this host), wse/estimated_samples_per_sec (what the compiled placement
    predicts for the real wafer), and the input stream's throughput, wait time
    and per-worker share (input/...). Every save_summary_steps, on the steps
    tf.estimator's summary saver picks (the run's first step, then every N
    steps): the model_fn's scalar and histogram summaries (ModelSummaries).
    One event file of TF1 summaries (simple_value scalars), as the Estimator
    writes, which also holds the run's graph (write_graph, with graph.pbtxt).
    """

    def __init__(self, model_dir: str, stream: InputStream, estimated_samples_per_sec: float | None,
                 program: ir.Program | None = None, save_summary_steps: int | None = None) -> None:
        self._model_dir = model_dir
        with write_failures.writing(model_dir, "creating the run's event file", model_dir):
            self._writer = EventWriter(model_dir)
        self._stream = stream
        self._estimate = estimated_samples_per_sec
        self._window_start = time.perf_counter()
        self._window_steps = 0
        self._window_samples = 0
        self._total_samples = 0
        self._model = ModelSummaries(program) if program is not None and save_summary_steps else None
        self._summary_every = save_summary_steps or 0
        self._last_summary: int | None = None
        if len(stream.workers) > 1:
            _log.info("Streaming input from %d input workers: %s.", len(stream.workers), ", ".join(stream.workers))

    def write_graph(self, graph: tf.Graph) -> None:
        """The run's graph: graph.pbtxt in model_dir and the run's event file, as tf.estimator writes them."""
        temporary = [os.path.join(glob.escape(self._model_dir), f"{GRAPH_FILE}.tmp*")]  # tf.io.write_graph's copy
        with write_failures.writing(self._model_dir, f"writing the run's graph ({GRAPH_FILE} and "
                                    f"{os.path.basename(self._writer.path)})",
                                    os.path.join(self._model_dir, GRAPH_FILE), cleanup=temporary):
            write_graph(self._model_dir, graph, self._writer)

    def step_done(self, batch_size: int) -> None:
        self._window_steps += 1
        self._window_samples += batch_size
        self._total_samples += batch_size

    def throughput_text(self, seconds: float) -> str:
        """The run's measured host throughput beside the placement's estimate for the real wafer."""
        text = f"{self._total_samples / max(seconds, 1e-9):.0f} samples/s on this host"
        if self._estimate is not None:
            text += f"; the compiled placement estimates {self._estimate:.0f} samples/s on the wafer"
        return text

    def write(self, step: int, loss: float, loss_scale: float | None) -> None:
        now = time.perf_counter()
        seconds = max(now - self._window_start, 1e-9)
        steps_per_sec, samples_per_sec = self._window_steps / seconds, self._window_samples / seconds
        self._window_start, self._window_steps, self._window_samples = now, 0, 0
        input_stats = self._stream.stats()
        _log.info("loss = %g, step = %d (%.1f global_step/sec%s)", loss, step, steps_per_sec,
                  "" if loss_scale is None else f", loss scale {loss_scale:g}")
        if len(self._stream.workers) > 1:
            _log.info("Input: %s; waited %.0f%% of the time for data.",
                      ", ".join(f"{w} {input_stats.share(w):.0%}" for w in self._stream.workers),
                      100 * input_stats.summary_values()["input/wait_fraction"])
        values = {"loss": loss}
        if loss_scale is not None:
            values["loss_scale"] = loss_scale
        values.update({"global_step/sec": steps_per_sec, "samples/sec": samples_per_sec})
        if self._estimate is not None:
            values["wse/estimated_samples_per_sec"] = self._estimate
        values.update(input_stats.summary_values())
        with self._writing(f"writing the summaries of global step {step}"):
            self._writer.add_summary(scalar_summary(values), step)

    def write_model_summaries(self, step: int, outputs: dict[str, np.ndarray], loss_scale: float | None = None
                              ) -> None:
        """At tf.estimator's summary steps (the run's first step, then every save_summary_steps): the model_fn's
        summaries of this step, `loss_scale` the step's (see ModelSummaries.summary). ("loss" stays on the log
        steps, where write() puts it.)"""
        if self._model is None:
            return
        if self._last_summary is not None and step < self._last_summary + self._summary_every:
            return  # the first call is the run's first step
        self._last_summary = step
        summary = self._model.summary(outputs, loss_scale)
        with self._writing(f"writing the model's summaries of global step {step}"):
            self._writer.add_summary(summary, step)

    def close(self, quiet: bool = False) -> None:
        """Finish the event file (a full disk or an unwritable model_dir raises a ModelDirWriteError; `quiet`:
        only a warning, when another error already stops the run) and release the summary session."""
        try:
            with self._writing("finishing the run's event file"):
                try:
                    self._writer.flush()
                except BaseException:
                    with contextlib.suppress(Exception):
                        self._writer.close()
                    raise
                self._writer.close()
        except Exception as error:
            if not quiet:
                raise
            _log.warning("The run's event file %s could not be finished: %s", self._writer.path,
                         str(error).splitlines()[0])
        finally:
            if self._model is not None:
                self._model.close()

    def _writing(self, what: str) -> ContextManager[None]:
        """A full disk or an unwritable model_dir while writing the event file, as a ModelDirWriteError."""
        return write_failures.writing(self._model_dir, f"{what} ({os.path.basename(self._writer.path)})",
                                      self._writer.path)


class ModelSummaries:
    """The model_fn's tf.compat.v1 summaries on the host: the same summary ops, fed the "summary/<tag>" values
    a step streams off the wafer (half-precision values arrive as float32).

    Scalars become simple_value scalars and histograms HistogramProtos, exactly
    as TF builds them on CPU. A summary of a backward tensor other than the
    weight gradients (which the executor unscales), e.g. the gradient
    tf_helper.summary_layer records, carries the executor's loss scale: it is
    divided by the step's scale, and a histogram that is not finite (a step
    that overflowed, whose update is skipped) is not written that step. The
    kinds the system cannot compute (image, audio, text, tensor, TF2
    tf.summary writes, tags not static) are named in one warning.
    """

    def __init__(self, program: ir.Program) -> None:
        self.tags = dict(program.summaries)
        skipped = {tag: kind for tag, kind in program.summaries.items() if kind not in ir.HOST_SUMMARY_KINDS}
        if skipped:
            _log.warning("Summaries the CS system cannot compute are not written: %s. Only scalar and histogram "
                         "tf.compat.v1 summaries (static tags) made in model_fn are computed on the wafer.",
                         ", ".join(f"{tag} ({kind})" for tag, kind in sorted(skipped.items())))
        self._keys = {tag: f"{ir.SUMMARY_PREFIX}/{tag}" for tag, kind in program.summaries.items()
                      if kind in ir.HOST_SUMMARY_KINDS and f"{ir.SUMMARY_PREFIX}/{tag}" in program.outputs}
        made_by_backward = {t for kernel in program.kernels if kernel.role == "backward" for t in kernel.outputs}
        still_scaled = made_by_backward - set(program.gradients)  # the executor unscales the weight gradients
        self._scaled = {tag for tag, key in self._keys.items() if program.outputs[key] in still_scaled}
        self._graph = tf.Graph()
        self._feeds: dict[str, Any] = {}
        self._ops: dict[str, Any] = {}
        with self._graph.as_default():
            for tag, key in self._keys.items():
                tensor = program.tensors[program.outputs[key]]
                feed = tf.compat.v1.placeholder("float32" if tensor.dtype == ir.HALF else tensor.dtype, tensor.shape)
                self._feeds[tag] = feed
                self._ops[tag] = (tf.raw_ops.ScalarSummary(tags=tag, values=feed) if program.summaries[tag] == "scalar"
                                  else tf.raw_ops.HistogramSummary(tag=tag, values=feed))
        self._session = tf.compat.v1.Session(graph=self._graph) if self._ops else None

    def summary(self, outputs: dict[str, np.ndarray], loss_scale: float | None = None) -> Any:
        """One Summary proto of this step's values (an output missing from the step is skipped); backward
        tensors are divided by `loss_scale` (the step's, None: not scaled)."""
        summary = tf.compat.v1.Summary()
        values = {tag: outputs[self._keys[tag]] for tag in self._ops if self._keys[tag] in outputs}
        if loss_scale is not None:
            values.update({tag: np.asarray(values[tag], np.float32) / np.float32(loss_scale)
                           for tag in self._scaled & set(values)})
        present = [tag for tag in values
                   if self.tags[tag] != "histogram" or np.all(np.isfinite(values[tag]))]  # TF refuses inf there
        if present and self._session is not None:
            serialized = self._session.run([self._ops[tag] for tag in present],
                                           {self._feeds[tag]: values[tag] for tag in present})
            for data in serialized:
                summary.MergeFromString(data)
        return summary

    def close(self) -> None:
        if self._session is not None:
            self._session.close()


class _HostMetricSession:
    """Metric ops the host runs in a graph of its own: `update` runs every update op with the step's streamed
    outputs fed to their placeholders, `result` the value ops. A subclass fills _graph, _ops (name -> (value,
    update)) and _feeds (output key -> placeholder), and calls _start. It holds a TF session once started: use
    it as a context manager (or call close())."""

    def __init__(self) -> None:
        self._graph = tf.Graph()
        self._ops: dict[str, tuple[Any, Any]] = {}
        self._feeds: dict[str, Any] = {}
        self._session: Any = None

    def _start(self, initializers: list[Any]) -> None:
        """Open the session and run `initializers` (the metric variables')."""
        self._session = tf.compat.v1.Session(graph=self._graph)
        try:
            self._session.run(initializers)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the session that computes the metrics (if there is one)."""
        if self._session is not None:
            self._session.close()

    def __enter__(self) -> "_HostMetricSession":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def update(self, outputs: dict[str, np.ndarray]) -> None:
        if self._ops:
            self._session.run([update for _, update in self._ops.values()],
                              {placeholder: np.asarray(outputs[key], placeholder.dtype.as_numpy_dtype)
                               for key, placeholder in self._feeds.items()})

    def result(self) -> dict[str, Any]:
        """Each metric's value: a Python number for a scalar, else the array."""
        if not self._ops:
            return {}
        values = self._session.run({name: value for name, (value, _) in self._ops.items()})
        return {name: np.asarray(value).item() if np.ndim(value) == 0 else value for name, value in values.items()}


class HostMetrics(_HostMetricSession):
    """Runs host_call's fn on the host over the tensors each step streams off the wafer.

    fn gets placeholders in the nest the model_fn gave (program.host_call's
    structure: None stays None, lists, tuples and dicts rebuilt), positionally
    or by keyword; half-precision outputs arrive as float32.
    """

    def __init__(self, program: ir.Program, host_call: Any) -> None:
        super().__init__()
        if host_call is None or program.host_call is None:
            return
        with self._graph.as_default():
            for key in program.outputs:
                if key.startswith(f"{ir.HOST_CALL_PREFIX}/"):
                    tensor = program.tensors[program.outputs[key]]
                    dtype = "float32" if tensor.dtype == ir.HALF else tensor.dtype
                    self._feeds[key] = tf.compat.v1.placeholder(dtype, tensor.shape)
            args, kwargs = ir.host_call_arguments(program.host_call, self._feeds.__getitem__)
            self._ops = dict(host_call[0](*args, **kwargs))
            initializer = tf.compat.v1.local_variables_initializer()
        self._start([initializer])


class HostEvalMetricOps(_HostMetricSession):
    """Runs the model_fn's own eval_metric_ops on the host (an appliance's evaluation).

    The metric ops (lower.eval_metric_subgraph) are copied from the captured graph into a graph of their
    own, where the model tensors they read become placeholders that each step's "eval_metric_input/<i>"
    outputs feed; their metric variables start at their initial values (zero)."""

    def __init__(self, program: ir.Program, model: CapturedModel) -> None:
        super().__init__()
        metrics = dict(model.spec.eval_metric_ops or {}) if model.input.mode == ModeKeys.EVAL else {}
        if not metrics:
            return
        inputs, needed = eval_metric_subgraph(model.graph, metrics)
        variables = model.graph.get_collection(tf.compat.v1.GraphKeys.METRIC_VARIABLES)
        initializers = [v.initializer for v in variables]
        needed |= {v.op for v in variables} | set(initializers) | _producers(initializers, stop=needed)
        graph_def, placeholders = _subgraph_def(model.graph, needed, inputs)
        with self._graph.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
        by_name = self._graph.as_graph_element
        self._feeds = {f"{ir.EVAL_METRIC_INPUT_PREFIX}/{i}": by_name(f"{name}:0")
                       for i, name in enumerate(placeholders)}
        self._ops = {name: (by_name(value.name), by_name(update.name)) for name, (value, update) in metrics.items()}
        self._start([by_name(op.name) for op in initializers])


def _producers(ops: list[Any], stop: set[Any]) -> set[Any]:
    """The ops `ops` depend on (data and control), not crossing `stop`: an initializer's constant inputs."""
    found: set[Any] = set()
    stack = [t.op for op in ops for t in op.inputs] + [c for op in ops for c in op.control_inputs]
    while stack:
        op = stack.pop()
        if op in found or op in stop:
            continue
        found.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return found


def _subgraph_def(graph: tf.Graph, ops: set[Any], inputs: list[tf.Tensor]) -> tuple[Any, list[str]]:
    """A GraphDef of `ops` alone (with the functions they call): each of `inputs` becomes a placeholder (names
    returned in order), control inputs from outside are dropped."""
    names = {op.name for op in ops}
    placeholder_of = {tensor.name: f"eval_metric_input_{i}" for i, tensor in enumerate(inputs)}
    graph_def = tf.compat.v1.GraphDef()
    graph_def.versions.CopyFrom(graph.graph_def_versions)
    for i, tensor in enumerate(inputs):
        node = graph_def.node.add(name=f"eval_metric_input_{i}", op="Placeholder")
        node.attr["dtype"].type = tensor.dtype.as_datatype_enum
        node.attr["shape"].shape.CopyFrom(tensor.shape.as_proto())
    for node in graph.as_graph_def().node:
        if node.name not in names:
            continue
        copy = graph_def.node.add()
        copy.CopyFrom(node)
        del copy.input[:]
        for source in node.input:
            if source.startswith("^"):
                if source[1:] in names:
                    copy.input.append(source)
                continue
            tensor_name = source if ":" in source else f"{source}:0"
            if source.split(":")[0] in names:
                copy.input.append(source)
            else:
                copy.input.append(placeholder_of[tensor_name])
    # the branch functions of a metric's tf.cond, from the captured graph's library
    graph_def.library.CopyFrom(functions.library(graph_def.node, lambda name: functions.function_def(graph, name)))
    return graph_def, [f"eval_metric_input_{i}" for i in range(len(inputs))]


def grad_scaler_for(program: ir.Program, half_dtype: str | None = None) -> GradScaler | None:
    """The executor's GradScaler: amp.optimizer_step's settings in the program, else dynamic with the
    defaults for `half_dtype` (None: amp's selected half dtype); None when the model does its own loss
    scaling (it guards its own weight update)."""
    if program.model_loss_scaling:
        return None
    if program.loss_scaling is None:
        return GradScaler(loss_scale="dynamic", half_dtype=half_dtype)
    return GradScaler.from_config(program.loss_scaling)


def warm_start_values(settings: Any, program: ir.Program) -> dict[str, np.ndarray]:
    """Values a tf.estimator.WarmStartSettings selects (rules.checkpoint: its checkpoint and TF's selection
    rules; vocabulary remapping is refused)."""
    path = warm_start_path(settings)
    chosen = warm_started_variables(settings, [(v.name, v.trainable) for v in program.variables])
    reader = tf.train.load_checkpoint(path)
    values = {name: reader.get_tensor(source) for name, source in chosen.items()}
    _log.info("Warm-starting %d variables of the simulated WSE from %s.", len(values), path)
    return values


class CheckpointWriter:
    """Writes every program variable, under its TF name, and the dynamic loss scale's state (amp/...,
    as amp.optimizer_step names it on CPU) as a standard TF checkpoint in model_dir. A model doing its
    own loss scaling has its scale among its variables: then there is no amp/ state. The graph's
    global variables that the program never touches are saved too, unchanged (from the latest
    checkpoint, else their initial values), as tf.estimator saves every global variable.

    It holds a TF session: use it as a context manager (or call close()).
    """

    def __init__(self, program: ir.Program, model: CapturedModel, model_dir: str,
                 keep_checkpoint_max: int | None) -> None:
        self.program = program
        self.model = model
        self.model_dir = model_dir
        self._graph = tf.Graph()
        self._untouched = self._untouched_variables()
        specs: dict[str, tuple[Any, Any]] = {v.name: (v.dtype, v.shape) for v in program.variables}
        specs.update({name: (value.dtype, value.shape) for name, value in self._untouched.items()})
        if not program.model_loss_scaling:
            specs.update({_loss_scale_name(key): (dtype, ()) for key, dtype in STATE_VARIABLES.items()})
        with self._graph.as_default():
            self._feeds = {name: tf.compat.v1.placeholder(dtype, shape) for name, (dtype, shape) in specs.items()}
            variables = {name: tf.compat.v1.Variable(feed, name=name, trainable=False)
                         for name, feed in self._feeds.items()}
            self._init = tf.compat.v1.variables_initializer(list(variables.values()))
            self._saver = tf.compat.v1.train.Saver(variables, max_to_keep=keep_checkpoint_max, save_relative_paths=True)
        self._session = tf.compat.v1.Session(graph=self._graph)
        try:
            state = tf.train.get_checkpoint_state(model_dir)
            if state is not None:
                self._saver.recover_last_checkpoints(list(state.all_model_checkpoint_paths))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the session that writes the checkpoints."""
        self._session.close()

    def __enter__(self) -> "CheckpointWriter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _untouched_variables(self) -> dict[str, np.ndarray]:
        values = initial.variables_outside(self.model, self.program)
        latest = tf.train.latest_checkpoint(self.model_dir)
        if latest is not None and values:
            reader = tf.train.load_checkpoint(latest)
            values.update({name: reader.get_tensor(name) for name in values if reader.has_tensor(name)})
        return values

    def starting_values(self, warm_start: Any = None) -> dict[str, np.ndarray]:
        """Resume from the latest checkpoint in model_dir; else warm-start; the rest from the initializers."""
        latest = tf.train.latest_checkpoint(self.model_dir)
        if latest is not None:
            _log.info("Restoring the simulated WSE's weights from %s.", latest)
            return checkpoint_values(self.model, self.program, latest)
        values = initial.initial_values(self.model, self.program)
        if warm_start is not None:
            values.update(warm_start_values(warm_start, self.program))
        return values

    def starting_grad_scaler(self, half_dtype: str | None = None) -> GradScaler | None:
        """The program's GradScaler, continuing from the loss-scale state in model_dir's latest checkpoint
        (None when the model does its own loss scaling)."""
        scaler = grad_scaler_for(self.program, half_dtype)
        if scaler is None:
            _log.info("The model does its own loss scaling (its update is guarded by its own overflow check): "
                      "the simulated WSE applies none of its own.")
            return None
        latest = tf.train.latest_checkpoint(self.model_dir)
        if latest is not None:
            reader = tf.train.load_checkpoint(latest)
            scaler.load_state_dict({key: reader.get_tensor(_loss_scale_name(key)) for key in STATE_VARIABLES
                                    if reader.has_tensor(_loss_scale_name(key))})
        return scaler

    def save(self, executor: Executor, step: int) -> str:
        """Write model.ckpt-<step>; the `checkpoint` index is updated last, so a crash leaves the previous one.

        If the save fails, the files it created are removed (TF's *.tempstate* files, a data or index file
        already renamed, the `checkpoint` state file's temporary copy), so the previous checkpoint stays the
        latest, whole; a full disk or an unwritable model_dir is raised as a ModelDirWriteError
        (write_failures.py) naming model_dir, the checkpoint, the free space and the one to resume from."""
        values = {**self._untouched, **executor.variables()}
        if not self.program.model_loss_scaling:
            state = executor.grad_scaler.state_dict() if executor.grad_scaler is not None else {}
            values.update({_loss_scale_name(key): np.asarray(state.get(key, 0)) for key in STATE_VARIABLES})
        prefix = os.path.join(self.model_dir, f"model.ckpt-{step}")
        # what a save writes: the prefix's data and index files (and their *.tempstate* copies), and the
        # `checkpoint` state file's temporary copy (TF's atomic write leaves it behind when the write fails)
        written = [glob.escape(prefix) + ".*", os.path.join(glob.escape(self.model_dir), "checkpoint.tmp*")]
        with write_failures.writing(self.model_dir,
                                    f"saving the checkpoint of global step {step} ({os.path.basename(prefix)})",
                                    f"{prefix}.index and {prefix}.data-00000-of-00001", cleanup=written, step=step,
                                    needed=sum(np.asarray(value).nbytes for value in values.values())), \
                self._graph.as_default():
            self._session.run(self._init, {self._feeds[name]: value for name, value in values.items()})
            path = self._saver.save(self._session, os.path.join(self.model_dir, "model.ckpt"), global_step=step,
                                    write_meta_graph=False)
        _log.info("Saving checkpoints for %d into %s.", step, path)
        return path


def _loss_scale_name(key: str) -> str:
    return f"{LOSS_SCALE_SCOPE}/{key}"


def checkpoint_to_evaluate(model_dir: str, checkpoint_path: str | None, call: str = "evaluate") -> str:
    """The checkpoint an evaluation (or prediction) reads: checkpoint_path, else the latest in model_dir."""
    path = checkpoint_path or tf.train.latest_checkpoint(model_dir)
    if path is None:
        raise RunArgumentError(
            f"{call}() on the CS system found no checkpoint in {model_dir}.",
            fix="Train first (train(use_cs=True) writes checkpoints there), or pass checkpoint_path=.")
    return path


def checkpoint_values(model: CapturedModel, program: ir.Program, path: str) -> dict[str, np.ndarray]:
    """Every program variable from checkpoint `path`; those it lacks from the graph's initializers."""
    reader = tf.train.load_checkpoint(path)
    values = initial.initial_values(model, program)
    values.update({name: reader.get_tensor(name) for name in values if reader.has_tensor(name)})
    return values


def evaluate_on_system(estimator: EstimatorBase, settings: CSSettings, model: CapturedModel, program: ir.Program,
                       input_fn: Callable[..., Any], steps: int, path: str) -> dict[str, Any]:
    """Run the EVAL program `steps` batches from checkpoint `path`; host_call metrics are computed on the host.

    Batches come from a local InputStream (input_fn in the chief's process);
    evaluation stops early if the data ends, as tf.estimator's does. Returns
    what Estimator.evaluate returns: the host_call metrics, the mean loss and
    global_step.
    """
    reader = tf.train.load_checkpoint(path)
    executor = Executor(program, checkpoint_values(model, program, path), half_dtype=settings.half_dtype,
                        host_kernels=system_host_kernels(program))
    global_step = int(reader.get_tensor("global_step")) if reader.has_tensor("global_step") else 0
    host_checks = HostChecks(program, "evaluation")  # the model's assertions and prints, after each step
    losses: list[float] = []
    with HostMetrics(program, getattr(model.spec, "host_call", None)) as host, HostEvalMetricOps(program, model) \
            as metric_ops, _local_stream(input_fn, estimator.params) as batches:
        for _ in range(steps):
            try:
                features, labels = next(batches)
            except StopIteration:
                _log.info("The input data ended after %d evaluation steps.", len(losses))
                break
            outputs = run_step(executor, (features, labels)).outputs
            host_checks.after_step(outputs)
            losses.append(float(outputs["loss"]))
            host.update(outputs)
            metric_ops.update(outputs)
        metrics = {**host.result(), **metric_ops.result(), "loss": float(np.mean(losses)),
                   "global_step": global_step}
    # TF1 simple_value scalars in eval/, as tf.estimator writes its evaluation results (no TF2 tf.summary:
    # that needs the tensorboard package on TF >= 2.16); non-scalar metrics are skipped, as there.
    with write_failures.writing(estimator.model_dir, "writing the evaluation results",
                                os.path.join(estimator.model_dir, "eval"), then="evaluate again"):
        writer = EventWriter(os.path.join(estimator.model_dir, "eval"))
        try:
            writer.add_summary(scalar_summary({name: value for name, value in metrics.items()
                                               if name != "global_step" and np.ndim(value) == 0
                                               and np.issubdtype(np.asarray(value).dtype, np.number)}), global_step)
        finally:
            writer.close()
    _log.info("Saving dict for global step %d: %s (evaluated on the simulated WSE from %s)", global_step,
              ", ".join(f"{k} = {v}" for k, v in sorted(metrics.items())), path)
    return metrics


def predict_on_system(estimator: EstimatorBase, settings: CSSettings, model: CapturedModel, program: ir.Program,
                      input_fn: Callable[..., Any], path: str, predict_keys: list[str] | None) -> Iterator[Any]:
    """Batches of predictions of the PREDICT program from checkpoint `path`, until input_fn's data ends.

    Yields what Estimator.predict(yield_single_examples=False) yields: a dict of
    numpy arrays (only `predict_keys` when given) or, for a single predictions
    tensor, the array itself.
    """
    keys = [key.split("/", 1)[1] for key in program.outputs if key.startswith("predictions/")]
    single = keys == ["output"] and not isinstance(model.spec.predictions, dict)
    wanted = keys if single or predict_keys is None else list(predict_keys)
    unknown = sorted(set(wanted) - set(keys))
    if unknown:
        raise ValueError(f"predict_keys {unknown} are not among the model's predictions {sorted(keys)}.")
    executor = Executor(program, checkpoint_values(model, program, path), half_dtype=settings.half_dtype,
                        host_kernels=system_host_kernels(program))
    _log.info("Predicting on the simulated WSE from %s.", path)
    host_checks = HostChecks(program, "prediction")  # the model's assertions and prints, after each step
    with _local_stream(input_fn, estimator.params) as batches:
        for features, _ in batches:
            outputs = run_step(executor, (features, None)).outputs
            host_checks.after_step(outputs)
            if single:
                yield outputs["predictions/output"]
            else:
                yield {key: outputs[f"predictions/{key}"] for key in wanted}


def _local_stream(input_fn: Callable[..., Any], params: dict[str, Any]) -> InputStream:
    """input_fn's batches read in the chief's process, as evaluation and prediction on the system read them
    (input_fn runs eagerly, even if the caller is building a graph: see InputStream)."""
    return InputStream.local(input_fn, params)
