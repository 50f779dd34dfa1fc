"""Transformer encoder with a masked-LM loss (BERT-style), in raw tf ops plus Keras/compat.v1 layers.

Embedding gather + position embeddings, layer norm, multi-head self-attention
with a padding mask and softmax, GELU feed-forward, residuals, and a masked-LM
loss on gathered positions with tied output embeddings. Trains with the
Adam-with-weight-decay pattern (BERT's AdamWeightDecayOptimizer, written with
raw ops), global-norm clipping and a linear warm-up + polynomial decay
learning rate. `bert_base_params()` gives the BERT-base-sized encoder.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from cerebras_tf import CSEstimatorSpec, ModeKeys

DEFAULT_PARAMS: dict[str, Any] = {
    "batch_size": 4,
    "vocab_size": 64,
    "hidden_size": 32,
    "num_layers": 2,
    "num_heads": 2,
    "intermediate_size": 64,
    "seq_length": 16,
    "max_predictions": 3,
    "dropout_rate": 0.1,
    "learning_rate": 1e-3,
    "warmup_steps": 10,
    "train_steps": 1000,
    "weight_decay": 0.01,
    "num_examples": 32,
    "seed": 2,
}

MASK_ID = 1  # token 0 is padding, token 1 is [MASK]


def bert_base_params(**overrides: Any) -> dict[str, Any]:
    """BERT-base sizes: 12 layers, hidden 768, 12 heads, FFN 3072, seq 128, vocab 30522."""
    return {**DEFAULT_PARAMS, "vocab_size": 30522, "hidden_size": 768, "num_layers": 12, "num_heads": 12,
            "intermediate_size": 3072, "seq_length": 128, "max_predictions": 20, "batch_size": 8, **overrides}


def input_fn(params: dict[str, Any]) -> tf.data.Dataset:
    """Random token sequences with padding, some positions replaced by [MASK].

    features: input_ids [batch, seq] int32; labels: [batch, 2, max_predictions]
    int32 holding the masked positions (row 0) and their original ids (row 1).
    """
    p = {**DEFAULT_PARAMS, **params}
    rng = np.random.default_rng(p["seed"])
    n, s, k = p["num_examples"], p["seq_length"], p["max_predictions"]
    ids = rng.integers(2, p["vocab_size"], size=(n, s), dtype=np.int32)
    lengths = rng.integers(k + 1, s + 1, size=n)
    ids[np.arange(s)[None, :] >= lengths[:, None]] = 0
    positions = np.stack([rng.choice(length, size=k, replace=False) for length in lengths]).astype(np.int32)
    originals = np.take_along_axis(ids, positions, axis=1)
    np.put_along_axis(ids, positions, MASK_ID, axis=1)
    labels = np.stack([positions, originals], axis=1)
    ds = tf.data.Dataset.from_tensor_slices((ids, labels)).repeat()
    return ds.batch(p["batch_size"], drop_remainder=True)


def _attention(x: tf.Tensor, mask_bias: tf.Tensor, p: dict[str, Any], training: bool) -> tf.Tensor:
    """Multi-head self-attention; x is [batch*seq, hidden]."""
    b, s, h, n = p["batch_size"], p["seq_length"], p["hidden_size"], p["num_heads"]
    d = h // n

    def heads(t: tf.Tensor) -> tf.Tensor:
        return tf.transpose(tf.reshape(t, [b, s, n, d]), [0, 2, 1, 3])

    q = heads(tf.compat.v1.layers.dense(x, h, name="query"))
    k = heads(tf.keras.layers.Dense(h, name="key")(x))
    v = heads(tf.compat.v1.layers.dense(x, h, name="value"))
    scores = tf.matmul(q, k, transpose_b=True) * (1.0 / float(np.sqrt(d)))
    probs = tf.nn.softmax(scores + mask_bias)
    if training:
        probs = tf.nn.dropout(probs, rate=p["dropout_rate"])
    context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [b * s, h])
    return tf.compat.v1.layers.dense(context, h, name="output")


def _encoder(input_ids: tf.Tensor, p: dict[str, Any], training: bool) -> tuple[tf.Tensor, tf.Variable]:
    """The encoder's output [batch*seq, hidden] and the word-embedding table."""
    b, s, h = p["batch_size"], p["seq_length"], p["hidden_size"]
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.02)
    with tf.compat.v1.variable_scope("embeddings"):
        table = tf.compat.v1.get_variable("word_embeddings", [p["vocab_size"], h], initializer=init)
        positions = tf.compat.v1.get_variable("position_embeddings", [512, h], initializer=init)
        x = tf.gather(table, input_ids) + tf.slice(positions, [0, 0], [s, -1])[None]
        x = tf.keras.layers.LayerNormalization(epsilon=1e-12, name="layer_norm")(tf.reshape(x, [b * s, h]))
    mask = tf.cast(tf.not_equal(input_ids, 0), tf.float32)
    mask_bias = (1.0 - mask[:, None, None, :]) * -10000.0
    for layer in range(p["num_layers"]):
        with tf.compat.v1.variable_scope(f"layer_{layer}"):
            with tf.compat.v1.variable_scope("attention"):
                attended = _attention(x, mask_bias, p, training)
                if training:
                    attended = tf.nn.dropout(attended, rate=p["dropout_rate"])
                x = tf.keras.layers.LayerNormalization(epsilon=1e-12, name="layer_norm")(x + attended)
            with tf.compat.v1.variable_scope("ffn"):
                inner = tf.compat.v1.layers.dense(x, p["intermediate_size"], name="intermediate",
                                                  activation=lambda t: tf.nn.gelu(t, approximate=True))
                out = tf.compat.v1.layers.dense(inner, h, name="output")
                x = tf.keras.layers.LayerNormalization(epsilon=1e-12, name="layer_norm")(x + out)
    return x, table


