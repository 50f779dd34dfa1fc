"""One process of test_distributed_strategies.py: runs an Estimator under a distribution strategy and prints
what it produced as JSON (the last line of stdout).

    python strategy_script.py '{"SCENARIO": {"api": "runtime" | "tf.estimator", ...}, ...}'

runs each scenario in turn (one TensorFlow start for several) and prints {"SCENARIO": its result, ...}.
api "runtime" is estimator.runtime (on any TensorFlow), "tf.estimator" TensorFlow's own (TF 2.15 only), so the
test can run the same scenario on both and compare. Scenarios:

- local: RunConfig(train_distribute/eval_distribute) runs without a cluster, each {"name", "strategy",
  "eval_strategy", "batch", "train_and_evaluate"} of "runs" in model_dir/<name>: train to "steps" (with
  train_and_evaluate when asked), evaluate the whole input.
- worker: one task of a TF_CONFIG cluster ("tf_config") in train_and_evaluate with "strategy" (and
  "eval_strategy"); an evaluator evaluates every checkpoint until the last.
- read: evaluate model_dir (whatever wrote it) and list its checkpoint.
- refusals: what RunConfig/Estimator say to the strategy settings tf.estimator refuses (and accepts).

Run as a script, the process has two logical CPU devices, and sessions see both (session_config device_count).
The test imports the model and input from here too.
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tensorflow.python.distribute.distribute_config import DistributeConfig  # noqa: E402  (no public alias)

X = np.random.default_rng(3).normal(size=(32, 3)).astype(np.float32)
Y = (X @ np.array([[1.5], [-2.0], [0.5]], np.float32) + 0.3).astype(np.float32)
W1 = np.random.default_rng(4).normal(scale=0.5, size=(3, 8)).astype(np.float32)
W2 = np.random.default_rng(5).normal(scale=0.5, size=(8, 1)).astype(np.float32)
DEVICES = ["/cpu:0", "/cpu:1"]

STRATEGIES = {
    "mirrored": lambda: tf.distribute.MirroredStrategy(DEVICES),
    "mirrored_v1": lambda: tf.compat.v1.distribute.MirroredStrategy(DEVICES),
    "one_device": lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
    "central_storage_v1": lambda: tf.compat.v1.distribute.experimental.CentralStorageStrategy(DEVICES),
    "ps_v1": lambda: tf.compat.v1.distribute.experimental.ParameterServerStrategy(),
    "mwms": lambda: tf.distribute.MultiWorkerMirroredStrategy(),
    "mwms_v1": lambda: tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy(),
}


def _api(name: str):
    if name == "tf.estimator":
        return tf.estimator
    from estimator import runtime
    return runtime


def _strategy(name: str | None):
    return STRATEGIES[name]() if name else None


def _session_config():
    return tf.compat.v1.ConfigProto(allow_soft_placement=True, device_count={"CPU": 2})


def input_fn(params, input_context=None):
    """(X, Y) forever in batches of params["batch"], a worker's shard of it when the strategy has several."""
    dataset = tf.data.Dataset.from_tensor_slices((X, Y))
    if input_context is not None and input_context.num_input_pipelines > 1:
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.repeat().batch(params["batch"]) if params.get("repeat", True) else dataset.batch(params["batch"])


def eval_input_fn(params):
    """All of (X, Y) once."""
    return input_fn({**params, "repeat": False})


