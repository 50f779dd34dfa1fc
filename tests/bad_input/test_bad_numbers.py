"""Issue 16, class 4: bad numbers. A label out of range for sparse softmax, or an id out of range for an
embedding lookup or a gather (issue 24 item 7), raises what TF's CPU kernel raises (InvalidArgumentError, its
message, the op and the user's line); a NaN loss, or steps that keep overflowing at the minimum loss scale, stop
the run with the Estimator's NaN-loss error (NanLossDuringTrainingError, "NaN loss during training.").

These are found while the run executes, so the run has started: like TF, which writes graph.pbtxt and event
files before the first step, the compile artifact and the event file exist by then. What must not happen is a
checkpoint of the bad step: no checkpoint is written, and one already in model_dir is left byte for byte."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
import tensorflow as tf
from bad_input_helpers import (
    BATCH,
    CLASSES,
    LABELS,
    X,
    Y,
    checkpoint_files,
    classification_input_fn,
    classifier,
    estimator,
    regression_input_fn,
)

import cerebras_tf
from cerebras_tf import CerebrasEstimator, CSEstimatorSpec, CSRunConfig, amp
from cerebras_tf.run.divergence import OVERFLOW_STEPS_AT_MIN_SCALE, NanLossError
from estimator import ModeKeys

NanLossDuringTrainingError = tf.compat.v1.train.NanLossDuringTrainingError


def stopped(action: Callable[[], Any], error_type: type[BaseException], *fragments: str,
            model_dir: str) -> BaseException:
    """action() raises `error_type` holding every fragment, and model_dir's checkpoints are as they were."""
    before = checkpoint_files(model_dir) or {}
    with pytest.raises(error_type) as info:
        action()
    message = str(info.value)
    missing = [fragment for fragment in fragments if fragment not in message]
    assert not missing, f"{missing} not in the message:\n{message}"
    assert (checkpoint_files(model_dir) or {}) == before, "a checkpoint was written"
    return info.value


def _with(x: np.ndarray, row: int, value: float) -> np.ndarray:
    changed = x.copy()
    changed[row] = value
    return changed


# --------------------------------------------------------------------------- labels out of range


@pytest.mark.parametrize("bad, reported", [(3, 3), (7, 7), (-2, -2)])
def test_a_label_out_of_range_raises_what_tf_raises(model_dir, tmp_path, bad, reported):
    labels = LABELS.copy()
    labels[1] = bad
    est = estimator(model_dir, classifier())
    error = stopped(lambda: est.train(classification_input_fn(labels), max_steps=3), tf.errors.InvalidArgumentError,
                    f"Received a label value of {reported} which is outside the valid range of [0, 3).  Label values: "
                    f"{' '.join(map(str, labels[:BATCH]))}", "sparse_softmax_cross_entropy_loss/xentropy/xentropy",
                    "bad_input_helpers.py", model_dir=model_dir)
    cpu = CerebrasEstimator(classifier(), model_dir=str(tmp_path / "cpu"), config=CSRunConfig(),
                            params={"batch_size": BATCH})
    with pytest.raises(tf.errors.InvalidArgumentError) as on_cpu:
        cpu.train(classification_input_fn(labels), max_steps=3)
    assert str(error).split("\n")[0] in on_cpu.value.message  # TF's own words


def test_a_label_out_of_range_in_evaluation_raises_too(model_dir):
    estimator(model_dir, classifier()).train(classification_input_fn(), max_steps=1)
    cerebras_tf.release_system()
    labels = LABELS.copy()
    labels[5] = 3
    est = estimator(model_dir, classifier())
    stopped(lambda: est.evaluate(classification_input_fn(labels), steps=3, use_cs=True),
            tf.errors.InvalidArgumentError, "Received a label value of 3 which is outside the valid range of [0, 3)",
            model_dir=model_dir)


# --------------------------------------------------------------------------- ids out of range

VOCAB = 6
IDS = np.random.default_rng(1).integers(0, VOCAB, size=(12, 3)).astype(np.int32)
LOOKUP_LINE: dict[str, int] = {}


def _embedding_regressor(lookup: str) -> Callable:
    """Mean of embedding rows -> dense: `variable` looks up the variable (ResourceGather), `tensor` gathers from
    its value (ReadVariableOp + GatherV2); SGD adds the gradient's rows back (ResourceScatterAdd)."""

    def model_fn(features, labels, mode, params):
        table = tf.compat.v1.get_variable("embedding", [VOCAB, 4], initializer=tf.compat.v1.ones_initializer())
        if lookup == "variable":
            rows = tf.nn.embedding_lookup(table, features, name="lookup")  # LOOKUP variable
        else:
            rows = tf.gather(tf.convert_to_tensor(table), features, name="lookup")  # LOOKUP tensor
        predictions = tf.compat.v1.layers.dense(tf.reduce_mean(rows, axis=1), 1, name="output")
        loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(
            loss, global_step=tf.compat.v1.train.get_global_step())
        return CSEstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


