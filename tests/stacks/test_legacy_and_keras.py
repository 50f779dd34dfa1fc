"""On TF >= 2.16: tf.compat.v1.layers work without the user setting TF_USE_LEGACY_KERAS, and the opt-in
one-liner `import cerebras_tf.legacy_estimator` runs an unchanged tf.estimator script. Each in a fresh
process (TF reads the variable when it first resolves Keras); on TF 2.15 the same scripts run on tf.estimator."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODERN = tuple(int(p) for p in tf.__version__.split(".")[:2]) >= (2, 16)


def _python(code: str, tmp_path, **env_changes: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    for name in ("TF_USE_LEGACY_KERAS", "CEREBRAS_TF_ESTIMATOR"):
        env.pop(name, None)
    for name, value in env_changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env,
                          cwd=str(tmp_path))


_LAYERS = """
    import os
    import tensorflow as tf
    {before}
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y = tf.compat.v1.layers.dense(x, 4)
    print(os.environ.get("TF_USE_LEGACY_KERAS"), y.shape.as_list())
"""


def test_v1_layers_work_after_importing_cerebras_tf_without_tf_use_legacy_keras(tmp_path):
    done = _python(_LAYERS.format(before="from cerebras_tf import CerebrasEstimator  # noqa"), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-3:] == (["1", "[None,", "4]"] if MODERN else ["None", "[None,", "4]"])


@pytest.mark.skipif(not MODERN, reason="TF 2.15's tf.keras is Keras 2: tf.compat.v1.layers always work")
def test_without_cerebras_tf_v1_layers_fail_on_keras_3(tmp_path):
    done = _python(_LAYERS.format(before=""), tmp_path)
    assert done.returncode != 0 and "is not available with Keras 3" in done.stderr


@pytest.mark.skipif(not MODERN, reason="only TF >= 2.16 routes Keras by TF_USE_LEGACY_KERAS")
def test_a_clear_warning_says_what_to_do_when_v1_layers_cannot_work(tmp_path):
    done = _python(_LAYERS.format(before="import estimator  # noqa"), tmp_path, TF_USE_LEGACY_KERAS="0")
    assert done.returncode != 0
    assert "TF_USE_LEGACY_KERAS='0': tf.compat.v1.layers use Keras 3 and will fail." in done.stderr
    assert "export TF_USE_LEGACY_KERAS=1" in done.stderr

    too_late = """
        import tensorflow as tf
        try:
            tf.compat.v1.layers.dense
        except AttributeError:
            pass
        import estimator  # noqa
    """
    done = _python(too_late, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tf.compat.v1.layers was used before TF_USE_LEGACY_KERAS was set" in done.stderr


@pytest.mark.skipif(not MODERN, reason="only TF >= 2.16 routes Keras by TF_USE_LEGACY_KERAS")
def test_a_model_fn_whose_v1_layers_fail_says_what_to_do(tmp_path):
    done = _python("""
        import numpy as np
        import tensorflow as tf
        from cerebras_tf import CerebrasEstimator, EstimatorSpec

        def model_fn(features, labels, mode, params):
            loss = tf.reduce_mean(tf.compat.v1.layers.dense(features, 1))
            return EstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.assign_add(
                tf.compat.v1.train.get_or_create_global_step(), 1))

        def input_fn(params):
            return tf.data.Dataset.from_tensors((np.ones((2, 3), np.float32), None)).repeat()

        CerebrasEstimator(model_fn, model_dir="m").train(input_fn, steps=1)
    """, tmp_path, TF_USE_LEGACY_KERAS="0")
    assert done.returncode != 0
    assert "AttributeError: `dense` is not available with Keras 3. tf.compat.v1.layers need the tf-keras" in done.stderr
    assert "export TF_USE_LEGACY_KERAS=1" in done.stderr


# A script written for tf.estimator (TF 1.x/2.x Estimator API), unchanged but for the first import.
_LEGACY_SCRIPT = """
    import cerebras_tf.legacy_estimator  # noqa: F401 - the one line added for TF >= 2.16
    import json
    import sys

    import numpy as np
    import tensorflow as tf

    X = np.random.RandomState(0).normal(size=(32, 3)).astype(np.float32)
    Y = (X.sum(axis=1, keepdims=True) > 0).astype(np.int32)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"x": X}, Y)).repeat().batch(8)

    def model_fn(features, labels, mode, params):
        logits = tf.compat.v1.layers.dense(features["x"], 2)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"class": tf.argmax(logits, 1)})
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(
            loss, global_step=tf.compat.v1.train.get_global_step())
        accuracy = tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, 1))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops={"acc": accuracy})

    config = tf.estimator.RunConfig(model_dir="model", tf_random_seed=1, save_checkpoints_steps=10)
    est = tf.estimator.Estimator(model_fn, config=config)
    est.train(input_fn, steps=30, hooks=[tf.estimator.StopAtStepHook(last_step=20)])
    metrics = est.evaluate(input_fn, steps=4)
    pred_input = lambda: tf.data.Dataset.from_tensor_slices({"x": X[:5]}).batch(5)
    classes = [int(p["class"]) for p in est.predict(pred_input)]
    print(json.dumps({"step": int(metrics["global_step"]), "acc": float(metrics["acc"]), "n": len(classes),
                      "same": tf.compat.v1.estimator is tf.estimator,
                      "module": type(est).__module__, "latest": est.latest_checkpoint()}))
