"""CSSettings: everything a run on the CS system reads from its RunConfig and environment, resolved once.

Why one object: the CS path used to work its settings out where it needed
them (reads of CSRunConfig fields with plain-RunConfig fallbacks in the
estimator, the rules, precheck, the training loop and the input stream), so
the defaults for a plain tf.estimator.RunConfig and the input-worker count were
decided in several places, not always alike. CerebrasEstimator resolves one
CSSettings at the start of train/evaluate/predict/compile and passes it down;
this is the only module that reads the CS fields off a config.

Resolving never raises. A CSRunConfig validated its arguments when it was
built (ValueError/TypeError, naming the argument); a plain RunConfig has no CS
fields and gets the defaults (no cs_ip, WSE-2, amp's half dtype, one system,
pipelined, input read in the chief's process unless TF_CONFIG lists workers).
A problem with the run's environment, TF_CONFIG that cannot be parsed or that
lists another number of workers than num_input_workers asks for, is kept here
and reported by rules.config.check_tf_config with every other problem of a CS
training run (compile() does not apply that rule, so it does not fail on it).
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import types
from typing import Any, Iterator, Mapping

from tensorflow.python.eager import context

from cerebras_tf.cluster import Cluster, InputPlan, parse_tf_config, plan_input_workers
from cerebras_tf.cs_config import PIPELINE, WEIGHT_STREAMING
from cerebras_tf.errors import ConfigError
from cerebras_tf.run_config import DEFAULT_INPUT_WORKER_TIMEOUT_SECS, CSRunConfig
from cerebras_tf.wse.fabric import WSE2, Fabric
from estimator import RunConfig, run_config_value

# Whether runs on the CS system compute model_fn's summaries: the innermost of the Cerebras stack's
# cs1_enable_summaries()/cs1_disable_summaries() blocks (cerebras_tf.csoft.summary) open now; True outside.
_SUMMARIES_ON_SYSTEM: list[bool] = []


@contextlib.contextmanager
def summaries_on_system(enabled: bool) -> Iterator[None]:
    """Within the block, runs on the CS system compute model_fn's summaries (`enabled`) or skip them."""
    _SUMMARIES_ON_SYSTEM.append(enabled)
    try:
        yield
    finally:
        _SUMMARIES_ON_SYSTEM.pop()


# The system address of an appliance config without a mgmt_address.
APPLIANCE = "appliance"

# How often the CS training loop logs when RunConfig.log_step_count_steps is None (tf.estimator's default).
DEFAULT_LOG_STEP_COUNT_STEPS = 100

# The tf.estimator.RunConfig constructor arguments (the rules refuse some of them when they are set).
_RUN_CONFIG_ARGS = tuple(name for name in inspect.signature(RunConfig.__init__).parameters if name != "self")


@dataclasses.dataclass(frozen=True)
class InputWorkerSettings:
    """Where a run's input comes from: the chief alone, in-process workers, or TF_CONFIG's.

    Attributes:
      cluster: TF_CONFIG's chief and `worker` tasks when the run started (a lone
        chief without TF_CONFIG, or when it could not be used).
      plan: local / embedded (N in-process workers) / cluster (the TF_CONFIG workers),
        from num_input_workers (or cs_config's num_workers_per_csx) and the cluster.
      timeout_secs: how long the chief waits for the TF_CONFIG workers to register.
      global_seed: tf.random.set_seed's seed when the run started, or None. The input
        stream runs input_fn eagerly, where that seed fixes every shuffle's seeds, so
        the deterministic-shuffle rule counts it (RunConfig.tf_random_seed is in the
        captured graph already).
    """

    cluster: Cluster
    plan: InputPlan
    timeout_secs: float
    global_seed: int | None

    @property
    def num_workers(self) -> int:
        return self.plan.num_workers


