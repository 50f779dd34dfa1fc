"""A Model Zoo-style run script (R1.7 container flow or R1.8 appliance flow), written for these tests.

It is not the zoo's code; it does what the zoo's run.py and its common code
do, in the same shape: disables eager execution first (R1.8), picks the
Cerebras code path by which package names import (``cerebras.framework``:
the container, ``cerebras.tf.*``, and where ``tfwse`` imports too the
weight-streaming container's estimator, ``cerebras.tf.ws.cs_estimator_ws``,
whose evaluation returns eval_metric_ops and whose train gets
``sparsifier=None``, as R1.7's GPT-2 does; else ``cerebras_appliance``: the
appliance, ``cerebras_tensorflow.*``), wraps the stack's CSRunConfig and estimator in
subclasses, builds the stack's CSConfig (the container's message from
params["csconfig"]; the appliance's with cluster settings and DebugArgs
carrying the FullConfig as JSON) and runs one mode inside
``cs1_enable_summaries()``, with the layer helpers (summary_layer,
boundary_cast) in the model:

  python -m cerebras_tf.csoft appliance zoo_like_run.py {CPU,CSX} [pipeline|weight_streaming] --model_dir DIR
      [--mode train|eval] [--max_steps N] [--validate_only|--compile_only] [--mgmt_address A] [--num_csx N]
  python -m cerebras_tf.csoft container zoo_like_run.py --model_dir DIR [--cs_ip IP] [--mode train|eval] ...
  python -m cerebras_tf.csoft weight_streaming zoo_like_run.py --model_dir DIR [--cs_ip IP] [--mode train|eval] ...
"""
import argparse
import importlib.util
import os
import sys

import numpy as np
import tensorflow as tf

if os.environ.get("ZOO_LIKE_EAGER") != "1":
    tf.compat.v1.disable_eager_execution()


def _importable(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


CONTAINER = _importable("cerebras.framework")
WEIGHT_STREAMING = CONTAINER and _importable("tfwse")
if CONTAINER:
    from cerebras.pb.common.tri_state_pb2 import TS_ENABLED
    from cerebras.pb.stack.full_pb2 import FullConfig
    from cerebras.pb.tf.csconfig_pb2 import CSConfig
    from cerebras.tf.cs_estimator import CerebrasEstimator as StackEstimator
    from cerebras.tf.cs_estimator_spec import CSEstimatorSpec
    from cerebras.tf.run_config import CSRunConfig as StackRunConfig
    from cerebras.tf.summary import cs1_enable_summaries
    from cerebras.tf.tf_helper import boundary_cast, summary_layer

    if WEIGHT_STREAMING:
        import tfwse  # noqa: F401
        from cerebras.tf.ws.cs_estimator_ws import CerebrasEstimator as StackEstimator
elif _importable("cerebras_appliance"):
    from cerebras_appliance.CSConfig import CSConfig
    from cerebras_appliance.cs_run_config import CSRunConfig as StackRunConfig
    from cerebras_appliance.pb.common.tri_state_pb2 import TS_ENABLED
    from cerebras_appliance.pb.stack.full_pb2 import FullConfig
    from cerebras_appliance.pb.workflow.appliance.common.common_config_pb2 import DebugArgs, ExecutionStrategy
    from cerebras_tensorflow.cs_estimator_app import CerebrasAppEstimator as StackEstimator
    from cerebras_tensorflow.cs_estimator_spec import CSEstimatorSpec
    from cerebras_tensorflow.graph_extraction import cs1_enable_summaries
    from cerebras_tensorflow.summary import boundary_cast, summary_layer
    from google.protobuf import json_format
else:
    sys.exit("this script needs the Cerebras package names (python -m cerebras_tf.csoft container|appliance ...)")

BATCH = 4
WEIGHTS = np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)


class RunConfig(StackRunConfig):
    def __init__(self, cs_config=None, **kwargs):
        super().__init__(cs_config=cs_config, **kwargs)


class Estimator(StackEstimator):
    def __init__(self, model_fn, model_dir=None, compile_dir=None, config=None, params=None):
        super().__init__(model_fn, model_dir=model_dir, compile_dir=compile_dir, config=config, params=params)


def input_fn(params, input_context=None):
    rng = np.random.default_rng(params["seed"])
    x = rng.normal(size=(64, 4)).astype(np.float32)
    features = {"x": x, "bias": np.ones((64, 1), np.float32)}
    dataset = tf.data.Dataset.from_tensor_slices((features, x @ WEIGHTS + 0.25))
    if params["mode"] == "train":
        dataset = dataset.repeat()
    return dataset.batch(BATCH, drop_remainder=True)