"""


def test_the_legacy_one_liner_runs_an_unchanged_tf_estimator_script(tmp_path):
    done = _python(_LEGACY_SCRIPT, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["step"] == 20 and result["n"] == 5 and result["acc"] > 0.5
    assert result["latest"].endswith("model.ckpt-20")
    assert (tmp_path / "model" / "eval").is_dir()
    if MODERN:
        assert result["same"] and result["module"].startswith("estimator.runtime")
    else:
        assert result["module"].startswith("tensorflow_estimator")


@pytest.mark.skipif(not MODERN, reason="TF 2.15 has tf.estimator of its own")
def test_without_the_one_liner_tf_estimator_is_missing_and_the_package_leaves_tf_alone(tmp_path):
    done = _python("""
        import tensorflow as tf
        import estimator
        print(hasattr(tf, "estimator"), estimator.BACKEND)
        estimator.install_as_tf_estimator()
        print(tf.estimator.Estimator is estimator.Estimator, tf.estimator.LoggingTensorHook is
              tf.compat.v1.train.LoggingTensorHook)
        try:
            tf.estimator.DNNClassifier
        except AttributeError as error:
            print(error)
    """, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "False runtime" and lines[1] == "True True"
    assert "tf.estimator.DNNClassifier is not provided by cerebras-tf's Estimator runtime" in lines[2]


@pytest.mark.skipif(not MODERN, reason="TF 2.15 has the tensorflow_estimator package of its own")
def test_the_one_liner_serves_the_tensorflow_estimator_modules_scripts_import_from(tmp_path):
    """The Model Zoo's estimator wrappers import tensorflow_estimator.python.estimator.* directly."""
    done = _python("""
        import importlib.util
        import estimator
        print(importlib.util.find_spec("tensorflow_estimator") is None)
        import cerebras_tf.legacy_estimator
        import tensorflow as tf
        from tensorflow_estimator.python.estimator.estimator import Estimator
        from tensorflow_estimator.python.estimator.model_fn import EstimatorSpec
        from tensorflow_estimator.python.estimator.run_config import RunConfig
        from tensorflow_estimator.python.estimator.mode_keys import ModeKeys
        import tensorflow_estimator as tfe
        print(Estimator is estimator.Estimator, EstimatorSpec is estimator.EstimatorSpec,
              RunConfig is estimator.RunConfig, ModeKeys is estimator.ModeKeys,
              tfe.estimator.Estimator is tf.estimator.Estimator)
        try:
            from tensorflow_estimator.python.estimator.estimator import DNNClassifier
        except ImportError as error:
            print(error)
    """, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "True" and lines[1] == "True True True True True", lines
    assert "DNNClassifier" in lines[2], lines
