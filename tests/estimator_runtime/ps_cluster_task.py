"""One task of the parameter-server cluster test_distributed_ps.py starts: train_and_evaluate as TF_CONFIG says.

  python ps_cluster_task.py MODEL_DIR MAX_STEPS MARKER_DIR     one task (TF_CONFIG names it) of the cluster
  python ps_cluster_task.py read CHECKPOINT                    a checkpoint's variables and an evaluation of it

The Estimator is the one `estimator` resolves (CEREBRAS_TF_ESTIMATOR picks tf.estimator or cerebras-tf's runtime).
Workers start once the chief's session is ready, and trainers meet after their first step (see _Steps), so
every trainer trains whatever the machine's load; the chief counts its saves, the evaluator the global steps it
evaluated. The last line printed is JSON: the backend, this task and what it did.
"""
from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from estimator import BACKEND, Estimator, EstimatorSpec, EvalSpec, ModeKeys, RunConfig, TrainSpec  # noqa: E402
from estimator import train_and_evaluate  # noqa: E402
from runtime_models import X, Y  # noqa: E402  (this script's directory is on sys.path)

WORKERS = 2


def input_fn(params):
    return tf.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(4)


def eval_input_fn(params):
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(4)


def model_fn(features, labels, mode):
    """A linear regressor (get_variable, so no Keras) with SGD."""
    w = tf.compat.v1.get_variable("linear/w", [3, 1], initializer=tf.compat.v1.zeros_initializer())
    b = tf.compat.v1.get_variable("linear/b", [1], initializer=tf.compat.v1.zeros_initializer())
    y = tf.matmul(features, w) + b
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions={"y": y})
    loss = tf.compat.v1.losses.mean_squared_error(labels, y)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return EstimatorSpec(mode, loss=loss, train_op=train_op,
                         eval_metric_ops={"mae": tf.compat.v1.metrics.mean_absolute_error(labels, y)})


def _wait_for(marker_dir: str, prefix: str, count: int) -> None:
    """Wait (at most 60 s) until marker_dir has `count` markers named prefix...."""
    deadline = time.time() + 60
    while time.time() < deadline and sum(name.startswith(prefix) for name in os.listdir(marker_dir)) < count:
        time.sleep(0.05)


class _Steps(tf.compat.v1.train.SessionRunHook):
    """Counts this task's steps. The chief leaves a marker once its session is ready (workers start training
    after it: a worker that asks too early waits 30 s before asking again). After its first step a trainer waits
    until both workers have made theirs (a worker leaves a marker), so none reaches max_steps before every one
    has trained."""

    def __init__(self, task: str, marker_dir: str) -> None:
        self.steps = 0
        self._task = task
        self._marker_dir = marker_dir

    def after_create_session(self, session, coord):
        if not self._task.startswith("worker"):
            open(os.path.join(self._marker_dir, "chief-ready"), "w").close()

    def after_run(self, run_context, run_values):
        self.steps += 1
        if self.steps != 1:
            return
        if self._task.startswith("worker"):
            open(os.path.join(self._marker_dir, self._task), "w").close()
        _wait_for(self._marker_dir, "worker", WORKERS)


class _Saves(tf.compat.v1.train.CheckpointSaverListener):
    """Counts the checkpoints saved in this task (TrainSpec's saving listeners go to the chief alone)."""

    def __init__(self) -> None:
        self.saves = 0

    def after_save(self, session, global_step_value):
        self.saves += 1


def _estimator(model_dir: str) -> Estimator:
    config = RunConfig(tf_random_seed=3, save_checkpoints_steps=5, save_summary_steps=5, log_step_count_steps=5,
                       experimental_max_worker_delay_secs=1)
    return Estimator(model_fn, model_dir=model_dir, config=config)


def run_task(model_dir: str, max_steps: str, marker_dir: str) -> dict:
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    name = f"{task['type']}{task['index']}"
    steps, saves = _Steps(name, marker_dir), _Saves()
    evaluated: list[int] = []

    class _Evaluated(tf.compat.v1.train.SessionRunHook):
        """Records the global step of each checkpoint this task evaluates."""

        def begin(self):
            self._step = tf.compat.v1.train.get_global_step()

        def end(self, session):
            evaluated.append(int(session.run(self._step)))

    estimator = _estimator(model_dir)
    started = time.time()
    if task["type"] == "worker":
        _wait_for(marker_dir, "chief-ready", 1)
    train_and_evaluate(estimator, TrainSpec(input_fn, max_steps=int(max_steps), hooks=[steps],
                                            saving_listeners=[saves]),
                       EvalSpec(eval_input_fn, steps=None, hooks=[_Evaluated()], start_delay_secs=0,
                                throttle_secs=1))
    return {"backend": BACKEND, "tensorflow": tf.__version__, "task": name, "steps": steps.steps,
            "saves": saves.saves, "evaluated": evaluated, "seconds": round(time.time() - started, 1)}


def read(checkpoint: str) -> dict:
    """A checkpoint, as this stack reads it: its variables, and this stack's Estimator's evaluation of it."""
    os.environ.pop("TF_CONFIG", None)
    variables = {name: tf.train.load_variable(checkpoint, name).tolist() for name, _ in
                 tf.train.list_variables(checkpoint)}
    metrics = _estimator(os.path.dirname(checkpoint)).evaluate(eval_input_fn, checkpoint_path=checkpoint, name="read")
    return {"backend": BACKEND, "tensorflow": tf.__version__, "variables": variables,
            "metrics": {key: float(value) for key, value in metrics.items()}}


if __name__ == "__main__":
    result = read(sys.argv[2]) if sys.argv[1] == "read" else run_task(*sys.argv[1:])
    print(json.dumps(result))
