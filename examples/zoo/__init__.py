"""Model zoo: model_fn / input_fn pairs the compiler must lower (MLP, CNN, transformer encoder).

Each module exposes `model_fn(features, labels, mode, params)`, `input_fn(params)`
and `DEFAULT_PARAMS` (small sizes; pass larger ones for benchmarks). Data is
generated with numpy; each input_fn returns a repeating, fixed-batch
tf.data.Dataset of (features, labels), as the CS system requires.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

from examples.zoo import cnn, mlp, transformer

MODELS = {"mlp": mlp, "cnn": cnn, "transformer": transformer}


def benchmark_models() -> dict[str, tuple[ModuleType, dict[str, Any]]]:
    """name -> (module, params) the benchmarks run: each model at its defaults, and the BERT-base-sized encoder."""
    return {**{name: (module, {}) for name, module in MODELS.items()},
            "bert_base": (transformer, transformer.bert_base_params())}


__all__ = ["MODELS", "benchmark_models", "cnn", "mlp", "transformer"]
