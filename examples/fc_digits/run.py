"""Train and evaluate the FC digits classifier; on the (simulated) CS system with --cs_ip.

  python -m examples.fc_digits.run --cs_ip localhost:9000 --validate_only   # CS-system precheck
  python -m examples.fc_digits.run --cs_ip localhost:9000 --compile_only    # compile for the WSE
  python -m examples.fc_digits.run --cs_ip localhost:9000 --mode train      # train on the simulated WSE
  python -m examples.fc_digits.run --cs_ip localhost:9000 --steps 200       # ... 200 steps more
  python -m examples.fc_digits.run --mode eval                              # evaluate the checkpoint on CPU/GPU
  python -m examples.fc_digits.run --mode train_and_eval                    # both on CPU/GPU
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import numpy as np
import yaml
from absl import app, flags

from cerebras_tf import CerebrasError, CerebrasEstimator, CSRunConfig, errors, set_default_tf_config
from examples.fc_digits.data import eval_input_fn, train_input_fn
from examples.fc_digits.model import model_fn

DEFAULT_PARAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "params.yaml")
DEFAULT_MODEL_DIR = "./model_dir_fc_digits"
MODES = ("train", "eval", "train_and_eval")
# params["runconfig"] keys that control this script; every other key is a CSRunConfig argument.
_RUN_KEYS = ("max_steps", "eval_steps")

# The model builds its layers with tf.compat.v1.layers, as the Model Zoo's TensorFlow models do; tf-keras
# warns that they are deprecated each time a graph is built. Nothing to act on for the CS system.
warnings.filterwarnings("ignore", message=r"`tf\.layers\.\w+` is deprecated", category=UserWarning)

FLAGS = flags.FLAGS
flags.DEFINE_enum("mode", "train", list(MODES), "What to run.")
flags.DEFINE_bool("validate_only", False, "Check the model against every CS-system rule, then stop.")
flags.DEFINE_bool("compile_only", False, "Compile the model for the WSE (artifact in compile_dir), then stop.")
flags.DEFINE_string("cs_ip", None, "Address of the CS system; unset runs on CPU/GPU.")
flags.DEFINE_string("params", DEFAULT_PARAMS, "Params YAML.")
flags.DEFINE_string("model_dir", DEFAULT_MODEL_DIR, "Checkpoints and summaries.")
flags.DEFINE_integer("steps", None, "Train this many more steps.")
flags.DEFINE_integer("max_steps", None, "Train up to this global step (default: params runconfig.max_steps).")
flags.DEFINE_integer("eval_steps", None, "Evaluation batches (default: params runconfig.eval_steps).")


def load_params(path: str = DEFAULT_PARAMS) -> dict[str, Any]:
    """The params YAML as a dict."""
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def build_estimator(params: dict[str, Any], model_dir: str, cs_ip: str | None) -> CerebrasEstimator:
    """A CerebrasEstimator whose CSRunConfig takes every params["runconfig"] key but the step counts."""
    config_kwargs = {key: value for key, value in params["runconfig"].items() if key not in _RUN_KEYS}
    config = CSRunConfig(cs_ip=cs_ip, **config_kwargs)
    return CerebrasEstimator(model_fn, model_dir=model_dir, config=config, params=params)


def run(
    mode: str = "train",
    *,
    params: dict[str, Any] | None = None,
    model_dir: str = DEFAULT_MODEL_DIR,
    cs_ip: str | None = None,
    validate_only: bool = False,
    compile_only: bool = False,
    steps: int | None = None,
    max_steps: int | None = None,
    eval_steps: int | None = None,
) -> dict[str, Any] | None:
    """Run the example as the command line does; returns the evaluation metrics when it evaluates.

    Raises a cerebras_tf CerebrasError for anything the CS system refuses,
    before anything is written to model_dir.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: choose one of {MODES}.")
    if mode == "train_and_eval" and cs_ip and not (validate_only or compile_only):
        raise errors.UnsupportedModeError(
            "--mode train_and_eval does not run on the CS system: the fabric is programmed once per run "
            "and cannot switch from the training to the evaluation program.",
            fix="Run --mode train with --cs_ip, then --mode eval (evaluates the checkpoint on CPU/GPU); "
            "or drop --cs_ip to run train_and_eval on CPU/GPU.",
        )
    params = params if params is not None else load_params()
    runconfig = params["runconfig"]
    if cs_ip:
        set_default_tf_config()  # as the Cerebras example scripts do
    estimator = build_estimator(params, model_dir, cs_ip)
    system = f"the simulated CS system at {cs_ip} (embedded in this process)" if cs_ip else "CPU/GPU (plain TensorFlow)"

    if validate_only or compile_only:
        print(f"{'Validating' if validate_only else 'Compiling'} the model for the CS system "
              f"({'at ' + cs_ip if cs_ip else 'no cs_ip needed'}).")
        result = estimator.compile(train_input_fn, validate_only=validate_only)  # logs a summary of the report
        if validate_only:
            print(f"The model passed every CS-system check ({result.kernel_summary}).")
            return None
        print(f"Compiled {result.kernel_summary} to {result.artifact_dir} "
              f"({'reused' if result.reused else 'built'}; report.txt and placement.png there).")
        if result.placement is not None:
            placement = result.placement
            print(f"Estimated {placement.estimated_samples_per_sec:,.0f} samples/s on {placement.fabric.name} "
                  f"(limited by {placement.limiting_bound}).")
        return None

    if mode in ("train", "train_and_eval"):
        if steps is None and max_steps is None:
            max_steps = runconfig["max_steps"]
        until = f"for {steps} more steps" if steps is not None else f"up to global step {max_steps}"
        done = _global_step(estimator)
        if steps is None and max_steps is not None and done >= max_steps:
            # Estimator.train would do nothing and say so only in its log: say it here, with the way out.
            print(f"Nothing to train: {estimator.model_dir} already holds a checkpoint at global step {done}, "
                  f"at or past --max_steps {max_steps}. Pass --steps N to train N more steps, a larger "
                  "--max_steps, or a new --model_dir.")
        else:
            print(f"Training on {system} {until} (model_dir {estimator.model_dir}).")
            estimator.train(train_input_fn, steps=steps, max_steps=max_steps, use_cs=True)
            print(f"Trained to global step {_global_step(estimator)}.")
    if mode in ("eval", "train_and_eval"):
        eval_steps = runconfig["eval_steps"] if eval_steps is None else eval_steps
        print(f"Evaluating the latest checkpoint in {estimator.model_dir} on CPU/GPU for {eval_steps} steps.")
        metrics = estimator.evaluate(eval_input_fn, steps=eval_steps, use_cs=False)
        print("Evaluation: " + ", ".join(f"{key}={_format(value)}" for key, value in sorted(metrics.items())))
        return metrics
    return None


def _global_step(estimator: CerebrasEstimator) -> int:
    """The global step of the latest checkpoint in model_dir (0 with none)."""
    return int(estimator.get_variable_value("global_step")) if estimator.latest_checkpoint() else 0


def _format(value: Any) -> str:
    return str(value) if isinstance(value, (int, np.integer)) else f"{float(value):.4f}"


def main(argv: list[str]) -> int:
    """absl entry point: runs the flags; a CerebrasError is printed to stderr (no traceback) and exits 1."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    try:
        run(
            FLAGS.mode,
            params=load_params(FLAGS.params),
            model_dir=FLAGS.model_dir,
            cs_ip=FLAGS.cs_ip,
            validate_only=FLAGS.validate_only,
            compile_only=FLAGS.compile_only,
            steps=FLAGS.steps,
            max_steps=FLAGS.max_steps,
            eval_steps=FLAGS.eval_steps,
        )
    except CerebrasError as error:  # a porting problem: say it plainly, no traceback
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    app.run(main)
