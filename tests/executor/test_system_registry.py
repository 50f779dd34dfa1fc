"""The simulated CS system behind a cs_ip is programmed once per process, as the real fabric is."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest
import tensorflow as tf

import cerebras_tf
from cerebras_tf import CerebrasEstimator, CSRunConfig, set_default_tf_config
from cerebras_tf.errors import SystemProgrammedError
from cerebras_tf.wse import system
from test_executor import _input_fn, _model_fn  # the same small MLP as the executor tests


@pytest.fixture(autouse=True)
def _tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    set_default_tf_config()


def _estimator(model_dir, cs_ip="localhost:9000", model_fn=_model_fn):
    config = CSRunConfig(cs_ip=cs_ip, tf_random_seed=1, save_checkpoints_steps=100)
    return CerebrasEstimator(model_fn, model_dir=str(model_dir), config=config, params={})


def test_the_same_program_runs_again_and_resumes(tmp_path):
    estimator = _estimator(tmp_path)
    estimator.train(_input_fn, max_steps=3)
    estimator.train(_input_fn, steps=2)  # same TRAIN program: allowed, resumes from the checkpoint
    assert estimator.get_variable_value("global_step") == 5
    assert system.programmed_system("localhost:9000").mode == "train"


def test_eval_after_train_in_the_same_process_is_refused_before_anything_is_written(tmp_path):
    estimator = _estimator(tmp_path)
    estimator.train(_input_fn, max_steps=2)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(SystemProgrammedError) as info:
        estimator.evaluate(_input_fn, steps=1, use_cs=True)
    message = str(info.value)
    for fragment in ("localhost:9000", "TRAIN program", "EVAL program", "cannot be reprogrammed",
                     "train_and_evaluate is not supported", "release_system('localhost:9000')"):
        assert fragment in message, message
    assert sorted(os.listdir(tmp_path)) == before
    assert not os.path.exists(tmp_path / "cs_compile" / "eval")
    assert estimator.evaluate(_input_fn, steps=1)["global_step"] == 2  # CPU evaluation is still fine


def test_a_changed_graph_is_refused_and_release_system_frees_the_system(tmp_path):
    _estimator(tmp_path / "a").train(_input_fn, max_steps=1)

    def wider(features, labels, mode, params):
        features = tf.concat([features, features], axis=1)[:, : features.shape[1]] * 1.5
        return _model_fn(features, labels, mode, params)

    changed = _estimator(tmp_path / "b", model_fn=wider)
    with pytest.raises(SystemProgrammedError, match="cannot also run the TRAIN program"):
        changed.train(_input_fn, max_steps=1)
    _estimator(tmp_path / "c", cs_ip="localhost:9001", model_fn=wider).train(_input_fn, max_steps=1)  # other system
    cerebras_tf.release_system("localhost:9000")
    changed.train(_input_fn, max_steps=1)
    assert system.programmed_system("localhost:9000").model_dir == str(tmp_path / "b")
    assert system.programmed_system("localhost:9001") is not None
    cerebras_tf.release_system()
    assert system.programmed_system("localhost:9001") is None


def test_compile_does_not_program_the_system(tmp_path):
    estimator = _estimator(tmp_path)
    estimator.compile(_input_fn)
    assert system.programmed_system("localhost:9000") is None
