"""A tiny BERT-style pre-training model written the way the Cerebras Model Zoo's TF models are.

Written for this project's tests (not taken from the zoo); it uses each zoo construct the way the zoo
does, so that the CS-system path is tested on what its real clients feed it:

- `train_input_fn(params, input_context=None)`: the zoo's input-function signature;
- features a dict of dense tensors (input_ids, input_mask, segment_ids, masked_lm_positions,
  masked_lm_ids, masked_lm_weights); labels the next-sentence label, or None with `disable_nsp`;
- embedding lookups whose gradients are dense (a gather from the table's value, not the variable);
- a masked-LM head that gathers the masked positions out of the sequence output (flattened gather
  with per-example offsets) and an output layer tied to the embedding table;
- the learning rate as a `tf.case` over a list of schedules of `global_step` (warm-up, then decay);
- the optimizer wrapped in TF's loss-scale optimizer with the model's own dynamic loss scale
  (`loss_scaling`: "tf_dynamic" for TF's DynamicLossScale, "cs_dynamic" for a scale whose update is
  arithmetic on counters, as the zoo's CS-optimised one, None for no loss scaling), so the update sits
  under `tf.cond(all gradients finite)`;
- `tf.compat.v1.summary.scalar` summaries of the losses, the learning rate, the loss scale and the
  gradient norm;
- an EVAL `host_call` whose tensors are a nested list: a tuple of model outputs, the labels (None with
  `disable_nsp`) and the features dict.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from estimator import ModeKeys
from cerebras_tf import CSEstimatorSpec

DEFAULT_PARAMS: dict[str, Any] = {
    "batch_size": 4,
    "vocab_size": 32,
    "max_sequence_length": 8,
    "max_predictions_per_seq": 3,
    "hidden_size": 16,
    "disable_nsp": False,
    "num_examples": 64,
    "learning_rate": [
        {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 0.01, "steps": 4},
        {"scheduler": "Exponential", "initial_learning_rate": 0.01, "decay_steps": 10, "decay_rate": 0.5,
         "steps": 20},
        {"scheduler": "Constant", "learning_rate": 0.001},
    ],
    "loss_scaling": "tf_dynamic",
    "initial_loss_scale": 2.0 ** 10,
    "steps_per_increase": 5,
}


# ---------------------------------------------------------------------------------------------- input
def _synthetic_examples(params: dict[str, Any], seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Masked-LM examples in the zoo's feature format, generated (no downloads)."""
    rng = np.random.default_rng(seed)
    n, seq, preds, vocab = (params["num_examples"], params["max_sequence_length"],
                            params["max_predictions_per_seq"], params["vocab_size"])
    lengths = rng.integers(seq // 2, seq + 1, size=n)
    input_mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    input_ids = rng.integers(1, vocab, size=(n, seq)).astype(np.int32) * input_mask
    segment_ids = ((np.arange(seq)[None, :] >= (lengths // 2)[:, None]) * input_mask).astype(np.int32)
    positions = np.stack([np.sort(rng.choice(length, size=preds, replace=False)) for length in lengths])
    masked_lm_ids = np.take_along_axis(input_ids, positions, axis=1).astype(np.int32)
    weights = np.ones((n, preds), np.float32)
    weights[:, -1] = (lengths > seq * 3 // 4).astype(np.float32)  # some examples predict fewer tokens
    features = {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": masked_lm_ids,
        "masked_lm_weights": weights,
    }
    next_sentence_labels = (lengths % 2).astype(np.int32)
    return features, next_sentence_labels


def _dataset(params: dict[str, Any], seed: int, repeat: bool) -> tf.data.Dataset:
    features, labels = _synthetic_examples(params, seed)
    if params["disable_nsp"]:
        dataset = tf.data.Dataset.from_tensor_slices(features)
    else:
        dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    if repeat:
        dataset = dataset.repeat()
    return dataset.batch(params["batch_size"], drop_remainder=True)


def train_input_fn(params, input_context=None):
    """Training data: repeats forever, fixed batch size."""
    del input_context  # the zoo shards by it on GPU clusters; the CS system passes only params
    return _dataset(params, seed=0, repeat=True)


def eval_input_fn(params, input_context=None):
    """Evaluation data: one pass over other examples."""
    del input_context
    return _dataset(params, seed=1, repeat=False)


# ---------------------------------------------------------------------------------------------- model
def _dense(inputs: tf.Tensor, units: int, name: str) -> tf.Tensor:
    with tf.compat.v1.variable_scope(name):
        kernel = tf.compat.v1.get_variable(
            "kernel", [inputs.shape[-1], units],
            initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.2, seed=3))
        bias = tf.compat.v1.get_variable("bias", [units], initializer=tf.compat.v1.zeros_initializer())
    return tf.tensordot(inputs, kernel, axes=1) + bias


def _layer_norm(inputs: tf.Tensor, name: str) -> tf.Tensor:
    with tf.compat.v1.variable_scope(name):
        gamma = tf.compat.v1.get_variable("gamma", [inputs.shape[-1]], initializer=tf.compat.v1.ones_initializer())
        beta = tf.compat.v1.get_variable("beta", [inputs.shape[-1]], initializer=tf.compat.v1.zeros_initializer())
    mean, variance = tf.nn.moments(inputs, axes=[-1], keepdims=True)
    return (inputs - mean) * tf.math.rsqrt(variance + 1e-5) * gamma + beta


def _gather_positions(sequence: tf.Tensor, positions: tf.Tensor) -> tf.Tensor:
    """sequence [B, S, H] at positions [B, P] -> [B * P, H], through one flat gather with offsets."""
    batch, seq, hidden = sequence.shape.as_list()
    offsets = tf.reshape(tf.range(batch, dtype=tf.int32) * seq, [-1, 1])
    flat_positions = tf.reshape(positions + offsets, [-1])
    return tf.gather(tf.reshape(sequence, [batch * seq, hidden]), flat_positions)


def _schedule(schedule: dict[str, Any], step: tf.Tensor) -> tf.Tensor:
    kind = schedule["scheduler"]
    if kind == "Constant":
        return tf.constant(schedule["learning_rate"], tf.float32)
    if kind == "Linear":
        return tf.compat.v1.train.polynomial_decay(
            float(schedule["initial_learning_rate"]), step, schedule["steps"],
            end_learning_rate=schedule["end_learning_rate"], power=1.0)
    if kind == "Exponential":
        return tf.compat.v1.train.exponential_decay(
            schedule["initial_learning_rate"], step, schedule["decay_steps"], schedule["decay_rate"])
    raise ValueError(f"unknown scheduler {kind}")


def learning_rate(schedules: list[dict[str, Any]]) -> tf.Tensor:
    """A list of schedules run one after the other: a tf.case over global_step, the last the default."""
    global_step = tf.compat.v1.train.get_or_create_global_step()
    cases, boundary = [], 0
    for schedule in schedules[:-1]:
        start = boundary
        boundary += schedule["steps"]
        cases.append((tf.less(global_step, boundary),
                      lambda s=schedule, start=start: _schedule(s, global_step - start)))
    last_start = boundary
    return tf.case(cases, default=lambda: _schedule(schedules[-1], global_step - last_start))


class CountingDynamicLossScale(tf.compat.v1.mixed_precision.DynamicLossScale):
    """A dynamic loss scale whose update is plain arithmetic on counters (no tf.cond).

    Halves the scale on a step whose gradient norm is not finite, doubles it after `increment_period`
    finite steps in a row, and keeps it in [min_loss_scale, max_loss_scale].
    """

    def __init__(self, initial_loss_scale: float, increment_period: int, min_loss_scale: float = 1.0,
                 max_loss_scale: float = 2.0 ** 15) -> None:
        super().__init__(initial_loss_scale=initial_loss_scale, increment_period=increment_period, multiplier=2.0)
        self._finite_steps = self._add_weight(name="finite_steps", initial_value=0, dtype=tf.int64)
        self.min_loss_scale, self.max_loss_scale = min_loss_scale, max_loss_scale

    def update(self, grads):
        norm = tf.linalg.global_norm([g for g in grads if g is not None])
        finite = tf.math.is_finite(norm)
        finite_int = tf.cast(finite, tf.int64)
        steps = self._finite_steps.assign((self._finite_steps + 1) * finite_int)
        grow = tf.cast(steps >= self.increment_period, tf.int64)
        steps = self._finite_steps.assign(steps * (1 - grow))
        factor = tf.where(finite, 1.0 + tf.cast(grow, tf.float32), 0.5)
        scale = self._current_loss_scale.assign(
            tf.clip_by_value(self._current_loss_scale * factor, self.min_loss_scale, self.max_loss_scale))
        return tf.group(scale, steps), finite


def _optimizer(params: dict[str, Any], lr: tf.Tensor) -> tf.compat.v1.train.Optimizer:
    optimizer = tf.compat.v1.train.AdamOptimizer(lr, epsilon=1e-6)
    kind = params["loss_scaling"]
    if kind is None:
        return optimizer
    if kind == "tf_dynamic":
        loss_scale = tf.compat.v1.mixed_precision.DynamicLossScale(
            initial_loss_scale=params["initial_loss_scale"], increment_period=params["steps_per_increase"])
    elif kind == "cs_dynamic":
        loss_scale = CountingDynamicLossScale(params["initial_loss_scale"], params["steps_per_increase"])
    else:
        raise ValueError(f"unknown loss_scaling {kind}")
    tf.compat.v1.summary.scalar("train/loss_scale", loss_scale())
    return tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(optimizer, loss_scale)


def model_fn(features, labels, mode, params):
    """BERT-style masked-LM (+ next-sentence) pre-training, the zoo's way."""
    vocab, hidden = params["vocab_size"], params["hidden_size"]
    with tf.compat.v1.variable_scope("bert"):
        with tf.compat.v1.variable_scope("embeddings"):
            word_embeddings = tf.compat.v1.get_variable(
                "word_embeddings", [vocab, hidden],
                initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.2, seed=1))
            segment_embeddings = tf.compat.v1.get_variable(
                "segment_embeddings", [2, hidden],
                initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.2, seed=2))
            # Lookups in the tables' values, not in the variables: their gradients are dense (the zoo's
            # embedding layer does the same), so the optimizer's update needs no tf.unique.
            embedded = (tf.gather(1.0 * word_embeddings, features["input_ids"])
                        + tf.gather(1.0 * segment_embeddings, features["segment_ids"]))
            mask = tf.cast(features["input_mask"], tf.float32)[:, :, None]
            sequence = _layer_norm(embedded * mask, "LayerNorm")
        sequence = _layer_norm(sequence + tf.nn.gelu(_dense(sequence, hidden, "ffn")), "ffn_norm")

        with tf.compat.v1.variable_scope("cls/predictions"):
            masked = _gather_positions(sequence, features["masked_lm_positions"])
            transformed = _layer_norm(tf.nn.gelu(_dense(masked, hidden, "transform")), "transform_norm")
            output_bias = tf.compat.v1.get_variable("output_bias", [vocab],
                                                    initializer=tf.compat.v1.zeros_initializer())
            mlm_logits = tf.matmul(transformed, word_embeddings, transpose_b=True) + output_bias
        mlm_ids = tf.reshape(features["masked_lm_ids"], [-1])
        mlm_weights = tf.reshape(features["masked_lm_weights"], [-1])
        mlm_xentr = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=mlm_ids, logits=mlm_logits)
        mlm_loss = tf.reduce_sum(mlm_xentr * mlm_weights) / (tf.reduce_sum(mlm_weights) + 1e-5)
        total_loss = mlm_loss
        nsp_logits = None
        if not params["disable_nsp"]:
            with tf.compat.v1.variable_scope("cls/seq_relationship"):
                nsp_logits = _dense(sequence[:, 0, :], 2, "output")
            nsp_loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=nsp_logits))
            total_loss = mlm_loss + nsp_loss
            tf.compat.v1.summary.scalar("train/cost_cls", nsp_loss)

    tf.compat.v1.summary.scalar("train/cost", total_loss)
    tf.compat.v1.summary.scalar("train/cost_masked_lm", mlm_loss)

    train_op = host_call = None
    if mode == ModeKeys.TRAIN:
        lr = learning_rate(params["learning_rate"])
        tf.compat.v1.summary.scalar("train/lr", lr)
        optimizer = _optimizer(params, lr)
        grads_and_vars = optimizer.compute_gradients(total_loss)
        tf.compat.v1.summary.scalar("train/unclipped_grad_norm",
                                    tf.linalg.global_norm([g for g, _ in grads_and_vars]))
        train_op = optimizer.apply_gradients(grads_and_vars, tf.compat.v1.train.get_global_step())
    elif mode == ModeKeys.EVAL:
        mlm_pred = tf.argmax(mlm_logits, axis=-1, output_type=tf.int32)
        host_call = (eval_metrics, [(nsp_logits, mlm_pred, mlm_xentr), labels, features])
    return CSEstimatorSpec(mode=mode, loss=total_loss, train_op=train_op, host_call=host_call)


def eval_metrics(eval_inputs, labels, features):
    """The host's metrics over what the wafer streams back (the zoo's host_call signature)."""
    nsp_logits, mlm_pred, mlm_xentr = eval_inputs
    weights = tf.reshape(features["masked_lm_weights"], [-1])
    metrics = {
        "eval/accuracy_masked_lm": tf.compat.v1.metrics.accuracy(
            labels=tf.reshape(features["masked_lm_ids"], [-1]), predictions=tf.reshape(mlm_pred, [-1]),
            weights=weights),
        "eval/mlm_loss": tf.compat.v1.metrics.mean(mlm_xentr, weights=weights),
    }
    if labels is not None:
        metrics["eval/accuracy_cls"] = tf.compat.v1.metrics.accuracy(
            labels=labels, predictions=tf.argmax(nsp_logits, axis=-1, output_type=tf.int32))
    return metrics
