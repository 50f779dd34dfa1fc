"""One trainer per model_dir on the CS system (issue 24, items 5 and 6): a live holder refuses a second trainer,
a dead one's lock is taken over, evaluation is not blocked, and killed saves' *.tempstate* files are removed."""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys

import pytest
import tensorflow as tf

import cerebras_tf
from cerebras_tf.errors import TrainerLockError
from cerebras_tf.run.trainer_lock import LOCK_FILE


def _write_lock(model_dir: str, pid: int, host: str | None = None) -> str:
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, LOCK_FILE)
    with open(path, "w") as file:
        json.dump({"pid": pid, "host": host or socket.gethostname(), "since": "2026-11-24T10:00:00"}, file)
    return path


@pytest.fixture
def live_process():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield process
    process.kill()
    process.wait()


@pytest.mark.parametrize("where", ["this host", "another host"])
def test_a_second_trainer_is_refused_naming_the_holder(where, live_process, model_dir, make_estimator, make_input_fn):
    pid = live_process.pid if where == "this host" else 4242
    path = _write_lock(model_dir, pid, None if where == "this host" else "gpu-node-7")
    with pytest.raises(TrainerLockError) as caught:
        make_estimator().train(make_input_fn(), max_steps=2)
    assert f"pid {pid} on {socket.gethostname() if where == 'this host' else 'gpu-node-7'}" in caught.value.message
    assert "since 2026-11-24T10:00:00" in caught.value.message and path in caught.value.message
    assert tf.train.latest_checkpoint(model_dir) is None and os.path.exists(path)  # the holder's lock stays


def test_the_lock_of_a_trainer_that_died_is_taken_over(model_dir, make_estimator, make_input_fn, caplog):
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
    path = _write_lock(model_dir, int(finished.stdout))
    leftover = os.path.join(model_dir, "model.ckpt-100.data-00000-of-00001.tempstate8155341963557457051")
    with open(leftover, "wb") as file:
        file.write(b"\0" * 1024)
    with caplog.at_level(logging.INFO, logger="tensorflow"):
        make_estimator().train(make_input_fn(), max_steps=2)
    assert f"Taking over the trainer lock of {model_dir} from pid {int(finished.stdout)}" in caplog.text
    assert "Removed 1 partial file(s) a killed checkpoint save left" in caplog.text and not os.path.exists(leftover)
    assert tf.train.latest_checkpoint(model_dir).endswith("model.ckpt-2")
    assert not os.path.exists(path)  # released when the run ended


def test_evaluation_is_not_blocked_by_a_trainer(live_process, model_dir, make_estimator, make_input_fn):
    estimator = make_estimator()
    estimator.train(make_input_fn(), max_steps=2)
    cerebras_tf.release_system()
    _write_lock(model_dir, live_process.pid)
    assert estimator.evaluate(make_input_fn(repeat=1), steps=1, use_cs=True)["global_step"] == 2
    assert estimator.evaluate(make_input_fn(repeat=1), steps=1)["global_step"] == 2
