"""The models the executor benchmarks measure, and the training step they time on either side.

Shared by executor_bench (steps/s) and step_profile (time per kernel / per TF op):
  - mlp: 784-500-300-10, batch 256, Adam (defined here);
  - cnn: the zoo CNN (conv + batch norm + pooling, Momentum) at CNN_PARAMS;
  - transformer: the zoo BERT-style encoder (its own Adam with weight decay in raw ops) at TRANSFORMER_PARAMS.
`prepare` builds a model's CerebrasEstimator and prechecks it (the captured graph both sides run);
`our_executor` compiles it for the simulated WSE; `tf_session` opens the captured graph in a
tf.compat.v1.Session ready to run its training step (the Estimator's inner loop without hooks).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

MODELS = ("mlp", "cnn", "transformer")
BATCH = 256  # the MLP's
CNN_PARAMS = {"batch_size": 64, "image_size": 32, "channels": 3, "filters": [32, 64, 64], "num_classes": 10,
              "num_examples": 512, "learning_rate": 0.05}
TRANSFORMER_PARAMS = {"batch_size": 8, "vocab_size": 8000, "hidden_size": 256, "num_layers": 2, "num_heads": 4,
                      "intermediate_size": 1024, "seq_length": 128, "max_predictions": 20, "num_examples": 64}
DESCRIPTIONS = {
    "mlp": "MLP 784-500-300-10 batch 256 Adam",
    "cnn": "CNN 32x32x3 filters 32/64/64 batch 64 Momentum",
    "transformer": "transformer hidden {hidden_size}, {num_layers} layers, {num_heads} heads, FFN {intermediate_size}, "
                   "seq {seq_length}, vocab {vocab_size}, {max_predictions} predictions, batch {batch_size}, "
                   "Adam with weight decay".format(**TRANSFORMER_PARAMS),
}


def mlp_input_fn(params: dict) -> Any:
    import numpy as np
    import tensorflow as tf

    rng = np.random.RandomState(0)
    x = rng.rand(BATCH * 8, 784).astype(np.float32)
    y = rng.randint(0, 10, BATCH * 8).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH, drop_remainder=True)


def mlp_model_fn(features: Any, labels: Any, mode: str, params: dict) -> Any:
    import tensorflow as tf
    from estimator import EstimatorSpec

    hidden = tf.compat.v1.layers.dense(features, 500, activation=tf.nn.relu)
    hidden = tf.compat.v1.layers.dense(hidden, 300, activation=tf.nn.relu)
    logits = tf.compat.v1.layers.dense(hidden, 10)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return EstimatorSpec(mode, loss=loss, train_op=train_op)


def model(name: str) -> tuple[Callable, Callable, dict]:
    """(model_fn, input_fn, params) of the benchmark model `name` (one of MODELS)."""
    if name == "mlp":
        return mlp_model_fn, mlp_input_fn, {}
    if name == "cnn":
        from examples.zoo import cnn
        return cnn.model_fn, cnn.input_fn, dict(CNN_PARAMS)
    if name == "transformer":
        from examples.zoo import transformer
        return transformer.model_fn, transformer.input_fn, dict(TRANSFORMER_PARAMS)
    raise ValueError(f"unknown benchmark model {name!r}: choose from {', '.join(MODELS)}")


@dataclasses.dataclass
class Prepared:
    """A benchmark model's estimator, its prechecked (captured) graph and 8 pre-made batches."""

    name: str
    estimator: Any
    model: Any  # cerebras_tf.precheck's captured model: .graph, .spec
    input_fn: Callable
    params: dict
    batches: list


def quiet_tf() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)


def prepare(name: str) -> Prepared:
    quiet_tf()
    from estimator import ModeKeys

    from cerebras_tf import CerebrasEstimator, CSRunConfig
    from cerebras_tf.precheck import precheck

    model_fn, input_fn, params = model(name)
    estimator = CerebrasEstimator(model_fn, model_dir=tempfile.mkdtemp(), config=CSRunConfig(cs_ip="bench:1"),
                                  params=params)
    captured = precheck(estimator, input_fn, ModeKeys.TRAIN)
    batches = list(input_fn(params).take(8).as_numpy_iterator())
    return Prepared(name, estimator, captured, input_fn, params, batches)


def our_executor(prepared: Prepared, provider: str) -> Any:
    """The compiled program on the simulated WSE (numerics: the half dtype selected now), dynamic loss
    scaling, with the host kernels `provider` names ("auto": as train(use_cs=True) picks them, "numpy" or
    "tensorflow")."""
    from cerebras_tf.amp import GradScaler
    from cerebras_tf.compiler import initial
    from cerebras_tf.run.host_kernels_tf import host_kernels_for
    from cerebras_tf.wse.executor import Executor

    program = prepared.estimator.compile(prepared.input_fn).program
    return Executor(program, initial.initial_values(prepared.model, program),
                    grad_scaler=GradScaler(loss_scale="dynamic"), host_kernels=host_kernels_for(program, provider))


@contextlib.contextmanager
def tf_session(prepared: Prepared) -> Iterator[tuple[Any, list]]:
    """(session, fetches): the captured graph, initialized, its input iterator made; running fetches is one
    training step (loss and train_op) on the input_fn's batches."""
    import tensorflow as tf

    graph = prepared.model.graph
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        session.run([tf.compat.v1.global_variables_initializer(),
                     [op for op in graph.get_operations() if op.type == "MakeIterator"]])
        yield session, [prepared.model.spec.loss, prepared.model.spec.train_op]
