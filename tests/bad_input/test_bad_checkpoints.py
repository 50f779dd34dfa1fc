"""Issue 16, class 2: a checkpoint in model_dir from a changed model (the most common real mistake: layer sizes
edited, same model_dir). The checkpoint's variables are compared with the model's before anything is compiled
or written: a CheckpointMismatchError names every missing or reshaped variable with both shapes, at the line
that created it. Variables the checkpoint has and the model lacks are ignored, as TF ignores them. Issue 24,
item 1: a damaged checkpoint (truncated or corrupted) is named with its file and the newest intact one."""
from __future__ import annotations

import logging
import os

import pytest
import tensorflow as tf
from bad_input_helpers import checkpoint_files, estimator, refused, regression_input_fn, regressor

from cerebras_tf import CerebrasEstimator, CSRunConfig
from cerebras_tf.errors import CheckpointMismatchError
from estimator import WarmStartSettings

HELPERS = os.path.join(os.path.dirname(__file__), "bad_input_helpers.py")

CHANGED = {
    "wider hidden layer": (regressor(hidden=16), [
        "hidden/kernel: the model has float32[4,16], the checkpoint float32[4,8]",
        "hidden/bias: the model has float32[16], the checkpoint float32[8]",
        "output/kernel: the model has float32[16,1], the checkpoint float32[8,1]",
        "3 variable(s)"]),
    "narrower hidden layer": (regressor(hidden=4), [
        "hidden/kernel: the model has float32[4,4], the checkpoint float32[4,8]"]),
    "renamed layer": (regressor(hidden_name="dense_1"), [
        "dense_1/kernel: the model has float32[4,8], the checkpoint has no such variable",
        "dense_1/bias: the model has float32[8], the checkpoint has no such variable"]),
    "added layer": (regressor(extra_layer=True), [
        "extra/kernel: the model has float32[8,8], the checkpoint has no such variable",
        "extra/bias: the model has float32[8], the checkpoint has no such variable"]),
    "another optimizer": (regressor(optimizer="adam"), [
        "hidden/kernel/Adam: the model has float32[4,8], the checkpoint has no such variable",
        "beta1_power: the model has float32[], the checkpoint has no such variable"]),
    "another dtype": (regressor(dtype=tf.float64), [
        "hidden/kernel: the model has float64[4,8], the checkpoint float32[4,8]"]),
}


@pytest.mark.parametrize("change", list(CHANGED))
def test_training_a_changed_model_names_every_variable_that_does_not_fit(prior_checkpoint, change):
    model_fn, lines = CHANGED[change]
    est = estimator(prior_checkpoint, model_fn)
    error = refused(lambda: est.train(regression_input_fn(), max_steps=4), CheckpointMismatchError,
                    "model.ckpt-2 was written by a different model", *lines, f"Where: {HELPERS}:",
                    "(created at ", model_dir=prior_checkpoint)
    assert "new model_dir" in error.fix


@pytest.mark.parametrize("call", ["evaluate", "predict"])
def test_evaluating_or_predicting_with_a_changed_model_is_refused_too(prior_checkpoint, call):
    est = estimator(prior_checkpoint, regressor(hidden=16))
    action = {"evaluate": lambda: est.evaluate(regression_input_fn(), steps=1, use_cs=True),
              "predict": lambda: list(est.predict(regression_input_fn(), num_samples=2, use_cs=True))}[call]
    refused(action, CheckpointMismatchError, "hidden/kernel: the model has float32[4,16], the checkpoint float32[4,8]",
            model_dir=prior_checkpoint)


def test_a_checkpoint_path_that_is_not_a_checkpoint_is_refused(prior_checkpoint):
    est = estimator(prior_checkpoint)
    missing = os.path.join(prior_checkpoint, "model.ckpt-999")
    refused(lambda: est.evaluate(regression_input_fn(), steps=1, checkpoint_path=missing, use_cs=True),
            CheckpointMismatchError, f"The checkpoint {missing} cannot be read", model_dir=prior_checkpoint)


def test_a_damaged_checkpoint_is_refused_naming_it(prior_checkpoint):
    with open(os.path.join(prior_checkpoint, "model.ckpt-2.index"), "wb") as handle:
        handle.write(b"not a checkpoint index")
    est = estimator(prior_checkpoint)
    refused(lambda: est.train(regression_input_fn(), max_steps=4), CheckpointMismatchError,
            "model.ckpt-2 cannot be read", model_dir=prior_checkpoint)


def test_variables_only_the_checkpoint_has_are_ignored_as_tf_ignores_them(prior_checkpoint, caplog):
    """A checkpoint holding a layer the model no longer has (here extra/kernel, added to the prior checkpoint):
    training resumes, and says which checkpoint variables it ignores."""
    with tf.Graph().as_default():
        reader = tf.train.load_checkpoint(os.path.join(prior_checkpoint, "model.ckpt-2"))
        kept = {name: tf.compat.v1.Variable(reader.get_tensor(name), name=name)
                for name in reader.get_variable_to_shape_map()}
        kept["extra/kernel"] = tf.compat.v1.Variable(tf.zeros([8, 8]), name="extra/kernel")
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            tf.compat.v1.train.Saver(kept).save(session, os.path.join(prior_checkpoint, "model.ckpt"), global_step=2,
                              write_meta_graph=False)
    with caplog.at_level(logging.INFO, logger="tensorflow"):
        estimator(prior_checkpoint).train(regression_input_fn(), max_steps=3)
    assert "also holds 1 variable(s) this model does not have, ignored as tf.estimator ignores them: extra/kernel" \
        in caplog.text
    assert os.path.exists(os.path.join(prior_checkpoint, "model.ckpt-3.index"))


