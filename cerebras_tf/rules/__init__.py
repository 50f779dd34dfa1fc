"""Every documented limitation of the CS system, as checks that return errors.

Each check returns a list of CerebrasError (empty when the rule holds) so a
caller can report every problem at once. Checks read the run's CSSettings
(cerebras_tf/settings.py), never the RunConfig itself. One module per area:

- config: RunConfig parameters, the checkpoint-steps bound, TF_CONFIG
- input:  input_fn signature, Dataset type, element structure, fixed batch,
          repeat forever, shuffle seeds with several input workers, Python
          functions with remote input workers
- spec:   eval_metric_ops and hooks in the EstimatorSpec
- run:    train/evaluate/predict arguments, train_and_evaluate
"""
from cerebras_tf.rules import config, input, run, spec  # noqa: A004 - module names mirror the areas

__all__ = ["config", "input", "run", "spec"]