def make_model_fn(api):
    def model_fn(features, labels, mode, params):
        w1 = tf.compat.v1.get_variable("hidden/kernel", initializer=W1)
        b1 = tf.compat.v1.get_variable("hidden/bias", [8], initializer=tf.compat.v1.zeros_initializer())
        w2 = tf.compat.v1.get_variable("output/kernel", initializer=W2)
        b2 = tf.compat.v1.get_variable("output/bias", [1], initializer=tf.compat.v1.zeros_initializer())
        output = tf.matmul(tf.nn.relu(tf.matmul(features, w1) + b1), w2) + b2
        if mode == api.ModeKeys.PREDICT:
            return api.EstimatorSpec(mode, predictions={"y": output})
        loss = tf.compat.v1.losses.mean_squared_error(labels, output)
        train_op = None
        if mode == api.ModeKeys.TRAIN:
            train_op = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(
                loss, global_step=tf.compat.v1.train.get_global_step())
        metrics = {"mae": tf.compat.v1.metrics.mean_absolute_error(labels, output)}
        return api.EstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)

    return model_fn


def _checkpoint(model_dir: str) -> dict:
    latest = tf.train.latest_checkpoint(model_dir)
    return {
        "checkpoint": os.path.basename(latest) if latest else None,
        "variables": {name: tf.train.load_variable(latest, name).tolist() for name, _ in tf.train.list_variables(latest)
                      if not name.startswith("global_step")} if latest else {},
        "files": sorted(os.listdir(model_dir)),
    }


def _metrics(result: dict) -> dict:
    return {key: float(value) for key, value in result.items()}


def local(args: dict) -> dict:
    api = _api(args["api"])
    out = {}
    for run in args["runs"]:
        model_dir = os.path.join(args["model_dir"], run["name"])
        config = api.RunConfig(train_distribute=_strategy(run.get("strategy")),
                               eval_distribute=_strategy(run.get("eval_strategy")), session_config=_session_config(),
                               save_checkpoints_steps=args["steps"], log_step_count_steps=1000)
        estimator = api.Estimator(make_model_fn(api), model_dir=model_dir, config=config,
                                  params={"batch": run["batch"]})
        if run.get("train_and_evaluate"):
            api.train_and_evaluate(estimator, api.TrainSpec(input_fn, max_steps=args["steps"]),
                                   api.EvalSpec(eval_input_fn, steps=None, throttle_secs=0))
        else:
            estimator.train(input_fn, max_steps=args["steps"])
        metrics = estimator.evaluate(eval_input_fn)
        out[run["name"]] = {"metrics": _metrics(metrics), **_checkpoint(model_dir)}
    return out


def worker(args: dict) -> dict:
    os.environ["TF_CONFIG"] = json.dumps(args["tf_config"])
    if args.get("disable_eager_execution"):  # TF's advice for an evaluator task with MultiWorkerMirroredStrategy
        tf.compat.v1.disable_eager_execution()
    api = _api(args["api"])
    strategy = _strategy(args["strategy"])
    config = api.RunConfig(train_distribute=strategy, eval_distribute=_strategy(args.get("eval_strategy")),
                           session_config=_session_config(),
                           save_checkpoints_steps=args["steps"], log_step_count_steps=1000)
    estimator = api.Estimator(make_model_fn(api), model_dir=args["model_dir"], config=config,
                              params={"batch": args["batch"]})
    properties = {name: getattr(config, name) for name in ("task_type", "task_id", "is_chief", "master",
                                                         "num_worker_replicas", "global_id_in_cluster")}
    result = api.train_and_evaluate(estimator, api.TrainSpec(input_fn, max_steps=args["steps"]),
                                    api.EvalSpec(eval_input_fn, steps=None, start_delay_secs=0, throttle_secs=1))
    return {"config": properties, "returned": result, **_checkpoint(args["model_dir"])}


def read(args: dict) -> dict:
    api = _api(args["api"])
    estimator = api.Estimator(make_model_fn(api), model_dir=args["model_dir"], params={"batch": args["batch"]},
                              config=api.RunConfig(session_config=_session_config()))
    metrics = estimator.evaluate(eval_input_fn)
    return {"metrics": _metrics(metrics), **_checkpoint(args["model_dir"])}


class _Listener(tf.compat.v1.train.CheckpointSaverListener):
    pass


