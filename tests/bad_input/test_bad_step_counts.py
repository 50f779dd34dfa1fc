"""Issue 16, class 3: step counts on the CS path. tf.estimator's messages ("Must specify steps > 0, given: 0"),
as a StepCountError (a ValueError too, as tf.estimator raises), before anything is written; counts that are not
integers (1.5 trained 2 steps, '2' failed with a raw TypeError after writing the artifact) are refused too."""
from __future__ import annotations

import pytest
from bad_input_helpers import BATCH, estimator, refused, regression_input_fn

from cerebras_tf import CerebrasEstimator, CSRunConfig
from cerebras_tf.errors import RunArgumentError, StepCountError

TRAIN = [
    ({"steps": 0}, "Must specify steps > 0, given: 0"),
    ({"steps": -5}, "Must specify steps > 0, given: -5"),
    ({"max_steps": -3}, "Must specify max_steps > 0, given: -3"),
    ({"max_steps": 0}, "Must specify max_steps > 0, given: 0"),
    ({"steps": -2.5}, "Must specify steps > 0, given: -2.5"),
    ({"steps": 1.5}, "Must specify steps > 0 as an integer, given: 1.5 (float)"),
    ({"steps": "2"}, "Must specify steps > 0 as an integer, given: '2' (str)"),
    ({"max_steps": "10"}, "Must specify max_steps > 0 as an integer, given: '10' (str)"),
    ({"max_steps": 2.0}, "Must specify max_steps > 0 as an integer, given: 2.0 (float)"),
    ({"steps": True}, "Must specify steps > 0 as an integer, given: True (bool)"),
    ({"steps": [2]}, "Must specify steps > 0 as an integer, given: [2] (list)"),
    ({"steps": 2, "max_steps": 4}, "Can not provide both steps and max_steps."),
]


@pytest.mark.parametrize("counts, message", TRAIN, ids=[repr(c) for c, _ in TRAIN])
def test_train_step_counts(model_dir, counts, message):
    est = estimator(model_dir)
    error = refused(lambda: est.train(regression_input_fn(), **counts), StepCountError, message, "Where: " + __file__,
                    model_dir=model_dir)
    assert isinstance(error, ValueError)


def test_train_without_any_step_count_is_refused_as_before(model_dir):
    est = estimator(model_dir)
    refused(lambda: est.train(regression_input_fn()), RunArgumentError, "needs steps or max_steps",
            model_dir=model_dir)


@pytest.mark.parametrize("steps, message", [
    (0, "Must specify steps > 0, given: 0"),
    (-1, "Must specify steps > 0, given: -1"),
    (2.5, "Must specify steps > 0 as an integer, given: 2.5 (float)"),
    ("3", "Must specify steps > 0 as an integer, given: '3' (str)"),
])
def test_evaluate_steps(prior_checkpoint, steps, message):
    est = estimator(prior_checkpoint)
    refused(lambda: est.evaluate(regression_input_fn(), steps=steps, use_cs=True), StepCountError, message,
            model_dir=prior_checkpoint)


@pytest.mark.parametrize("num_samples, message", [
    (0, "Must specify num_samples > 0, given: 0"),
    (-1, "Must specify num_samples > 0, given: -1"),
    ("x", "Must specify num_samples > 0 as an integer, given: 'x' (str)"),
    (1.5, "Must specify num_samples > 0 as an integer, given: 1.5 (float)"),
    (True, "Must specify num_samples > 0 as an integer, given: True (bool)"),
])
def test_predict_num_samples(prior_checkpoint, num_samples, message):
    est = estimator(prior_checkpoint)
    refused(lambda: est.predict(regression_input_fn(), num_samples=num_samples, use_cs=True), StepCountError, message,
            model_dir=prior_checkpoint)


def test_a_model_dir_with_a_checkpoint_is_left_as_it_was(prior_checkpoint):
    est = estimator(prior_checkpoint)
    refused(lambda: est.train(regression_input_fn(), steps=0), StepCountError, "Must specify steps > 0, given: 0",
            model_dir=prior_checkpoint)


@pytest.mark.parametrize("call", ["train steps=0", "train steps=-5", "train max_steps=-3", "evaluate steps=0"])
def test_the_messages_are_tf_estimators(tmp_path, call):
    """The same call on CPU (plain tf.estimator) raises the same words."""
    name, argument = call.split(" ")
    key, value = argument.split("=")
    kwargs = {key: int(value)}
    cpu = CerebrasEstimator(estimator(str(tmp_path / "cpu")).user_model_fn, model_dir=str(tmp_path / "cpu"),
                            config=CSRunConfig(), params={"batch_size": BATCH})
    cs = estimator(str(tmp_path / "cs"))
    cs_call = {"train": lambda e, cs_path: e.train(regression_input_fn(), **kwargs),
               "evaluate": lambda e, cs_path: e.evaluate(regression_input_fn(), use_cs=cs_path, **kwargs)}[name]
    with pytest.raises(ValueError) as on_cpu:
        cs_call(cpu, False)
    with pytest.raises(StepCountError) as on_cs:
        cs_call(cs, True)
    assert on_cs.value.message == str(on_cpu.value)