def test_the_unchanged_model_resumes(prior_checkpoint):
    before = checkpoint_files(prior_checkpoint)
    estimator(prior_checkpoint).train(regression_input_fn(), max_steps=3)
    after = checkpoint_files(prior_checkpoint)
    assert before is not None and after is not None and "./model.ckpt-3.index" in set(after) - set(before)


def _damage(prefix: str, how: str) -> str:
    """Truncate the data file of checkpoint `prefix`, or flip bytes in the middle of it; returns its path."""
    (data,) = tf.io.gfile.glob(prefix + ".data-*")
    with open(data, "r+b") as handle:
        size = os.path.getsize(data)
        if how == "truncated":
            handle.truncate(size // 2)
        else:
            handle.seek(size // 2)
            chunk = handle.read(4)
            handle.seek(size // 2)
            handle.write(bytes(b ^ 0xFF for b in chunk))
    return data


@pytest.mark.parametrize("how", ["truncated", "corrupted"])
@pytest.mark.parametrize("call", ["train", "evaluate", "predict"])
def test_a_damaged_latest_checkpoint_names_its_file_and_the_newest_intact_one(prior_checkpoint, how, call):
    """TF raised a raw IndexError ('Read less bytes than requested') or an OpError ('Checksum does not match')
    from inside the run, naming no file."""
    estimator(prior_checkpoint).train(regression_input_fn(), max_steps=4)  # model.ckpt-2 stays intact
    latest = os.path.join(prior_checkpoint, "model.ckpt-4")
    data = _damage(latest, how)
    est = estimator(prior_checkpoint)
    action = {"train": lambda: est.train(regression_input_fn(), max_steps=6),
              "evaluate": lambda: est.evaluate(regression_input_fn(), steps=1, use_cs=True),
              "predict": lambda: list(est.predict(regression_input_fn(), num_samples=2, use_cs=True))}[call]
    error = refused(action, CheckpointMismatchError, f"The checkpoint {latest} cannot be read: its data file {data} "
                    f"is {how}", model_dir=prior_checkpoint)
    intact = os.path.join(prior_checkpoint, "model.ckpt-2")
    assert f"The newest intact checkpoint is {intact}" in error.fix
    assert f"tf.compat.v1.train.update_checkpoint_state('{prior_checkpoint}', '{intact}')" in error.fix


def test_the_fix_for_a_damaged_checkpoint_resumes(prior_checkpoint):
    """Doing what the fix says: move the damaged files away and point `checkpoint` at the intact one."""
    estimator(prior_checkpoint).train(regression_input_fn(), max_steps=4)
    _damage(os.path.join(prior_checkpoint, "model.ckpt-4"), "truncated")
    for name in tf.io.gfile.glob(os.path.join(prior_checkpoint, "model.ckpt-4.*")):
        os.remove(name)
    tf.compat.v1.train.update_checkpoint_state(prior_checkpoint, os.path.join(prior_checkpoint, "model.ckpt-2"))
    estimator(prior_checkpoint).train(regression_input_fn(), max_steps=5)
    assert tf.train.latest_checkpoint(prior_checkpoint).endswith("model.ckpt-5")


def test_with_no_intact_checkpoint_left_the_fix_says_so(prior_checkpoint):
    _damage(os.path.join(prior_checkpoint, "model.ckpt-2"), "corrupted")
    error = refused(lambda: estimator(prior_checkpoint).train(regression_input_fn(), max_steps=4),
                    CheckpointMismatchError, "model.ckpt-2 cannot be read", model_dir=prior_checkpoint)
    assert "No intact checkpoint is left" in error.fix


@pytest.mark.parametrize("vars_to_warm_start, lines", [
    (".*", ["hidden/kernel: the model has float32[4,16], the checkpoint's hidden/kernel is float32[4,8]",
            "hidden/bias: the model has float32[16], the checkpoint's hidden/bias is float32[8]",
            "extra/kernel: the model has float32[16,16], the checkpoint has no variable extra/kernel", "5 of"]),
    (["hidden/kernel", "extra/bias"], [
        "hidden/kernel: the model has float32[4,16]",
        "extra/bias: the model has float32[16], the checkpoint has no variable", "2 of"]),
])
def test_a_warm_start_that_does_not_fit_is_refused_before_anything_is_written(prior_checkpoint, tmp_path,
                                                                               vars_to_warm_start, lines):
    """Issue 24, item 7: the warm start used to fail inside the run, after the compile artifact was written."""
    model_fn = regressor(hidden=16, extra_layer=True)
    new_dir = str(tmp_path / "warm")
    settings = WarmStartSettings(prior_checkpoint, vars_to_warm_start=vars_to_warm_start)
    est = CerebrasEstimator(model_fn, model_dir=new_dir, warm_start_from=settings,
                            config=CSRunConfig(cs_ip="localhost:9000"), params={"batch_size": 4})
    error = refused(lambda: est.train(regression_input_fn(), max_steps=2), CheckpointMismatchError,
                    f"warm_start_from={prior_checkpoint!r}", "does not fit the model", *lines, model_dir=new_dir)
    assert "vars_to_warm_start" in error.fix
