"""Fixtures for the malformed-input cases: TF_CONFIG for every test, prior checkpoints, read-only directories.

tests/conftest.py gives `model_dir` (a path that does not exist yet) and
`tf_config`; the helpers are in bad_input_helpers.py.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Callable

import pytest
from bad_input_helpers import CHIEF_TF_CONFIG, estimator, regression_input_fn, regressor

import cerebras_tf


@pytest.fixture(autouse=True)
def _chief_tf_config(tf_config):
    """A CS training run needs TF_CONFIG: tests/conftest.py's tf_config sets the default single chief."""


def _train_prior(directory: str, model_fn: Callable, input_fn: Callable) -> str:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TF_CONFIG", CHIEF_TF_CONFIG)
        estimator(directory, model_fn).train(input_fn, max_steps=2)
    cerebras_tf.release_system()
    shutil.rmtree(os.path.join(directory, "cs_compile"))  # only the checkpoint (and summaries) matter
    return directory


@pytest.fixture(scope="session")
def _prior_regressor(tmp_path_factory) -> str:
    return _train_prior(str(tmp_path_factory.mktemp("prior") / "model"), regressor(), regression_input_fn())


@pytest.fixture
def prior_checkpoint(_prior_regressor, tmp_path) -> str:
    """A model_dir holding model.ckpt-2 of regressor() (trained on the simulated WSE), this test's own copy."""
    target = str(tmp_path / "model")
    shutil.copytree(_prior_regressor, target)
    return target


@pytest.fixture
def read_only_dir(tmp_path):
    """read_only_dir(path) makes a directory this process cannot write to (root ignores permissions, so
    chattr +i there); undone at teardown. Skips the test when that cannot be arranged."""
    made: list[str] = []

    def make(path: str) -> str:
        os.makedirs(path, exist_ok=True)
        if os.geteuid() == 0:
            if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", path],
                                                                capture_output=True).returncode != 0:
                pytest.skip("running as root without chattr +i: no directory is read-only")
        else:
            os.chmod(path, 0o555)
        made.append(path)
        return path

    yield make
    for path in made:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", path], capture_output=True)
        else:
            os.chmod(path, 0o755)
