"""Both stacks share model_dirs: one written by tf.estimator on TF 2.15 (Python 3.11) resumes and evaluates
under cerebras-tf's Estimator runtime on TF 2.21 (Python 3.12/3.13), and the other way round.

The other stack's Python runs stack_script.py in a subprocess: $CEREBRAS_TF_OTHER_PYTHON, else the repository's
.venv-3.11 (from a TF 2.21 stack) or .venv-3.12 / .venv-3.13 (from TF 2.15), as ./dev and .ci/run create them.
The test skips, saying so, when that interpreter is not there.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stack_script.py")
THIS_IS_MODERN = tuple(int(p) for p in tf.__version__.split(".")[:2]) >= (2, 16)
OTHER_VENVS = (".venv-3.11",) if THIS_IS_MODERN else (".venv-3.12", ".venv-3.13")


def _other_python() -> str | None:
    given = os.environ.get("CEREBRAS_TF_OTHER_PYTHON")
    if given:
        return given
    for venv in OTHER_VENVS:
        python = os.path.join(ROOT, venv, "bin", "python")
        if os.access(python, os.X_OK):
            return python
    return None


OTHER = _other_python()
pytestmark = pytest.mark.skipif(OTHER is None, reason=(
    f"the other stack's Python is not here ({' or '.join(OTHER_VENVS)} in the repository, or "
    f"CEREBRAS_TF_OTHER_PYTHON): `PYTHON={'3.11' if THIS_IS_MODERN else '3.12'} ./dev setup` makes it"))


def _run(python: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("CEREBRAS_TF_ESTIMATOR", None)  # each stack's own choice: tf.estimator on 2.15, the runtime on 2.21
    env.pop("TF_USE_LEGACY_KERAS", None)
    done = subprocess.run([python, SCRIPT, *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_model_dir_moves_between_the_stacks_both_ways(tmp_path):
    model_dir = str(tmp_path / "model")
    first = _run(OTHER, "train", model_dir, "10")
    shutil.copytree(model_dir, tmp_path / "copy")
    here_eval = _run(sys.executable, "evaluate", model_dir)
    other_eval = _run(OTHER, "evaluate", model_dir)
    assert {first["backend"], here_eval["backend"]} == {"tf.estimator", "runtime"}, (first, here_eval)
    assert here_eval["result"]["global_step"] == other_eval["result"]["global_step"] == 10
    for key in ("loss", "mae"):
        assert here_eval["result"][key] == pytest.approx(other_eval["result"][key], rel=1e-5, abs=1e-6)

    resumed = _run(sys.executable, "train", model_dir, "20")  # this stack resumes the other's checkpoint
    assert tf.train.latest_checkpoint(model_dir).endswith("model.ckpt-20")
    assert resumed["result"]["global_step"] == 20
    back = _run(OTHER, "evaluate", model_dir)  # and the other reads this one's
    here = _run(sys.executable, "evaluate", model_dir)
    assert back["result"]["global_step"] == here["result"]["global_step"] == 20
    assert back["result"]["loss"] == pytest.approx(here["result"]["loss"], rel=1e-5, abs=1e-6)
    moved = [name for name, value in resumed["result"].items()
             if name != "global_step" and not np.allclose(value, first["result"][name])]
    assert moved, "training did not go on from step 10"  # (the loss need not fall in ten SGD steps)

    # The same ten steps on the other stack, from a copy of its step-10 model_dir: the same variables
    # (each batch is the whole data set; straight runs are not compared: two fresh runs of this script
    # start from different initial values, tf_random_seed notwithstanding).
    on_the_other = _run(OTHER, "train", str(tmp_path / "copy"), "20")["result"]
    for name, value in on_the_other.items():
        np.testing.assert_allclose(resumed["result"][name], value, rtol=1e-4, atol=1e-5, err_msg=name)