@dataclasses.dataclass(frozen=True)
class CSSettings:
    """The settings of one run on the CS system (see the module docstring).

    Attributes:
      cs_ip: the CS system's address; None means CPU/GPU (the parent Estimator runs), unless `appliance`.
      appliance: the config is the appliance's (R1.8: the appliance's CSConfig and no cs_ip); use_cs=True
        runs go to the simulated CS system standing in for the appliance cluster.
      mgmt_address: the appliance's management address, when the CSConfig gives one (never contacted).
      system_name: the target system compiled artifacts are tied to (default the system_address).
      fabric: the wafer the compiler places the model on.
      half_dtype: "cbfloat16" with cs_config use_cbfloat16=True, else None: amp's half
        dtype when the executor is created.
      num_csx, execution_strategy: cs_config's (1 by default; others are refused by rules.config). A
        cs_config without execution_strategy runs in the estimator's stack's default: "pipeline", or
        "weight_streaming" for the weight-streaming stack's estimator.
      weight_streaming_stack: the estimator is the Cerebras weight-streaming container's
        (cerebras_tf.csoft.cs_estimator_ws, what the Model Zoo's R1.6/R1.7 weight-streaming path imports):
        weight streaming unless cs_config says otherwise, and its evaluations take eval_metric_ops.
      input_workers: where a training run's input comes from.
      summaries: whether the run computes model_fn's summaries on the system (False inside the Cerebras
        stack's cs1_disable_summaries(); see summaries_on_system).
      tf_random_seed: RunConfig.tf_random_seed.
      save_checkpoints_steps, save_summary_steps, keep_checkpoint_max, session_config:
        as in the RunConfig.
      log_step_count_steps: how often the training loop logs (RunConfig's, 100 when None).
      run_config_args: every tf.estimator.RunConfig argument that is set (not None), by
        name, read-only; rules.config refuses the ones the CS system does not support.
      created_at: 'file:line' of the user code that built the CSRunConfig, for errors; for a plain
        RunConfig, where the estimator using it was built (when the caller says).
      cs_run_config: whether the config is a CSRunConfig (False: a plain tf.estimator.RunConfig, whose
        defaults are tf.estimator's, e.g. save_checkpoints_secs=600).
      tf_config: the TF_CONFIG environment variable when the run started (None: unset).
      tf_config_error: the ConfigError naming the field of a TF_CONFIG that cannot be parsed.
      input_workers_error: the ConfigError of a num_input_workers that contradicts the TF_CONFIG
        workers. With either error, input_workers falls back to a lone chief; rules.config.check_tf_config
        reports them (None when fine).
    """

    cs_ip: str | None
    appliance: bool
    mgmt_address: str | None
    system_name: str | None
    fabric: Fabric
    half_dtype: str | None
    num_csx: int
    execution_strategy: str
    weight_streaming_stack: bool
    execution_strategy_set: bool  # cs_config set execution_strategy (else the estimator's default)
    input_workers: InputWorkerSettings
    summaries: bool
    tf_random_seed: int | None
    save_checkpoints_steps: int | None
    save_summary_steps: int | None
    log_step_count_steps: int
    keep_checkpoint_max: int | None
    session_config: Any
    run_config_args: Mapping[str, Any]
    created_at: str | None
    cs_run_config: bool
    tf_config: str | None
    tf_config_error: ConfigError | None
    input_workers_error: ConfigError | None

    @property
    def on_cs_system(self) -> bool:
        """Whether a use_cs=True run with these settings targets the (simulated) CS system: a cs_ip is set, or
        the config is an appliance's."""
        return self.cs_ip is not None or self.appliance

    @property
    def system_address(self) -> str | None:
        """What the simulated system is known by in this process: the cs_ip, or for an appliance its
        mgmt_address (else "appliance"); None off the system."""
        if self.cs_ip is not None:
            return self.cs_ip
        return (self.mgmt_address or APPLIANCE) if self.appliance else None

    @property
    def host_runs_eval_metric_ops(self) -> bool:
        """Whether an evaluation on the system takes model_fn's own eval_metric_ops (the host runs them over
        tensors the program streams): an appliance's (R1.8), and the weight-streaming stack's, as the Model
        Zoo's weight-streaming path returns them (R1.6/R1.7's GPT-2 and GPT-J). Elsewhere host_call does."""
        return self.appliance or self.weight_streaming_stack

    @property
    def execution_reason(self) -> str:
        """Why the run uses its execution strategy, for the compile report."""
        mode = "weight streaming" if self.execution_strategy == WEIGHT_STREAMING else "pipelined execution"
        if self.execution_strategy_set:
            return f"{mode}: cs_config's execution_strategy asks for it"
        if self.weight_streaming_stack:
            return f"{mode}: the default of the weight-streaming stack's estimator (tfwse, cerebras.tf.ws)"
        return (f"{mode}: the default (cs_config sets no execution_strategy; weight streaming is for models "
                "above the wafer)")

    @classmethod
    def resolve(cls, config: RunConfig, environ: Mapping[str, str] = os.environ,
                estimator_created_at: str | None = None, weight_streaming_stack: bool = False) -> "CSSettings":
        """Read `config` (a CSRunConfig, or a plain RunConfig: CS defaults) and TF_CONFIG from `environ` once.

        `estimator_created_at` ('file:line' where the estimator was built) is where errors about a plain
        RunConfig point: where it was built is not known, but it was handed to the estimator there.
        `weight_streaming_stack`: the estimator is the weight-streaming stack's (see the attribute); an
        execution_strategy the cs_config sets wins over that stack's default.
        """
        cs = config if isinstance(config, CSRunConfig) else None
        tf_config = environ.get("TF_CONFIG") or None
        input_workers, tf_config_error, input_workers_error = _input_workers(cs, tf_config)
        log_steps = config.log_step_count_steps
        args = {name: value for name in _RUN_CONFIG_ARGS if (value := run_config_value(config, name)) is not None}
        appliance = cs.appliance if cs else False
        mgmt_address = cs.cs_config.get("mgmt_address") or None if cs else None
        strategy_set = cs is not None and "execution_strategy" in cs.cs_config
        return cls(
            cs_ip=cs.cs_ip if cs else None,
            appliance=appliance,
            mgmt_address=mgmt_address,
            system_name=(cs.system_name or (mgmt_address or APPLIANCE if appliance else None)) if cs else None,
            fabric=cs.fabric if cs else WSE2,
            half_dtype=cs.half_dtype if cs else None,
            num_csx=cs.num_csx if cs else 1,
            execution_strategy=cs.execution_strategy if strategy_set and cs else (
                WEIGHT_STREAMING if weight_streaming_stack else PIPELINE),  # else the estimator's stack's default
            execution_strategy_set=strategy_set,
            weight_streaming_stack=weight_streaming_stack,
            input_workers=input_workers,
            summaries=_SUMMARIES_ON_SYSTEM[-1] if _SUMMARIES_ON_SYSTEM else True,
            tf_random_seed=config.tf_random_seed,
            save_checkpoints_steps=config.save_checkpoints_steps,
            save_summary_steps=config.save_summary_steps,
            log_step_count_steps=max(1, log_steps) if log_steps else DEFAULT_LOG_STEP_COUNT_STEPS,
            keep_checkpoint_max=config.keep_checkpoint_max,
            session_config=config.session_config,
            run_config_args=types.MappingProxyType(args),
            created_at=cs.created_at if cs else estimator_created_at,
            cs_run_config=cs is not None,
            tf_config=tf_config,
            tf_config_error=tf_config_error,
            input_workers_error=input_workers_error,
        )


def _input_workers(cs: CSRunConfig | None, tf_config: str | None
                   ) -> tuple[InputWorkerSettings, ConfigError | None, ConfigError | None]:
    """The input-worker settings, with the TF_CONFIG parse error or the worker-count contradiction that made
    them fall back to a lone chief (None, None when there is neither)."""
    requested = cs.requested_input_workers if cs else None
    timeout = cs.input_worker_timeout_secs if cs else DEFAULT_INPUT_WORKER_TIMEOUT_SECS
    tf_config_error = input_workers_error = None
    try:
        cluster = parse_tf_config(tf_config)
    except ConfigError as exc:
        tf_config_error, cluster = exc, parse_tf_config(None)
    try:
        plan = plan_input_workers(cluster, requested)
    except ConfigError as exc:
        input_workers_error, cluster = exc, parse_tf_config(None)
        plan = plan_input_workers(cluster, requested)
    return InputWorkerSettings(cluster, plan, timeout, context.global_seed()), tf_config_error, input_workers_error