def refusals(args: dict) -> dict:
    api = _api(args["api"])
    model_dir = args["model_dir"]
    v2_ps = tf.distribute.experimental.ParameterServerStrategy
    mwms = tf.distribute.MultiWorkerMirroredStrategy()  # made without TF_CONFIG: a local one, no server started
    workers = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}

    def config(tf_config=None, **kwargs):
        os.environ.pop("TF_CONFIG", None)
        if tf_config:
            os.environ["TF_CONFIG"] = json.dumps(tf_config)
        return api.RunConfig(**kwargs)

    def estimator(run_config):
        return api.Estimator(make_model_fn(api), model_dir=os.path.join(model_dir, "m"), config=run_config,
                             params={"batch": 4})

    def properties(run_config):
        return {"cluster_spec": run_config.cluster_spec.as_dict() if run_config.cluster_spec else {},
                **{name: getattr(run_config, name) for name in (
                    "task_type", "task_id", "is_chief", "master", "num_worker_replicas", "num_ps_replicas",
                    "global_id_in_cluster")}}

    cases = {
        "v2_ps_train": lambda: config(train_distribute=v2_ps.__new__(v2_ps)),
        "v2_ps_eval": lambda: config(eval_distribute=v2_ps.__new__(v2_ps)),
        "both_train": lambda: config(train_distribute=mwms, experimental_distribute=DistributeConfig(
            train_distribute=mwms)),
        "both_eval": lambda: config(eval_distribute=mwms, experimental_distribute=DistributeConfig(
            eval_distribute=mwms)),
        "remote_and_tf_config": lambda: config({"cluster": workers, "task": {"type": "worker", "index": 0}},
                                               experimental_distribute=DistributeConfig(
                                                   train_distribute=mwms, remote_cluster=workers)),
        "worker_cluster_config": lambda: properties(config({"cluster": workers, "task": {"type": "worker",
                                                                                         "index": 1}},
                                                           train_distribute=mwms)),
        "worker_cluster_without_strategy": lambda: config({"cluster": workers, "task": {"type": "worker",
                                                                                        "index": 1}}),
        "worker_cluster_eval_distribute_only": lambda: config({"cluster": workers, "task": {"type": "worker",
                                                                                            "index": 1}},
                                                              eval_distribute=mwms),
        "train_in_cluster": lambda: estimator(config({"cluster": workers, "task": {"type": "worker", "index": 0}},
                                                     train_distribute=mwms)).train(input_fn, max_steps=1),
        "evaluate_in_cluster": lambda: estimator(config({"cluster": workers, "task": {"type": "worker",
                                                                                      "index": 0}},
                                                        train_distribute=mwms, eval_distribute=mwms)).evaluate(
            input_fn, steps=1),
        "evaluator_job": lambda: estimator(config({"cluster": {**workers, "evaluator": ["127.0.0.1:3"]},
                                                   "task": {"type": "worker", "index": 0}},
                                                  train_distribute=mwms)).train(input_fn, max_steps=1),
        "standalone_between_graph": lambda: estimator(config(experimental_distribute=DistributeConfig(
            train_distribute=mwms, remote_cluster=workers))).train(input_fn, max_steps=1),
        "saving_listeners_collective": lambda: estimator(config(
            {"cluster": {"master": ["127.0.0.1:1"]}, "task": {"type": "master", "index": 0}},
            train_distribute=mwms)).train(input_fn, max_steps=1, saving_listeners=[_Listener()]),
    }
    out = {}
    for name, case in cases.items():
        try:
            value = case()
            out[name] = value if isinstance(value, dict) else "accepted"
        except Exception as error:  # noqa: BLE001 - what each stack raises is the result
            out[name] = f"{type(error).__name__}: {error}"
    os.environ.pop("TF_CONFIG", None)
    return out


if __name__ == "__main__":
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)
    _cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    scenarios = json.loads(sys.argv[1])
    print(json.dumps({"tf": tf.__version__, **{name: globals()[name](args) for name, args in scenarios.items()}}))
