"""``cerebras.tf.summary`` / ``cerebras_tensorflow.graph_extraction``: whether the CS system computes summaries.

The Model Zoo wraps building its estimator and the run in
``cs1_enable_summaries()`` or ``cs1_disable_summaries()`` (R1.8's
``run_appliance(enable_cs_summaries=...)``). Inside ``cs1_disable_summaries()``
a run on the simulated CS system leaves model_fn's summaries out of its
program (one log line says how many); inside ``cs1_enable_summaries()``, and
outside both, they are computed on the system and written by the host.
CPU/GPU runs are unaffected: they write their summaries as tf.estimator does.
The blocks nest; the innermost wins.
"""
from __future__ import annotations

from typing import ContextManager

from cerebras_tf.settings import summaries_on_system

__all__ = ["cs1_disable_summaries", "cs1_enable_summaries"]


def cs1_enable_summaries() -> ContextManager[None]:
    """Runs on the CS system within the block compute model_fn's summaries."""
    return summaries_on_system(True)


def cs1_disable_summaries() -> ContextManager[None]:
    """Runs on the CS system within the block leave model_fn's summaries out."""
    return summaries_on_system(False)
