"""CerebrasEstimator: a tf.estimator.Estimator that can target the CS system."""
from __future__ import annotations

import dataclasses
import glob
import itertools
import os
from typing import Any, Callable, Iterable, Iterator

import tensorflow as tf

from cerebras_tf import logs, rules, write_failures
from cerebras_tf.amp.tf_loss_scaling import STATE_SCOPE as LOSS_SCALE_SCOPE
from cerebras_tf.compiler.driver import CompileResult, compile_model, program_hash
from cerebras_tf.run.chief import checkpoint_to_evaluate, evaluate_on_system, predict_on_system, train_on_system
from cerebras_tf.errors import CerebrasError, EstimatorArgumentError, raise_problems
from cerebras_tf.precheck import precheck
from cerebras_tf.run_config import CSRunConfig
from cerebras_tf.settings import CSSettings
from cerebras_tf.spec import to_plain_spec
from cerebras_tf.run.tensorboard import write_image_summary
from cerebras_tf.wse.system import check_system, program_system
from estimator import CapturedModel, EstimatorBase, EstimatorSpec, ModeKeys, RunConfig
from estimator.source import caller_location

_log = tf.compat.v1.logging
logs.install()  # each log message once; no deprecation notices about our own calls

# TensorBoard on model_dir shows the compiled placement from this subdirectory.
PLACEMENT_SUMMARY_DIR = "cs_placement"


