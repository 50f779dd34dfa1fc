"""Model zoo: model_fn / input_fn pairs the compiler must lower (MLP, CNN, transformer encoder).

Each module exposes `model_fn(features, labels, mode, params)`, `input_fn(params)`
and `DEFAULT_PARAMS` (small sizes; pass larger ones for benchmarks). Data is
generated with numpy; each input_fn returns a repeating, fixed-batch
tf.data.Dataset of (features, labels), as the CS system requires.
"""
from examples.zoo import cnn, mlp, transformer

MODELS = {"mlp": mlp, "cnn": cnn, "transformer": transformer}

__all__ = ["MODELS", "cnn", "mlp", "transformer"]
