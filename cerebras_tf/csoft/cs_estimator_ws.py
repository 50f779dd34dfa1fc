"""``cerebras.tf.ws.cs_estimator_ws``: the weight-streaming container's CerebrasEstimator.

Model Zoo R1.6/R1.7 pick weight streaming by whether ``import tfwse`` and
this module's ``CerebrasEstimator`` import (the Cerebras weight-streaming
container had them; modelzoo/common/tf/run_utils.get_execution_mode). Here it
is cerebras-tf's CerebrasEstimator whose runs are weight streaming by default:
a cs_config that sets ``execution_strategy`` still chooses (``pipeline`` lays
the model out pipelined). As that container's estimator did, its evaluations
on the system take the model_fn's own ``eval_metric_ops`` (the zoo's
weight-streaming path returns them instead of a host_call: GPT-2, GPT-J); the
host runs them over the tensors they read, which the program streams.
``train`` takes the zoo's ``sparsifier`` argument: None (what the zoo passes)
trains as usual; sparse training is not simulated, so a sparsifier is refused.
The class keeps the name ``CerebrasEstimator``: the zoo's wrapper tests
``estimator.__name__ == "CerebrasEstimator"`` to pass compile_dir and use_cs.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from cerebras_tf import cs_estimator
from cerebras_tf.errors import RunArgumentError
from estimator.source import caller_location

__all__ = ["CerebrasEstimator"]


class CerebrasEstimator(cs_estimator.CerebrasEstimator):
    """cerebras_tf.CerebrasEstimator, weight streaming unless cs_config's execution_strategy says otherwise."""

    _WEIGHT_STREAMING_STACK = True

    def train(
        self,
        input_fn: Callable[..., Any],
        hooks: Iterable[Any] | None = None,
        steps: int | None = None,
        max_steps: int | None = None,
        saving_listeners: Iterable[Any] | None = None,
        use_cs: bool = True,
        sparsifier: Any = None,
    ) -> "CerebrasEstimator":
        """Train as cerebras_tf.CerebrasEstimator.train does; `sparsifier` must be None (sparse training is not
        simulated)."""
        if sparsifier is not None:
            raise RunArgumentError(
                f"train(sparsifier={type(sparsifier).__name__}): sparse weight-streaming training is not simulated "
                "by cerebras-tf.", where=caller_location(),
                fix="Train dense: leave sparsifier out (None), as the Model Zoo's scripts do.")
        super().train(input_fn, hooks=hooks, steps=steps, max_steps=max_steps, saving_listeners=saving_listeners,
                      use_cs=use_cs)
        return self
