"""The project's error types: every CS-system limitation raises a CerebrasError.

Each error names the problem, where it came from in the user's code (when it
can be known) and what to do instead. Where the Cerebras documentation gives
the message, `message` is that text verbatim.
"""
from __future__ import annotations

from typing import Sequence


class CerebrasError(Exception):
    """Base class of every error cerebras-tf raises for a CS-system rule."""

    tag = "[Cerebras]"

    def __init__(self, message: str, *, where: str | None = None, fix: str | None = None) -> None:
        self.message = message
        self.where = where
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{self.tag} {self.message}" if self.tag else self.message]
        if self.where:
            lines.append(f"  Where: {self.where}")
        if self.fix:
            lines.append(f"  What to do: {self.fix}")
        return "\n".join(lines)


class UnsupportedTensorFlowError(CerebrasError):
    """A TensorFlow feature the CS system does not support."""

    tag = "[Unsupported TensorFlow]"


class InputFunctionError(UnsupportedTensorFlowError):
    """input_fn or its dataset breaks a CS-system input rule."""


class HookError(UnsupportedTensorFlowError):
    """User hooks or saving listeners in a CS-system run."""


class EvalMetricOpsError(UnsupportedTensorFlowError):
    """eval_metric_ops in a CS-system run (metrics go through host_call)."""


class HostCallError(UnsupportedTensorFlowError):
    """A CSEstimatorSpec host_call the CS system cannot stream: not (fn, list|tuple|dict of nested tensors)."""


class UnsupportedModeError(UnsupportedTensorFlowError):
    """A mode or entry point that does not run on the CS system."""


class ConfigError(CerebrasError):
    """A RunConfig/CSRunConfig setting or environment the CS system does not accept."""

    tag = "[Unsupported Config]"


class RunArgumentError(CerebrasError):
    """Arguments of train/evaluate/predict that a CS-system run needs or refuses."""

    tag = "[Invalid Run]"


class StepCountError(RunArgumentError, ValueError):
    """A step count (train's steps/max_steps, evaluate's steps, predict's num_samples) that is not a positive
    integer. The message is tf.estimator's ("Must specify steps > 0, given: 0"); a ValueError too, as
    tf.estimator raises it."""


class EstimatorArgumentError(CerebrasError):
    """An argument of the CerebrasEstimator or of one of its methods that it cannot use at all: params that is
    not a dict, an input_fn that is not callable, an unknown compile mode."""

    tag = "[Invalid Argument]"


class ConfigValueError(ConfigError, ValueError):
    """A CSRunConfig argument with a wrong type or value, refused when the config is built (a ValueError too,
    as tf.estimator.RunConfig refuses its own arguments)."""


class ConfigTypeError(ConfigError, TypeError):
    """A CSRunConfig argument of the wrong type (e.g. a cs_config that is neither a dict nor a CSConfig),
    refused when the config is built (a TypeError too)."""


class TrainerLockError(CerebrasError):
    """Another training run on the CS system holds the model_dir (cerebras_tf/run/trainer_lock.py)."""

    tag = "[Cerebras]"


class ModelDirError(CerebrasError):
    """model_dir (or compile_dir) cannot be used: a regular file, inside one, or not writable."""

    tag = "[Model Dir]"


class ModelDirWriteError(ModelDirError):
    """Writing into model_dir (or compile_dir) failed because its disk is full (ENOSPC, a quota) or it became
    unwritable (EACCES, EPERM, EROFS): a checkpoint, the run's event file, graph.pbtxt, the trainer lock or the
    compile artifact (cerebras_tf/write_failures.py). `path` is the file being written, `reason` the system's
    words ("No space left on device") and `free_bytes` the space left on that filesystem (None if unknown)."""

    def __init__(self, message: str, *, where: str | None = None, fix: str | None = None, path: str = "",
                 reason: str = "", free_bytes: int | None = None) -> None:
        self.path = path
        self.reason = reason
        self.free_bytes = free_bytes
        super().__init__(message, where=where, fix=fix)


class CheckpointMismatchError(CerebrasError):
    """The checkpoint a run would start from does not fit the model: variables missing, or of another shape or
    dtype (the model changed but model_dir did not), or it cannot be read."""

    tag = "[Checkpoint]"


class ModelFnError(CerebrasError):
    """model_fn returned something other than a valid EstimatorSpec for the mode (None, a dict, a spec without
    loss, with a non-scalar loss, a train_op or prediction that is not a tensor...)."""

    tag = "[Invalid model_fn]"


class MultipleProblemsError(CerebrasError):
    """Several rules failed at once; `problems` holds each error."""

    tag = ""

    def __init__(self, problems: Sequence[CerebrasError]) -> None:
        self.problems = list(problems)
        numbered = "\n".join(
            f"{index}. " + problem.render().replace("\n", "\n   ")
            for index, problem in enumerate(self.problems, start=1)
        )
        super().__init__(f"{len(self.problems)} problems prevent running this model on the CS system:\n{numbered}")


def raise_problems(problems: Sequence[CerebrasError]) -> None:
    """Raise nothing, the one problem, or all of them as a MultipleProblemsError."""
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise MultipleProblemsError(problems)


class FabricCapacityError(CerebrasError):
    """The model does not fit on the wafer in pipelined execution mode.

    When the placer measured it: `bytes_needed` (on-chip memory the model needs), `bytes_available`
    (the fabric's SRAM) and `largest_layers` ((name, bytes) of the largest layers, largest first).
    """

    tag = "[Fabric Capacity]"

    def __init__(self, message: str, *, where: str | None = None, fix: str | None = None,
                 bytes_needed: float | None = None, bytes_available: float | None = None,
                 largest_layers: Sequence[tuple[str, float]] = ()) -> None:
        self.bytes_needed = bytes_needed
        self.bytes_available = bytes_available
        self.largest_layers = list(largest_layers)
        super().__init__(message, where=where, fix=fix)


class CompileError(UnsupportedTensorFlowError):
    """The WSE compiler cannot lower part of the model's graph."""


class UnsupportedOpError(CompileError):
    """A TF op with no kernel in the WSE kernel library."""


class DynamicShapeError(CompileError):
    """A tensor, or a value the compiler must know (axis, shape), is not static after folding."""


class ArtifactSystemMismatchError(CerebrasError):
    """A compiled artifact was built for another CS system."""

    tag = "[CS System]"


class InputWorkerError(CerebrasError):
    """The input workers cannot stream data: registration timeout, all workers lost, a worker's pipeline failed."""

    tag = "[Input Workers]"


class InputWorkerWarning(UserWarning):
    """An input worker was lost; training continues on the others."""


class ConfigWarning(UserWarning):
    """CSRunConfig settings the simulated CS system ignores (cs_config fields, stack_params keys)."""


class SystemProgrammedError(CerebrasError):
    """The simulated CS system was already programmed with another program in this process."""