def _lookup_line(lookup: str) -> int:
    if not LOOKUP_LINE:
        with open(__file__) as source:
            for number, line in enumerate(source, 1):
                if "# LOOKUP " in line and "if " not in line:
                    LOOKUP_LINE[line.rsplit("# LOOKUP ", 1)[1].strip()] = number
    return LOOKUP_LINE[lookup]


@pytest.mark.parametrize("lookup", ["variable", "tensor"])
@pytest.mark.parametrize("bad", [VOCAB, 40, -1])
def test_an_id_out_of_range_raises_what_tf_raises_naming_the_lookup(model_dir, tmp_path, lookup, bad):
    ids = IDS.copy()
    ids[2, 1] = bad
    est = estimator(model_dir, _embedding_regressor(lookup))
    message = f"indices[2,1] = {bad} is not in [0, {VOCAB})"
    error = stopped(lambda: est.train(regression_input_fn(ids, Y), max_steps=3), tf.errors.InvalidArgumentError,
                    message, "{{node lookup}}", f"test_bad_numbers.py:{_lookup_line(lookup)}", model_dir=model_dir)
    assert str(error).startswith(message)
    cpu = CerebrasEstimator(_embedding_regressor(lookup), model_dir=str(tmp_path / "cpu"), config=CSRunConfig(),
                            params={"batch_size": BATCH})
    with pytest.raises(tf.errors.InvalidArgumentError) as on_cpu:
        cpu.train(regression_input_fn(ids, Y), max_steps=3)
    assert f"{message}\n\t [[{{{{node lookup}}}}]]" in on_cpu.value.message  # TF's own words, the same node


def test_an_id_out_of_range_after_a_checkpoint_keeps_that_checkpoint(model_dir):
    """The bad id is in the third batch: steps 1-2 train and are saved; step 3 stops the run, saving nothing."""
    est = estimator(model_dir, _embedding_regressor("variable"))
    est.train(regression_input_fn(IDS[:8], Y[:8]), max_steps=2)
    cerebras_tf.release_system()
    ids = IDS.copy()
    ids[9, 0] = -3  # batch 3 (rows 8-11), row 1
    stopped(lambda: estimator(model_dir, _embedding_regressor("variable")).train(
        regression_input_fn(ids, Y), max_steps=5), tf.errors.InvalidArgumentError,
        f"indices[1,0] = -3 is not in [0, {VOCAB})", model_dir=model_dir)
    assert "./model.ckpt-2.index" in (checkpoint_files(model_dir) or {})


# --------------------------------------------------------------------------- ids out of range in a tf.cond branch
# Both branches of a tf.cond run on the system (a select picks the result); a look-up refuses a bad id only in the
# branch TF takes. The guards below test only the ids' upper end, so a negative id takes the look-up's branch.

TABLE = np.random.default_rng(2).normal(size=(VOCAB, 4)).astype(np.float32)


def _guarded_lookup_regressor(lookup: str, nested: bool = False, high: int = VOCAB) -> Callable:
    """The rows of a (frozen) embedding table, looked up only when every id is below `high` (else zeros); nested:
    and, around that, only when every id is >= 0. A trainable dense layer on top."""

    def model_fn(features, labels, mode, params):
        table = tf.compat.v1.get_variable("embedding", [VOCAB, 4], trainable=False,
                                          initializer=tf.compat.v1.constant_initializer(TABLE))
        zeros = tf.zeros(features.shape.as_list() + [4])

        def look_up():
            if lookup == "variable":
                return tf.nn.embedding_lookup(table, features, name="lookup")
            return tf.gather(tf.convert_to_tensor(table), features, name="lookup")

        def below():
            return tf.cond(tf.reduce_all(features < high), look_up, lambda: zeros)  # COND inner

        rows = tf.cond(tf.reduce_all(features >= 0), below, lambda: zeros) if nested else below()  # COND outer
        predictions = tf.compat.v1.layers.dense(tf.reduce_mean(rows, axis=1), 1, name="output",
                                                kernel_initializer=tf.compat.v1.constant_initializer(0.5))
        loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
        train_op = None
        if mode == ModeKeys.TRAIN:
            train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
                loss, global_step=tf.compat.v1.train.get_global_step())
        return CSEstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


