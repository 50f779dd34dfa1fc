"""Every documented limitation of the CS system, as checks that return errors.

Each check returns a list of CerebrasError (empty when the rule holds) so a
caller can report every problem at once. Checks read the run's CSSettings
(cerebras_tf/settings.py), never the RunConfig itself. One module per area:

- config: RunConfig parameters, the checkpoint-steps bound, TF_CONFIG
- input:  input_fn callable and its signature, Dataset type, the pipeline builds
          (batch size > 0), element structure, fixed batch, repeat forever,
          shuffle seeds with several input workers, Python functions with
          remote input workers
- spec:   what model_fn returns (an EstimatorSpec tf.estimator accepts), eval_metric_ops
          and hooks in it, host_call's structure
- run:    train/evaluate/predict/compile arguments (step counts, params, mode), train_and_evaluate,
          model_dir and compile_dir usable
- checkpoint: the checkpoint a run starts from has every variable of the model, same shapes and dtypes
"""
from cerebras_tf.rules import checkpoint, config, input, run, spec  # noqa: A004 - module names mirror the areas

__all__ = ["checkpoint", "config", "input", "run", "spec"]
