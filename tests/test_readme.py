"""The README's first Python snippet runs as printed, as a user would paste it into a script.

The snippet uses names a real script defines (FLAGS.cs_ip, params, model_fn,
train_input_fn, eval_input_fn): a small prelude supplies them (a linear model
and a generated dataset), and the snippet's own lines follow unchanged. It runs
in a fresh process, from an empty directory, with no TF_CONFIG in the
environment, which is how it failed before it set the default TF_CONFIG.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import tensorflow as tf

from benchmarks.summaries import read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

PRELUDE = '''\
import types

import numpy as np
import tensorflow as tf

from cerebras_tf import CSEstimatorSpec

tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
FLAGS = types.SimpleNamespace(cs_ip="localhost:9000")
params = {"batch_size": 8}
_x = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
_y = _x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)


def train_input_fn(params):
    dataset = tf.data.Dataset.from_tensor_slices((_x, _y)).shuffle(256).repeat()
    return dataset.batch(params["batch_size"], drop_remainder=True)


def eval_input_fn(params):
    return tf.data.Dataset.from_tensor_slices((_x, _y)).batch(params["batch_size"], drop_remainder=True)


def model_fn(features, labels, mode, params):
    predictions = tf.compat.v1.layers.dense(features, 1, name="linear")
    loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return CSEstimatorSpec(mode, loss=loss, train_op=train_op)


# ---- the README's snippet, as printed ----
'''


def readme_snippet() -> str:
    """The first ```python block of the README."""
    with open(README, encoding="utf-8") as handle:
        match = re.search(r"^```python\n(.*?)^```", handle.read(), re.MULTILINE | re.DOTALL)
    assert match, "README.md has no ```python block"
    return match.group(1)


def test_the_readme_snippet_trains_on_the_simulated_wse_and_evaluates(tmp_path):
    snippet = readme_snippet()
    assert "est.train(" in snippet and "est.evaluate(" in snippet  # the snippet this test is about
    script = tmp_path / "snippet.py"
    script.write_text(PRELUDE + snippet, encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-5000:]
    log = run.stderr
    assert "Training on the simulated CS system 'localhost:9000'" in log, log[-5000:]
    assert "Trained steps 1-10000" in log and "on the simulated WSE" in log, log[-5000:]
    model_dir = tmp_path / "model_dir"
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("model.ckpt-10000")
    assert read_scalars(str(model_dir), "wse/estimated_samples_per_sec")  # only the simulated WSE writes it
    evaluation = re.search(r"Saving dict for global step 10000: global_step = 10000, loss = (\S+)", log)
    assert evaluation, log[-5000:]
    assert float(evaluation.group(1)) < 0.01  # the linear model learnt the linear data
    assert os.listdir(model_dir / "eval")
