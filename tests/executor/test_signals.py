"""A training run on the system stopped by SIGINT (Ctrl-C) or SIGTERM (a scheduler's stop) exits at once and
leaves a checkpoint plain TF loads; the next run resumes from it (issue 24: what a user's bad day needs)."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from cerebras_tf.run.trainer_lock import LOCK_FILE

SCRIPT = os.path.join(os.path.dirname(__file__), "kill_train_script.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _train(model_dir: str, *args: str, log_path: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, SCRIPT, model_dir, *args, "--numerics", "float32"],
                                stdout=log, stderr=subprocess.STDOUT, env=env)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signalled_run_exits_at_once_and_the_next_one_resumes(tmp_path, sig):
    model_dir = str(tmp_path / "model")
    first = _train(model_dir, log_path=str(tmp_path / "first.log"))
    try:
        deadline = time.monotonic() + 120
        while len(glob.glob(os.path.join(model_dir, "model.ckpt-*.index"))) < 2:  # training, past a save
            assert first.poll() is None, (tmp_path / "first.log").read_text()
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.05)
        sent = time.monotonic()
        first.send_signal(sig)
        returncode = first.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        first.kill()
        first.wait()
    assert returncode == -sig and took < 10, (returncode, took)
    latest = tf.train.latest_checkpoint(model_dir)
    step = int(tf.train.load_checkpoint(latest).get_tensor("global_step"))  # whole and readable
    assert step >= 100
    # Ctrl-C unwinds the run (its lock is released); SIGTERM ends the process where it stands (the lock stays,
    # and the next run takes it over).
    assert os.path.exists(os.path.join(model_dir, LOCK_FILE)) == (sig == signal.SIGTERM)

    second_log = tmp_path / "second.log"
    second = _train(model_dir, str(step + 20), log_path=str(second_log))
    assert second.wait(timeout=180) == 0, second_log.read_text()
    assert "Restoring the simulated WSE's weights from " + latest in second_log.read_text()
    assert tf.train.latest_checkpoint(model_dir).endswith(f"model.ckpt-{step + 20}")
    assert not os.path.exists(os.path.join(model_dir, LOCK_FILE))