def _masked_lm_loss(sequence: tf.Tensor, table: tf.Variable, labels: tf.Tensor,
                    p: dict[str, Any]) -> tuple[tf.Tensor, tf.Tensor]:
    """Mean cross entropy of the masked positions' predictions (output embeddings tied to the input's); and logits."""
    b, s, k = p["batch_size"], p["seq_length"], p["max_predictions"]
    positions, targets = labels[:, 0, :], labels[:, 1, :]
    flat_positions = tf.reshape(positions + tf.range(b)[:, None] * s, [-1])
    gathered = tf.gather(sequence, flat_positions)
    with tf.compat.v1.variable_scope("cls"):
        transformed = tf.compat.v1.layers.dense(gathered, p["hidden_size"], activation=tf.nn.gelu, name="transform")
        bias = tf.compat.v1.get_variable("output_bias", [p["vocab_size"]], initializer=tf.zeros_initializer())
        logits = tf.matmul(transformed, table, transpose_b=True) + bias
    log_probs = tf.nn.log_softmax(logits)
    onehot = tf.one_hot(tf.reshape(targets, [b * k]), p["vocab_size"])
    return -tf.reduce_mean(tf.reduce_sum(log_probs * onehot, axis=-1)), logits


def _learning_rate(p: dict[str, Any]) -> tf.Tensor:
    """Linear warm-up then polynomial (linear) decay, from the global step."""
    step = tf.compat.v1.train.get_global_step()
    decayed = tf.compat.v1.train.polynomial_decay(p["learning_rate"], step, p["train_steps"], 0.0, power=1.0)
    step_f = tf.cast(step, tf.float32)
    warmup = p["learning_rate"] * step_f / float(p["warmup_steps"])
    return tf.where(step_f < float(p["warmup_steps"]), warmup, decayed)


def _adam_weight_decay(loss: tf.Tensor, p: dict[str, Any]) -> tf.Operation:
    """BERT's AdamWeightDecayOptimizer update, with raw ops and global-norm clipping."""
    lr = _learning_rate(p)
    params = tf.compat.v1.trainable_variables()
    grads = tf.gradients(loss, params)
    grads, _ = tf.clip_by_global_norm(grads, clip_norm=1.0)
    beta1, beta2, eps = 0.9, 0.999, 1e-6
    assignments = []
    for grad, param in zip(grads, params):
        name = param.name.split(":")[0]
        m = tf.compat.v1.get_variable(name + "/adam_m", param.shape, tf.float32, trainable=False,
                                      initializer=tf.zeros_initializer())
        v = tf.compat.v1.get_variable(name + "/adam_v", param.shape, tf.float32, trainable=False,
                                      initializer=tf.zeros_initializer())
        next_m = beta1 * m + (1.0 - beta1) * grad
        next_v = beta2 * v + (1.0 - beta2) * tf.square(grad)
        update = next_m / (tf.sqrt(next_v) + eps)
        if not any(part in name for part in ("layer_norm", "bias")):
            update += p["weight_decay"] * param
        assignments += [param.assign(param - lr * update), m.assign(next_m), v.assign(next_v)]
    step = tf.compat.v1.train.get_global_step()
    with tf.control_dependencies(assignments):
        return tf.compat.v1.assign_add(step, 1)


def model_fn(features: tf.Tensor, labels: tf.Tensor, mode: str, params: dict[str, Any]) -> CSEstimatorSpec:
    p = {**DEFAULT_PARAMS, **params}
    training = mode == ModeKeys.TRAIN
    sequence, table = _encoder(features, p, training)
    if mode == ModeKeys.PREDICT:
        output = tf.reshape(sequence, [p["batch_size"], p["seq_length"], -1])
        return CSEstimatorSpec(mode, predictions={"sequence_output": output})
    loss, logits = _masked_lm_loss(sequence, table, labels, p)
    train_op = _adam_weight_decay(loss, p) if training else None
    host_call = (_metrics, [tf.reshape(labels[:, 1, :], [-1]), tf.argmax(logits, axis=-1, output_type=tf.int32)])
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op, host_call=host_call)


def _metrics(targets: tf.Tensor, predicted: tf.Tensor) -> dict[str, Any]:
    return {"masked_lm_accuracy": tf.compat.v1.metrics.accuracy(targets, predicted)}