class CerebrasEstimator(EstimatorBase):
    """Estimator for the Cerebras CS system, with CPU/GPU fallback.

    With `config.cs_ip` unset (or `use_cs=False`) every method is the parent
    tf.estimator.Estimator's, with all its features. With a cs_ip, runs
    target the simulated CS system embedded in this process, and every
    CS-system rule is checked before anything is written to model_dir.
    Each of train/evaluate/predict/compile resolves the config and TF_CONFIG
    once, into a CSSettings, and hands that to everything it calls. A call
    with use_cs=True that runs on CPU/GPU because no cs_ip is set says so in
    one log line.

    Args:
      model_fn: the usual Estimator model_fn; it may return a CSEstimatorSpec.
      model_dir: checkpoints and summaries (plain TF checkpoints).
      compile_dir: where compile() writes its artifact; defaults to
        `<model_dir>/cs_compile`.
      config: a CSRunConfig (a plain RunConfig means CPU/GPU only).
      params: dict passed to model_fn and input_fn.
      warm_start_from: as for tf.estimator.Estimator.
    """

    # Whether this estimator is the Cerebras weight-streaming container's (weight streaming unless cs_config
    # says otherwise; see CSSettings.weight_streaming_stack and cerebras_tf.csoft.cs_estimator_ws).
    _WEIGHT_STREAMING_STACK = False

    def __init__(
        self,
        model_fn: Callable[..., Any],
        model_dir: str | None = None,
        compile_dir: str | None = None,
        config: RunConfig | None = None,
        params: dict[str, Any] | None = None,
        warm_start_from: Any = None,
    ) -> None:
        if not callable(model_fn):  # tf.estimator fails inside inspect with "unsupported callable"
            raise EstimatorArgumentError(
                f"model_fn must be a function (features, labels, mode, params, config), got "
                f"{type(model_fn).__name__} {model_fn!r:.80}.", where=caller_location(),
                fix="Pass the model function itself: CerebrasEstimator(model_fn=my_model_fn, ...), not its result "
                    "or its name.")
        super().__init__(
            model_fn=model_fn,
            model_dir=model_dir,
            config=config if config is not None else CSRunConfig(),
            params=params,
            warm_start_from=warm_start_from,
        )
        self._compile_dir = compile_dir or os.path.join(self.model_dir, "cs_compile")
        self._created_at = caller_location()  # where errors about params/a RunConfig point

    @property
    def compile_dir(self) -> str:
        return self._compile_dir

    @property
    def cs_ip(self) -> str | None:
        return self._settings().cs_ip

    def _settings(self) -> CSSettings:
        """This call's settings: the config and the environment as they are now."""
        return CSSettings.resolve(self.config, estimator_created_at=self._created_at,
                                  weight_streaming_stack=self._WEIGHT_STREAMING_STACK)

    def _use_cs_ignored(self, call: str, use_cs: bool, settings: CSSettings) -> None:
        """One log line when use_cs=True cannot be honoured because the config has no cs_ip."""
        if not use_cs or settings.on_cs_system:
            return
        if settings.cs_run_config:
            _log.info("%s(use_cs=True) runs on CPU/GPU with the plain Estimator: the CSRunConfig has no cs_ip "
                      "(set CSRunConfig(cs_ip='host:port') to run on the CS system).", call)
        else:
            _log.warning("%s(use_cs=True) runs on CPU/GPU with the plain Estimator: config is a plain "
                         "tf.estimator.RunConfig, which has no cs_ip; use cerebras_tf.CSRunConfig(cs_ip=...) to run "
                         "on the CS system.", call)

    def _call_problems(self, settings: CSSettings, writes: bool = True) -> list[CerebrasError]:
        """The problems of this estimator's own arguments for a call on the CS system: params a dict, and
        model_dir/compile_dir usable when the call writes there (checked before anything is written)."""
        problems = rules.run.check_params(self.params, self._created_at)
        if writes:
            problems += rules.run.check_output_dirs(self.model_dir, self.compile_dir)
        return problems

    def _check_checkpoint(self, model: CapturedModel, path: str | None) -> None:
        """Refuse a checkpoint that does not fit the model (before anything is compiled or written); say which
        of its variables the model lacks (ignored, as TF ignores them)."""
        if path is None:
            return
        raise_problems(rules.checkpoint.check_checkpoint(model.graph, path))
        extras = rules.checkpoint.extra_variables(model.graph, path, (LOSS_SCALE_SCOPE + "/",))
        if extras:
            _log.info("The checkpoint %s also holds %d variable(s) this model does not have, ignored as tf.estimator "
                      "ignores them: %s", path, len(extras), ", ".join(extras))

    def _adapt_spec(self, spec: EstimatorSpec, mode: str) -> EstimatorSpec:
        return to_plain_spec(spec, mode)

    def _announce_system(self, what: str, settings: CSSettings) -> None:
        if settings.num_csx > 1 and what != "Training":  # as on the Wafer-Scale Cluster
            _log.warning("cs_config num_csx=%d: %s runs on one system of the simulated cluster (several systems "
                         "are data parallel for training only).", settings.num_csx, what.lower())
        if settings.cs_ip is None:  # an appliance config (R1.8's CSX runs)
            contacted = f" (mgmt_address {settings.mgmt_address!r} is not contacted)" if settings.mgmt_address else ""
            _log.info("%s on the simulated CS system: no Cerebras appliance cluster is reachable from here, so the "
                      "simulated system embedded in this process stands in for it%s; no network connection is made.",
                      what, contacted)
            return
        _log.info(
            "%s on the simulated CS system %r (embedded in this process; no network connection is made).",
            what,
            settings.cs_ip,
        )

    def train(
        self,
        input_fn: Callable[..., Any],
        hooks: Iterable[Any] | None = None,
        steps: int | None = None,
        max_steps: int | None = None,
        saving_listeners: Iterable[Any] | None = None,
        use_cs: bool = True,
    ) -> "CerebrasEstimator":
        """Train; on the CS system when a cs_ip is configured and use_cs is True."""
        settings = self._settings()
        if not (use_cs and settings.on_cs_system):
            self._use_cs_ignored("train", use_cs, settings)
            return super().train(input_fn, hooks=hooks, steps=steps, max_steps=max_steps,
                                 saving_listeners=saving_listeners)
        raise_problems(rules.run.check_train_steps(steps, max_steps))  # first, as tf.estimator checks them
        problems = rules.run.check_train_call(hooks, steps, max_steps, saving_listeners)
        problems += rules.config.check_tf_config(settings)
        problems += self._call_problems(settings)
        self._announce_system("Training", settings)
        model = precheck(self, input_fn, ModeKeys.TRAIN, problems, settings)
        latest = tf.train.latest_checkpoint(self.model_dir)
        self._check_checkpoint(model, latest)
        if latest is None and self.warm_start_settings is not None:
            raise_problems(rules.checkpoint.check_warm_start(model.graph, self.warm_start_settings))
        compiled = self._program_system(model, settings)
        estimate = compiled.placement.estimated_samples_per_sec if compiled.placement is not None else None
        train_on_system(self, settings, model, compiled.program, input_fn, steps, max_steps, estimate)
        return self

    def evaluate(
        self,
        input_fn: Callable[..., Any],
        steps: int | None = None,
        hooks: Iterable[Any] | None = None,
        checkpoint_path: str | None = None,
        name: str | None = None,
        use_cs: bool = False,
    ) -> dict[str, Any]:
        """Evaluate; on the CS system only with use_cs=True (and a cs_ip)."""
        settings = self._settings()
        if not (use_cs and settings.on_cs_system):
            self._use_cs_ignored("evaluate", use_cs, settings)
            return super().evaluate(input_fn, steps=steps, hooks=hooks, checkpoint_path=checkpoint_path, name=name)
        raise_problems(rules.run.check_evaluate_steps(steps))  # first, as tf.estimator checks them
        self._announce_system("Evaluating", settings)
        problems = rules.run.check_evaluate_call(hooks, steps) + self._call_problems(settings)
        model = precheck(self, input_fn, ModeKeys.EVAL, problems, settings)
        assert steps is not None  # check_evaluate_call refused steps=None above
        path = checkpoint_to_evaluate(self.model_dir, checkpoint_path)
        self._check_checkpoint(model, path)
        program = self._program_system(model, settings).program
        return evaluate_on_system(self, settings, model, program, input_fn, steps, path)

    def predict(
        self,
        input_fn: Callable[..., Any],
        predict_keys: list[str] | None = None,
        hooks: Iterable[Any] | None = None,
        checkpoint_path: str | None = None,
        yield_single_examples: bool = True,
        num_samples: int | None = None,
        use_cs: bool = False,
    ) -> Iterator[Any]:
        """Predict; on the CS system only with use_cs=True (and a cs_ip).

        On the system, the PREDICT program runs from `checkpoint_path` (else
        the latest checkpoint in model_dir) over input_fn's batches: every
        problem is reported here, before the first prediction is asked for.
        `num_samples` stops after that many samples (needed for repeating
        datasets); otherwise prediction ends with the dataset.
        """
        raise_problems(rules.run.check_num_samples(num_samples))
        settings = self._settings()
        if use_cs and settings.on_cs_system:
            self._announce_system("Predicting", settings)
            problems = rules.run.check_predict_call(hooks) + self._call_problems(settings)
            model = precheck(self, input_fn, ModeKeys.PREDICT, problems, settings)
            path = checkpoint_to_evaluate(self.model_dir, checkpoint_path, "predict")
            self._check_checkpoint(model, path)
            program = self._program_system(model, settings).program
            batches = predict_on_system(self, settings, model, program, input_fn, path, predict_keys)
            predictions = _single_examples(batches) if yield_single_examples else batches
        else:
            self._use_cs_ignored("predict", use_cs, settings)
            predictions = super().predict(
                input_fn,
                predict_keys=predict_keys,
                hooks=hooks,
                checkpoint_path=checkpoint_path,
                yield_single_examples=yield_single_examples,
            )
        if num_samples is None:
            return predictions
        if yield_single_examples:
            return itertools.islice(predictions, num_samples)
        return _take_batches(predictions, num_samples)

    def compile(
        self,
        input_fn: Callable[..., Any],
        validate_only: bool = False,
        mode: str = ModeKeys.TRAIN,
    ) -> CompileResult:
        """Check the model against every CS-system rule and compile it for the WSE, with no system needed.

        Applies all rules whatever the cs_ip (except those about a run's
        environment and call arguments: TF_CONFIG, hooks passed to train,
        step counts) and raises one error listing every problem found; `mode`
        must be one of ModeKeys' (train, eval, infer), and a full compile
        needs a usable model_dir and compile_dir. Then
        lowers the graph to the WSE kernel IR: `validate_only=True` stops after
        matching every op to a kernel (nothing written); otherwise the artifact
        is written to compile_dir, or reused from there when the graph and the
        target system (config.system_name, default the cs_ip) are unchanged.
        A full compile also places the layers on the fabric (config.fabric):
        report.json and placement.png in the artifact, the placement table in
        the report, and an image summary under model_dir/cs_placement for
        TensorBoard. What a training run in this environment would refuse
        (TF_CONFIG unset or invalid) is a warning, logged and listed under
        "Warnings" at the end of the report (CompileResult.warnings), not an
        error. Returns the CompileResult (program, kernel counts, report,
        placement, reused, warnings).
        """
        raise_problems(rules.run.check_compile_mode(mode))
        settings = self._settings()
        problems = self._call_problems(settings, writes=not validate_only)
        result = self._compile(precheck(self, input_fn, mode, problems, settings), validate_only, settings)
        return _warn_about_environment(result, settings, mode)

    def _program_system(self, model: CapturedModel, settings: CSSettings) -> CompileResult:
        """Compile the model and program the simulated system with it.

        Refused (SystemProgrammedError, before anything is compiled or written)
        when this process already programmed the system with another program.
        """
        address = settings.system_address
        assert address is not None  # only runs on the CS system get here (settings.on_cs_system)
        check_system(address, program_hash(model, False, settings.execution_strategy, settings.num_csx),
                     model.input.mode, self.model_dir)
        result = self._compile(model, validate_only=False, settings=settings)
        program_system(address, result.graph_hash, model.input.mode, self.model_dir)
        return result

    def _compile(self, model: CapturedModel, validate_only: bool, settings: CSSettings) -> CompileResult:
        """Compile a prechecked model for the settings' system (reusing the artifact in compile_dir)."""
        result = compile_model(
            model,
            validate_only=validate_only,
            compile_dir=None if validate_only else self.compile_dir,
            system_name=settings.system_name,
            fabric=settings.fabric,
            execution_strategy=settings.execution_strategy,
            num_systems=settings.num_csx,
            execution_reason=settings.execution_reason,
        )
        if not result.reused:  # a reused artifact's report was logged when it was built (and is in compile_dir)
            _log.info("%s", result.summary())
        if result.placement is not None and not result.reused:
            logdir = os.path.join(self.model_dir, PLACEMENT_SUMMARY_DIR)
            with write_failures.writing(self.model_dir, "writing the placement picture", logdir,
                                        cleanup=[os.path.join(glob.escape(logdir), "events.out.tfevents.*")]):
                write_image_summary(logdir, f"placement/{model.input.mode}", result.placement.to_png())
        return result


