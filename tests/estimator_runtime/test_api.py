"""estimator.api: which Estimator runtime the project runs on, and its helpers."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from estimator import api

ROOT = pathlib.Path(__file__).resolve().parents[2]

_PROBE = ("import sys, estimator, estimator.api as api; "
          "print(api.BACKEND, api.Estimator.__module__, 'tensorflow_estimator' in sys.modules)")


def _probe(choice: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != api.ENV_VAR}
    if choice is not None:
        env[api.ENV_VAR] = choice
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env, capture_output=True, text=True)


def _has_tf_estimator() -> bool:
    try:
        import tensorflow_estimator  # noqa: F401
    except ImportError:
        return False
    import tensorflow as tf
    return int(tf.__version__.split(".")[1]) <= 15


def test_runtime_on_request_imports_no_tensorflow_estimator():
    result = _probe("runtime")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["runtime", "estimator.runtime.estimator", "False"]


def test_default_is_tf_estimator_where_it_exists():
    result = _probe(None)
    assert result.returncode == 0, result.stderr
    expected = "tf.estimator" if _has_tf_estimator() else "runtime"
    assert result.stdout.split()[0] == expected


def test_unknown_choice_fails_with_the_choices():
    result = _probe("keras")
    assert result.returncode != 0
    assert "CEREBRAS_TF_ESTIMATOR='keras' is not one of auto, runtime, tf.estimator." in result.stderr


@pytest.mark.skipif(_has_tf_estimator(), reason="tf.estimator is installed")
def test_asking_for_a_missing_tf_estimator_says_what_to_do():
    result = _probe("tf.estimator")
    assert result.returncode != 0 and "has no tf.estimator (removed in 2.16" in result.stderr


def test_called_from_train_and_evaluate_knows_both_runtimes():
    def frame_in(filename: str, function: str) -> bool:
        namespace = {"api": api}
        source = f"def {function}():\n    return api.called_from_train_and_evaluate()\n"
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - a frame with that file and name
        return namespace[function]()

    assert frame_in("/x/tensorflow_estimator/python/estimator/training.py", "run_local")
    assert frame_in("/repo/estimator/runtime/training.py", "train_and_evaluate")
    assert not frame_in("/repo/estimator/runtime/trainer.py", "train_model")
    assert not api.called_from_train_and_evaluate()
