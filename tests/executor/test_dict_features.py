"""Dict features, as every Model Zoo transformer feeds them, through compile, train, evaluate and predict
on the simulated WSE: a tiny BERT-like model (seq 8, hidden 16, vocab 32, batch 4) written for this test."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from estimator import ModeKeys
import cerebras_tf
import estimator as estimator_api
from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig, set_default_tf_config
from cerebras_tf.run import chief
from cerebras_tf import ir
from benchmarks.summaries import read_scalars
from cerebras_tf.wse.executor import Executor

SEQ, HIDDEN, VOCAB, BATCH, MAX_PREDICTIONS = 8, 16, 32, 4, 3
NUM_EXAMPLES = 32
CS_IP = "localhost:9000"
FEATURE_KEYS = ["example_id", "input_ids", "input_mask", "masked_lm_ids", "masked_lm_positions",
                "masked_lm_weights", "segment_ids"]


def _examples() -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.RandomState(7)
    lengths = rng.randint(4, SEQ + 1, size=NUM_EXAMPLES)
    input_mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
    positions = np.stack([np.sort(rng.choice(n, MAX_PREDICTIONS, replace=False)) for n in lengths]).astype(np.int32)
    weights = np.ones((NUM_EXAMPLES, MAX_PREDICTIONS), np.float32)
    weights[::3, -1] = 0.0  # padded prediction slots
    features = {
        "input_ids": (rng.randint(1, VOCAB, size=(NUM_EXAMPLES, SEQ)) * input_mask).astype(np.int32),
        "input_mask": input_mask,
        "segment_ids": ((np.arange(SEQ)[None, :] >= lengths[:, None] // 2) * input_mask).astype(np.int32),
        "masked_lm_positions": positions,
        "masked_lm_ids": rng.randint(1, VOCAB, size=(NUM_EXAMPLES, MAX_PREDICTIONS)).astype(np.int32),
        "masked_lm_weights": weights,
        "example_id": np.arange(NUM_EXAMPLES, dtype=np.int32),  # the model never reads it
    }
    labels = rng.randint(0, 2, size=NUM_EXAMPLES).astype(np.int32)  # next-sentence labels
    return features, labels


FEATURES, LABELS = _examples()


def _labels(params):
    return {"next_sentence_labels": LABELS} if params.get("dict_labels") else LABELS


def train_input_fn(params, input_context=None):  # the Model Zoo's signature
    ds = tf.data.Dataset.from_tensor_slices((FEATURES, _labels(params)))
    return ds.shuffle(NUM_EXAMPLES).repeat().batch(BATCH, drop_remainder=True)


def eval_input_fn(params, input_context=None):  # in order, so the system and CPU see the same batches
    ds = tf.data.Dataset.from_tensor_slices((FEATURES, _labels(params)))
    return ds.batch(BATCH, drop_remainder=True)


def predict_input_fn(params, input_context=None):  # a dict alone: features, labels None
    return tf.data.Dataset.from_tensor_slices(FEATURES).batch(BATCH, drop_remainder=True)


def model_fn(features, labels, mode, params):
    """Token + segment embeddings, one dense encoder layer, a masked-LM head tied to the embeddings that gathers
    the masked positions (tf.gather(batch_dims=1)) weighted by masked_lm_weights, and a next-sentence head."""
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.2)
    word = tf.compat.v1.get_variable("embeddings/word", [VOCAB, HIDDEN], initializer=init)
    segment = tf.compat.v1.get_variable("embeddings/segment", [2, HIDDEN], initializer=init)
    mask = tf.cast(features["input_mask"], tf.float32)
    x = tf.nn.embedding_lookup(word, features["input_ids"]) + tf.gather(segment, features["segment_ids"])
    x = x * mask[:, :, None]
    sequence = tf.compat.v1.layers.dense(x, HIDDEN, activation=tf.nn.relu, kernel_initializer=init, name="encoder")

    masked = tf.gather(sequence, features["masked_lm_positions"], batch_dims=1)  # [B, P, H]
    masked = tf.compat.v1.layers.dense(masked, HIDDEN, activation=tf.tanh, kernel_initializer=init, name="mlm")
    mlm_bias = tf.compat.v1.get_variable("mlm/output_bias", [VOCAB], initializer=tf.compat.v1.zeros_initializer())
    mlm_logits = tf.matmul(tf.reshape(masked, [-1, HIDDEN]), word, transpose_b=True) + mlm_bias  # [B*P, V]

    pooled = tf.compat.v1.layers.dense(sequence[:, 0], HIDDEN, activation=tf.tanh, kernel_initializer=init,
                                       name="pooler")
    nsp_logits = tf.compat.v1.layers.dense(pooled, 2, kernel_initializer=init, name="nsp")
    if mode == ModeKeys.PREDICT:
        return CSEstimatorSpec(mode, predictions={
            "masked_lm_predictions": tf.reshape(tf.argmax(mlm_logits, axis=-1, output_type=tf.int32),
                                                [-1, MAX_PREDICTIONS]),
            "next_sentence_probabilities": tf.nn.softmax(nsp_logits)})

    weights = tf.reshape(features["masked_lm_weights"], [-1])
    per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.reshape(features["masked_lm_ids"], [-1]), logits=mlm_logits)
    mlm_loss = tf.reduce_sum(per_token * weights) / (tf.reduce_sum(weights) + 1e-5)
    next_sentence = labels["next_sentence_labels"] if isinstance(labels, dict) else labels
    nsp_loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(next_sentence, nsp_logits)
    loss = mlm_loss + nsp_loss
    train_op = None
    if mode == ModeKeys.TRAIN:
        optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
        # Dense embedding gradients: the CS system has no kernel for the sparse update's tf.unique.
        grads = [(tf.convert_to_tensor(g), v) for g, v in optimizer.compute_gradients(loss)]
        train_op = optimizer.apply_gradients(grads, global_step=tf.compat.v1.train.get_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


@pytest.fixture(autouse=True)
def _tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    set_default_tf_config()


def _estimator(model_dir, params=None, compile_dir=None, **config):
    config.setdefault("save_checkpoints_steps", 100)
    config.setdefault("tf_random_seed", 1)
    return CerebrasEstimator(model_fn, model_dir=str(model_dir), compile_dir=compile_dir, params=dict(params or {}),
                             config=CSRunConfig(cs_ip=CS_IP, **config))


def test_validate_only_and_a_full_compile_list_one_program_input_per_dict_entry(tmp_path):
    estimator = _estimator(tmp_path / "model", compile_dir=str(tmp_path / "compile"))
    expected = {f"features/{key}" for key in FEATURE_KEYS} | {"labels"}
    checked = estimator.compile(train_input_fn, validate_only=True)
    assert set(checked.program.inputs) == expected
    compiled = estimator.compile(train_input_fn)
    assert set(compiled.program.inputs) == expected
    ids = compiled.program.tensors[compiled.program.inputs["features/input_ids"]]
    assert (ids.shape, ids.dtype) == ([BATCH, SEQ], "int32")
    assert "features/masked_lm_positions" in compiled.report
    assert estimator.compile(train_input_fn).reused  # the graph hash is stable over dict inputs
    # The densified embedding gradients' int32 indices are not gradients: loss scaling must leave them alone.
    assert {compiled.program.tensors[t].dtype for t in compiled.program.gradients} == {"float32"}


def test_train_evaluate_and_predict_on_the_system_with_dict_features(tmp_path, float32_numerics, monkeypatch):
    counted = []
    original = chief.TrainingSummaries.step_done
    monkeypatch.setattr(chief.TrainingSummaries, "step_done",
                        lambda self, batch_size: (counted.append(batch_size), original(self, batch_size))[1])
    estimator = _estimator(tmp_path)
    estimator.train(train_input_fn, max_steps=12)
    assert estimator.get_variable_value("global_step") == 12
    assert counted == [BATCH] * 12  # samples per step: the batch dimension, not the number of dict entries

    cerebras_tf.release_system()  # a new process, as on the real system (the fabric is programmed once)
    on_system = estimator.evaluate(eval_input_fn, steps=NUM_EXAMPLES // BATCH, use_cs=True)
    on_cpu = estimator.evaluate(eval_input_fn, steps=NUM_EXAMPLES // BATCH)
    assert on_system["global_step"] == on_cpu["global_step"] == 12
    assert on_system["loss"] == pytest.approx(on_cpu["loss"], rel=1e-5, abs=1e-6)

    cerebras_tf.release_system()
    system_batches = list(estimator.predict(predict_input_fn, use_cs=True, yield_single_examples=False))
    cpu_batches = list(estimator.predict(predict_input_fn, yield_single_examples=False))
    assert len(system_batches) == len(cpu_batches) == NUM_EXAMPLES // BATCH
    for system, cpu in zip(system_batches, cpu_batches):
        assert system["masked_lm_predictions"].shape == (BATCH, MAX_PREDICTIONS)
        np.testing.assert_allclose(system["next_sentence_probabilities"], cpu["next_sentence_probabilities"],
                                   rtol=1e-5, atol=1e-6)


def test_two_embedded_input_workers_stream_dict_features_and_dict_labels(tmp_path):
    params = {"dict_labels": True}
    # No graph seed: with two workers each must shuffle differently.
    estimator = _estimator(tmp_path, params, num_input_workers=2, log_step_count_steps=5, tf_random_seed=None)
    estimator.train(train_input_fn, max_steps=10)
    assert estimator.get_variable_value("global_step") == 10
    shares = [read_scalars(str(tmp_path), f"input/worker_{i}_share")[10] for i in range(2)]
    assert sum(shares) == pytest.approx(1.0)  # both workers' streams were counted
    plain = estimator_api.Estimator(model_fn, model_dir=str(tmp_path), params=params)
    assert np.isfinite(plain.evaluate(eval_input_fn, steps=2)["loss"])


def _hand_built_program() -> ir.Program:
    """loss = sum(features["a"] + features["b"][0] * labels["y"]): three inputs, a batch of 2."""
    tensors = [
        ir.Tensor(0, [2, 3], "float32", "features/a"),
        ir.Tensor(1, [2, 3], "float32", "features/b/0"),
        ir.Tensor(2, [2, 3], "float32", "labels/y"),
        ir.Tensor(3, [2, 3], "float32", "mul"),
        ir.Tensor(4, [2, 3], "float32", "add"),
        ir.Tensor(5, [], "float32", "loss"),
    ]
    kernels = [
        ir.Kernel(0, "mul", [1, 2], [3], {}),
        ir.Kernel(1, "add", [0, 3], [4], {}),
        ir.Kernel(2, "sum", [4], [5], {"keep_dims": False, "axis": [0, 1]}),
    ]
    return ir.Program(mode="eval", tensors=tensors, kernels=kernels, variables=[],
                      inputs={"features/a": 0, "features/b/0": 1, "labels/y": 2}, outputs={"loss": 5})


def test_the_executor_binds_nests_by_key_and_names_what_is_missing_or_misshapen():
    a, b, y = np.ones((2, 3)), np.full((2, 3), 2.0), np.full((2, 3), 3.0)
    executor = Executor(_hand_built_program(), {})
    result = executor.step({"a": a, "b": (b,), "unused": np.zeros(5)}, {"y": y})  # unread leaves are fine
    assert result.loss == pytest.approx(6 * (1 + 2 * 3))
    with pytest.raises(ValueError, match=r"needs labels/y \(shape \[2, 3\]\), but the batch has labels/z"):
        executor.step({"a": a, "b": (b,)}, {"z": y})
    with pytest.raises(ValueError, match=r"needs labels/y .* but the batch has no labels"):
        executor.step({"a": a, "b": (b,)})
    with pytest.raises(ValueError, match=r"needs features/b/0 .* the batch has features/a, features/b"):
        executor.step({"a": a, "b": b}, {"y": y})
    with pytest.raises(ValueError, match=r"features/a has shape \[3, 3\], the compiled program expects \[2, 3\]"):
        executor.step({"a": np.ones((3, 3)), "b": (b,)}, {"y": y})


def _model_fn_replacing_a_feature(features, labels, mode, params):
    """As the Model Zoo's BERT does in EVAL: a features entry replaced in place (input_mask cast), and the dict
    handed to host_call."""
    spec = model_fn(features, labels, mode, params)  # reads the input input_mask
    if mode != ModeKeys.EVAL:
        return spec
    features["input_mask"] = tf.cast(features["input_mask"], tf.float16)

    def metrics(features):
        return {"eval/mask_mean": tf.compat.v1.metrics.mean(tf.cast(features["input_mask"], tf.float32))}

    return CSEstimatorSpec(mode, loss=spec.loss, host_call=(metrics, [features]))


def test_a_model_fn_that_replaces_a_features_entry_still_reads_the_inputs(tmp_path):
    """The program's inputs are the dataset's, as they were before model_fn replaced an entry (the replaced dict
    used to be compiled: the input it replaced was no program input, "Op type 'IteratorV2' has no kernel")."""
    estimator = CerebrasEstimator(_model_fn_replacing_a_feature, model_dir=str(tmp_path), params={},
                                  config=CSRunConfig(cs_ip=CS_IP, save_checkpoints_steps=100))
    compiled = estimator.compile(eval_input_fn, mode=ModeKeys.EVAL)
    assert {f"features/{key}" for key in FEATURE_KEYS} <= set(compiled.program.inputs)
    estimator.train(train_input_fn, max_steps=2, use_cs=False)
    metrics = estimator.evaluate(eval_input_fn, steps=2, use_cs=True)
    np.testing.assert_allclose(metrics["eval/mask_mean"], FEATURES["input_mask"][:2 * BATCH].mean(), rtol=1e-6)