def _warn_about_environment(result: CompileResult, settings: CSSettings, mode: str) -> CompileResult:
    """`result` with the problems a CS training run would find in this environment (TF_CONFIG) as warnings.

    compile() needs no TF_CONFIG, so it does not refuse the model for it; but a
    precheck that says OK and a train() that then stops on TF_CONFIG would
    mislead, so the report says what training will need.
    """
    if mode != ModeKeys.TRAIN:
        return result
    problems = rules.config.check_tf_config(settings)
    if not problems:
        return result
    text = "Warnings (compile() does not need these, but train(use_cs=True) in this environment stops on them):\n"
    text += "\n".join("  " + problem.render().replace("\n", "\n  ") for problem in problems)
    _log.warning("%s", text)
    return dataclasses.replace(result, report=f"{result.report.rstrip()}\n\n{text}\n", warnings=problems)


def _single_examples(batches: Iterator[Any]) -> Iterator[Any]:
    """One prediction per example, as Estimator.predict(yield_single_examples=True) yields them."""
    for batch in batches:
        if isinstance(batch, dict):
            for i in range(len(next(iter(batch.values())))):
                yield {key: value[i] for key, value in batch.items()}
        else:
            yield from batch


def _take_batches(batches: Iterator[dict[str, Any]], num_samples: int) -> Iterator[Any]:
    """Yield prediction batches until `num_samples` rows have been yielded (the last one cut)."""
    remaining = num_samples
    for batch in batches:
        size = len(next(iter(batch.values()))) if isinstance(batch, dict) else len(batch)
        if size >= remaining:
            yield {k: v[:remaining] for k, v in batch.items()} if isinstance(batch, dict) else batch[:remaining]
            return
        remaining -= size
        yield batch