def _cond_line(which: str) -> int:
    """The line of the inner or outer tf.cond: what an error in a branch names (a branch's ops have no source
    lines of their own in the captured graph)."""
    with open(__file__) as source:
        return next(number for number, line in enumerate(source, 1) if line.rstrip().endswith(f"# COND {which}"))


def _with_id(bad: int) -> np.ndarray:
    ids = IDS.copy()
    ids[6, 1] = bad  # batch 2 (rows 4-7), row 2
    return ids


@pytest.mark.parametrize("lookup", ["variable", "tensor"])
@pytest.mark.parametrize("nested, bad", [(False, 40), (True, 40), (True, -1)])
def test_a_bad_id_in_the_branch_not_taken_trains_and_evaluates_as_on_cpu(model_dir, tmp_path, float32_numerics,
                                                                          lookup, nested, bad):
    """(40: the ids' guard fails, the zeros are taken. -1 with nested guards: the outer one fails, so the inner
    cond, whose own guard holds, does not run at all.)"""
    data = regression_input_fn(_with_id(bad), Y)
    system = estimator(model_dir, _guarded_lookup_regressor(lookup, nested))
    cpu = CerebrasEstimator(_guarded_lookup_regressor(lookup, nested), model_dir=str(tmp_path / "cpu"),
                            config=CSRunConfig(), params={"batch_size": BATCH})
    system.train(data, max_steps=6)
    cpu.train(data, max_steps=6)
    for name in ("output/kernel", "output/bias", "global_step"):
        np.testing.assert_allclose(system.get_variable_value(name), cpu.get_variable_value(name), rtol=1e-5,
                                   err_msg=name)
    cerebras_tf.release_system()
    on_system = system.evaluate(data, steps=3, use_cs=True)
    on_cpu = cpu.evaluate(data, steps=3)
    np.testing.assert_allclose(on_system["loss"], on_cpu["loss"], rtol=1e-5)


@pytest.mark.parametrize("lookup", ["variable", "tensor"])
@pytest.mark.parametrize("nested, high, bad", [(False, VOCAB, -1), (True, VOCAB + 100, 40)])
def test_a_bad_id_in_the_branch_taken_raises_what_tf_raises(model_dir, tmp_path, lookup, nested, high, bad):
    """(-1 passes the guard `ids < 6`; 40 passes both nested guards when the inner one is `ids < 106`.)"""
    data = regression_input_fn(_with_id(bad), Y)
    est = estimator(model_dir, _guarded_lookup_regressor(lookup, nested, high))
    message = f"indices[2,1] = {bad} is not in [0, {VOCAB})"
    error = stopped(lambda: est.train(data, max_steps=6), tf.errors.InvalidArgumentError, message,
                    "{{node cond/cond/lookup" if nested else "{{node cond/lookup",
                    f"test_bad_numbers.py:{_cond_line('outer' if nested else 'inner')}", model_dir=model_dir)
    assert str(error).startswith(message)
    assert "./model.ckpt-1.index" not in (checkpoint_files(model_dir) or {})  # batch 2: stopped at step 2
    cpu = CerebrasEstimator(_guarded_lookup_regressor(lookup, nested, high), model_dir=str(tmp_path / "cpu"),
                            config=CSRunConfig(), params={"batch_size": BATCH})
    with pytest.raises(tf.errors.InvalidArgumentError) as on_cpu:
        cpu.train(data, max_steps=6)
    assert message in on_cpu.value.message  # TF's own words


def test_a_bad_label_in_the_branch_not_taken_evaluates_as_on_cpu(model_dir, float32_numerics):
    """Sparse softmax's label check is guarded the same way: a loss computed only when every label is valid."""

    def model_fn(features, labels, mode, params):
        logits = tf.compat.v1.layers.dense(features, CLASSES, name="logits",
                                           kernel_initializer=tf.compat.v1.constant_initializer(0.5))
        plain = tf.compat.v1.losses.sparse_softmax_cross_entropy(tf.clip_by_value(labels, 0, CLASSES - 1), logits)
        if mode == ModeKeys.TRAIN:
            return CSEstimatorSpec(mode, loss=plain, train_op=tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
                plain, global_step=tf.compat.v1.train.get_global_step()))
        valid = tf.reduce_all((labels >= 0) & (labels < CLASSES))
        loss = tf.cond(valid, lambda: tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits),
                       lambda: tf.constant(0.0))
        return CSEstimatorSpec(mode, loss=loss)

    estimator(model_dir, model_fn).train(classification_input_fn(), max_steps=2)
    cerebras_tf.release_system()
    labels = LABELS.copy()
    labels[5] = 7  # batch 2
    cpu = CerebrasEstimator(model_fn, model_dir=model_dir, config=CSRunConfig(), params={"batch_size": BATCH})
    on_cpu = cpu.evaluate(classification_input_fn(labels), steps=3)
    on_system = estimator(model_dir, model_fn).evaluate(classification_input_fn(labels), steps=3, use_cs=True)
    np.testing.assert_allclose(on_system["loss"], on_cpu["loss"], rtol=1e-5)