def model_fn(features, labels, mode, params):
    hidden = tf.compat.v1.layers.dense(tf.concat([features["x"], features["bias"]], axis=1), 8,
                                       activation=tf.nn.relu, name="hidden")
    hidden = summary_layer(boundary_cast(hidden))
    predictions = tf.compat.v1.layers.dense(hidden, 1, name="out")
    loss = tf.reduce_mean(tf.square(predictions - labels))
    if mode == tf.estimator.ModeKeys.TRAIN:
        tf.compat.v1.summary.scalar("train/cost", loss)
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(loss, global_step=step)
        return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)

    def metrics(labels, predictions):
        return {"eval/mse": tf.compat.v1.metrics.mean_squared_error(labels, predictions)}

    if WEIGHT_STREAMING:  # the weight-streaming path builds its metric ops in model_fn
        return CSEstimatorSpec(mode=mode, loss=loss, eval_metric_ops=metrics(labels, predictions))
    return CSEstimatorSpec(mode=mode, loss=loss, host_call=(metrics, [labels, predictions]))


def full_config():
    full = FullConfig()
    full.matching.kernel.no_dcache_spill_splits = True
    full.matching.kernel.autogen_config.try_strip_outer_dim = TS_ENABLED
    return full


def stack_config(args):
    """The run config as each stack's run script builds it: the container's CSConfig message from
    params["csconfig"] and the FullConfig in stack_params with --cs_ip; the appliance's CSConfig with cluster
    settings and the FullConfig as JSON in its DebugArgs, and no cs_ip."""
    common = dict(save_checkpoints_steps=100, save_summary_steps=2, tf_random_seed=1, log_step_count_steps=4)
    if CONTAINER:
        return RunConfig(cs_ip=args.cs_ip, cs_config=CSConfig(**{"use_cbfloat16": False}),
                         stack_params={"ir_mode": "mlir-cirh", "config": full_config()}, **common)
    debug_args = DebugArgs()
    debug_args.debug_crd.pipeline_options.full_config = json_format.MessageToJson(
        full_config(), preserving_proto_field_name=True, indent=0, sort_keys=True)
    strategy = {"pipeline": ExecutionStrategy.ES_PIPELINE, "weight_streaming": ExecutionStrategy.ES_WEIGHT_STREAMING}
    cs_config = CSConfig(num_csx=args.num_csx, max_wgt_servers=1, max_act_per_csx=1, mgmt_address=args.mgmt_address,
                         debug_args=debug_args, mount_dirs=[], python_paths=[], num_workers_per_csx=0,
                         execution_strategy=strategy[args.strategy], job_labels=[], job_time_sec=None,
                         disable_version_check=False)
    return RunConfig(cs_config=cs_config, **common)


def main():
    parser = argparse.ArgumentParser()
    if not CONTAINER:
        parser.add_argument("target", choices=["CPU", "GPU", "CSX"])
        parser.add_argument("strategy", nargs="?", default="pipeline", choices=["pipeline", "weight_streaming"])
    parser.add_argument("--cs_ip", default=None)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--mode", default="train", choices=["train", "eval"])
    parser.add_argument("--max_steps", type=int, default=8)
    parser.add_argument("--validate_only", action="store_true")
    parser.add_argument("--compile_only", action="store_true")
    parser.add_argument("--mgmt_address", default=None)
    parser.add_argument("--num_csx", type=int, default=1)
    args = parser.parse_args()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)  # as the zoo's setup_logging does
    use_cs = bool(args.cs_ip) if CONTAINER else args.target == "CSX"
    params = {"seed": 0, "mode": args.mode}
    with cs1_enable_summaries():
        estimator = Estimator(model_fn, model_dir=args.model_dir, config=stack_config(args), params=params)
        if args.validate_only or args.compile_only:
            estimator.compile(input_fn, validate_only=args.validate_only)
        elif args.mode == "train":
            extra = {"sparsifier": None} if WEIGHT_STREAMING else {}
            estimator.train(input_fn, max_steps=args.max_steps, use_cs=use_cs, **extra)
        else:
            result = estimator.evaluate(input_fn, steps=4, use_cs=use_cs)
            print("EVAL", {key: float(value) for key, value in sorted(result.items())})


if __name__ == "__main__":
    main()
