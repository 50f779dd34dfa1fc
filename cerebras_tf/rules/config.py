"""Rules on RunConfig and the environment of a CS-system run.

They read the run's CSSettings (resolved once from the config and TF_CONFIG
at the start of the run), never the config itself.
"""
from __future__ import annotations

import json

from cerebras_tf.cs_config import WEIGHT_STREAMING
from cerebras_tf.errors import CerebrasError, ConfigError
from cerebras_tf.run_config import DEFAULT_SAVE_CHECKPOINTS_STEPS, DEFAULT_TF_CONFIG
from cerebras_tf.settings import CSSettings

# RunConfig arguments the CS system does not support (Cerebras documentation,
# "Limitations of the CerebrasEstimator", Config differences).
UNSUPPORTED_RUN_CONFIG_ARGS = (
    "save_checkpoints_secs",
    "train_distribute",
    "device_fn",
    "protocol",
    "eval_distribute",
    "experimental_distribute",
    "experimental_max_worker_delay_secs",
)

# The documented lower bound on save_checkpoints_steps: the CS system trains
# fast, and downloading all weights from the wafer for a checkpoint stalls it.
MIN_SAVE_CHECKPOINTS_STEPS = 100

_VALID_TF_CONFIG = json.dumps(DEFAULT_TF_CONFIG)

# What tf.estimator.RunConfig sets save_checkpoints_secs to when given neither it nor save_checkpoints_steps.
_RUN_CONFIG_DEFAULT_CHECKPOINT_SECS = 600


def check_run_config(settings: CSSettings) -> list[CerebrasError]:
    """Refuse RunConfig settings the CS system does not support."""
    problems: list[CerebrasError] = []
    where = settings.created_at
    for name in UNSUPPORTED_RUN_CONFIG_ARGS:
        value = settings.run_config_args.get(name)
        if value is None:
            continue
        fix = f"Remove {name}= from the RunConfig for CS-system runs (it still works on CPU/GPU)."
        message = f"RunConfig parameter {name}={value!r} is not supported on the CS system."
        if name == "save_checkpoints_secs":
            fix = (
                "Checkpoint by steps: CSRunConfig(save_checkpoints_steps=N) with N >= "
                f"{MIN_SAVE_CHECKPOINTS_STEPS}. Note that tf.estimator.RunConfig sets save_checkpoints_secs=600 "
                "by default; CSRunConfig checkpoints by steps."
            )
            if _plain_run_config_default(settings, value):
                message += (f" {value} is tf.estimator.RunConfig's default: a plain RunConfig given neither "
                            "save_checkpoints_steps nor save_checkpoints_secs checkpoints every 600 seconds.")
                fix = (
                    "Use cerebras_tf.CSRunConfig(cs_ip=..., <your RunConfig arguments>), which checkpoints every "
                    f"{DEFAULT_SAVE_CHECKPOINTS_STEPS} steps unless told otherwise, or "
                    f"tf.estimator.RunConfig(save_checkpoints_steps=N) with N >= {MIN_SAVE_CHECKPOINTS_STEPS}."
                )
        problems.append(ConfigError(message, where=where, fix=fix))
    problems += check_cs_config(settings)
    steps = settings.save_checkpoints_steps
    if steps is not None and steps < MIN_SAVE_CHECKPOINTS_STEPS:
        problems.append(
            ConfigError(
                f"save_checkpoints_steps={steps} is below the CS system's lower bound of "
                f"{MIN_SAVE_CHECKPOINTS_STEPS}: every checkpoint downloads all weights from the wafer and "
                "stalls training.",
                where=where,
                fix=f"Use save_checkpoints_steps >= {MIN_SAVE_CHECKPOINTS_STEPS}, or None to save only at the end.",
            )
        )
    return problems


def _plain_run_config_default(settings: CSSettings, secs: object) -> bool:
    """Whether save_checkpoints_secs=`secs` is the value a plain tf.estimator.RunConfig sets by itself."""
    return not settings.cs_run_config and secs == _RUN_CONFIG_DEFAULT_CHECKPOINT_SECS \
        and settings.save_checkpoints_steps is None


def check_cs_config(settings: CSSettings) -> list[CerebrasError]:
    """Refuse cs_config settings no CS system runs: several systems in pipelined execution.

    (Fields it ignores were warned about when the CSRunConfig was built; see cerebras_tf/cs_config.py.)
    """
    systems = settings.num_csx
    if systems > 1 and settings.execution_strategy != WEIGHT_STREAMING:
        return [ConfigError(
            f"cs_config num_csx={systems} asks for {systems} CS systems in pipelined execution, which runs on one "
            "system (several systems are data parallel in weight streaming).",
            where=settings.created_at,
            fix="Set num_csx=1 (or leave it out) for pipelined execution, or execution_strategy "
                "'weight_streaming' (ES_WEIGHT_STREAMING) to spread the batch over several systems.")]
    return []


def check_tf_config(settings: CSSettings) -> list[CerebrasError]:
    """A CS training run needs a valid TF_CONFIG naming the chief (and any input workers, as many as
    num_input_workers asks for). CSSettings parsed it once when the run started; this reports what it found.
    An appliance (R1.8's CSX runs) manages its own cluster: it needs no TF_CONFIG, and checks one that is set."""
    fix = f"export TF_CONFIG='{_VALID_TF_CONFIG}' (or call cerebras_tf.set_default_tf_config() in the run script)."
    if not settings.tf_config and settings.appliance:
        return []
    if not settings.tf_config:
        return [ConfigError("The TF_CONFIG environment variable must be set for training on the CS system.", fix=fix)]
    problems: list[CerebrasError] = []
    error = settings.tf_config_error
    if error is not None:  # names the offending field; the fix here shows a whole valid value
        problems.append(ConfigError(error.message, fix=f"{fix} With input workers: {error.fix}"))
    if settings.input_workers_error is not None:
        problems.append(settings.input_workers_error)
    return problems