# --------------------------------------------------------------------------- NaN loss


NAN_BATCHES = {
    "NaN features": lambda: regression_input_fn(_with(X, 2, np.nan), Y),
    "NaN label": lambda: regression_input_fn(X, _with(Y, 0, np.nan)),
    "Inf features": lambda: regression_input_fn(_with(X, 1, np.inf), Y),
}


@pytest.mark.parametrize("data", list(NAN_BATCHES))
def test_a_nan_loss_stops_training_with_the_estimators_error(model_dir, data):
    est = estimator(model_dir)
    error = stopped(lambda: est.train(NAN_BATCHES[data](), max_steps=5), NanLossError,
                    "NaN loss during training. The loss was NaN at global step 1", "the batch holds NaN or Inf",
                    "nothing after global step 0 was saved", model_dir=model_dir)
    assert isinstance(error, NanLossDuringTrainingError) and isinstance(error, cerebras_tf.CerebrasError)


def test_a_nan_loss_after_a_checkpoint_keeps_that_checkpoint(prior_checkpoint):
    data = regression_input_fn(_with(X, 2, np.nan), Y)
    stopped(lambda: estimator(prior_checkpoint).train(data, max_steps=6), NanLossError,
            "The loss was NaN at global step 3", "nothing after global step 2 was saved", model_dir=prior_checkpoint)


def test_the_cpu_estimator_raises_the_same_error_type(tmp_path):
    """(A NaN label: with NaN features, TF's oneDNN fused MatMul+ReLU on CPU turns NaN into 0, so the CPU loss
    stays finite while the weights become NaN; the simulated WSE computes ReLU(NaN) = NaN and stops.)"""
    cpu = CerebrasEstimator(estimator(str(tmp_path)).user_model_fn, model_dir=str(tmp_path / "cpu"),
                            config=CSRunConfig(), params={"batch_size": BATCH})
    with pytest.raises(NanLossDuringTrainingError, match="NaN loss during training."):
        cpu.train(NAN_BATCHES["NaN label"](), max_steps=2)


# --------------------------------------------------------------------------- overflowing at the minimum scale

# Labels near float32's max: the loss is +inf (not NaN) and the unscaled gradients overflow at any scale.
HUGE = np.full_like(Y, 3e38)


@pytest.fixture
def float32_half():
    previous = amp.get_half_dtype()
    amp.set_half_dtype("float32")
    yield
    amp.set_half_dtype(previous)


@pytest.mark.parametrize("scaler, scale_text, last_step", [
    (None, "the minimum loss scale 6.10352e-05", 29 + OVERFLOW_STEPS_AT_MIN_SCALE),  # default: 2**15 halves to 2**-14
    (amp.GradScaler("dynamic", init_scale=2.0 ** -14), "the minimum loss scale", OVERFLOW_STEPS_AT_MIN_SCALE),
    (amp.GradScaler(128.0), "the static loss scale 128", OVERFLOW_STEPS_AT_MIN_SCALE),
])
def test_steps_that_keep_overflowing_at_the_minimum_scale_stop_the_run(model_dir, float32_half, scaler, scale_text,
                                                                       last_step):
    est = estimator(model_dir, None if scaler is None else _regressor_with(scaler))
    stopped(lambda: est.train(regression_input_fn(X, HUGE), max_steps=100), NanLossError,
            "NaN loss during training.", f"not finite on {OVERFLOW_STEPS_AT_MIN_SCALE} consecutive steps",
            f"up to global step {last_step}, loss inf", scale_text, model_dir=model_dir)


def _regressor_with(scaler: amp.GradScaler) -> Callable:
    def model_fn(features, labels, mode, params):
        predictions = tf.compat.v1.layers.dense(features, 1, name="output")
        loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
        train_op = amp.optimizer_step(loss, tf.compat.v1.train.GradientDescentOptimizer(0.01), scaler)
        return cerebras_tf.CSEstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


def test_an_ordinary_overflow_is_still_skipped_in_silence(model_dir):
    """float16 activations past 65504 on one batch: the step is skipped, the scale lowered, training goes on."""
    previous = amp.get_half_dtype()
    amp.set_half_dtype("float16")
    try:
        est = estimator(model_dir)
        est.train(regression_input_fn(_with(X, 0, 6e4), Y), max_steps=6)
    finally:
        amp.set_half_dtype(previous)
    assert "./model.ckpt-6.index" in (checkpoint_files(model_dir) or {})
