"""A Model Zoo R1.8-style appliance script, written for these tests (not the zoo's code).

It does what R1.8's run.py + run_appliance do, in the same shape: disables
eager execution first, picks the Cerebras code path by which package names
import (``cerebras.framework`` -> refuse, ``cerebras_appliance`` -> the
appliance), wraps the appliance's CSRunConfig and estimator in subclasses,
builds a CSConfig with cluster settings and DebugArgs carrying the FullConfig
as JSON, and runs one mode inside ``cs1_enable_summaries()``:

  python -m cerebras_tf.csoft appliance appliance_zoo_like.py {CPU,CSX} [pipeline|weight_streaming]
      --model_dir DIR --mode {train,eval} [--max_steps N] [--validate_only|--compile_only]
      [--mgmt_address ADDR] [--num_csx N]
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


if _importable("cerebras.framework") or not _importable("cerebras_appliance"):
    sys.exit("this script needs the appliance's package names (python -m cerebras_tf.csoft appliance ...)")

from cerebras_appliance.CSConfig import CSConfig  # noqa: E402
from cerebras_appliance.cs_run_config import CSRunConfig as ApplianceRunConfig  # noqa: E402
from cerebras_appliance.pb.common.tri_state_pb2 import TS_ENABLED  # noqa: E402
from cerebras_appliance.pb.stack.full_pb2 import FullConfig  # noqa: E402
from cerebras_appliance.pb.workflow.appliance.common.common_config_pb2 import (  # noqa: E402
    DebugArgs,
    ExecutionStrategy,
)
from cerebras_tensorflow.cs_estimator_app import CerebrasAppEstimator  # noqa: E402
from cerebras_tensorflow.cs_estimator_spec import CSEstimatorSpec  # noqa: E402
from cerebras_tensorflow.graph_extraction import cs1_enable_summaries  # noqa: E402
from google.protobuf import json_format  # noqa: E402

BATCH = 4
WEIGHTS = np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)


class RunConfig(ApplianceRunConfig):
    def __init__(self, cs_config=None, **kwargs):
        super().__init__(cs_config=cs_config, **kwargs)


class Estimator(CerebrasAppEstimator):
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
    predictions = tf.compat.v1.layers.dense(hidden, 1, name="out")
    loss = tf.reduce_mean(tf.square(predictions - labels))
    if mode == tf.estimator.ModeKeys.TRAIN:
        tf.compat.v1.summary.scalar("train/cost", loss)
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(loss, global_step=step)
        return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)

    def metrics(labels, predictions):
        return {"eval/mse": tf.compat.v1.metrics.mean_squared_error(labels, predictions)}

    return CSEstimatorSpec(mode=mode, loss=loss, host_call=(metrics, [labels, predictions]))


def debug_args_with_full_config():
    full = FullConfig()
    full.matching.kernel.no_dcache_spill_splits = True
    full.matching.kernel.autogen_config.try_strip_outer_dim = TS_ENABLED
    debug_args = DebugArgs()
    debug_args.debug_crd.pipeline_options.full_config = json_format.MessageToJson(
        full, preserving_proto_field_name=True, indent=0, sort_keys=True)
    return debug_args


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("target", choices=["CPU", "GPU", "CSX"])
    parser.add_argument("strategy", nargs="?", default="pipeline", choices=["pipeline", "weight_streaming"])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--mode", default="train", choices=["train", "eval"])
    parser.add_argument("--max_steps", type=int, default=8)
    parser.add_argument("--validate_only", action="store_true")
    parser.add_argument("--compile_only", action="store_true")
    parser.add_argument("--mgmt_address", default=None)
    parser.add_argument("--num_csx", type=int, default=1)
    args = parser.parse_args()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)  # as the zoo's setup_logging does
    strategies = {"pipeline": ExecutionStrategy.ES_PIPELINE, "weight_streaming": ExecutionStrategy.ES_WEIGHT_STREAMING}
    cs_config = CSConfig(num_csx=args.num_csx, max_wgt_servers=1, max_act_per_csx=1, mgmt_address=args.mgmt_address,
                         debug_args=debug_args_with_full_config(), mount_dirs=[], python_paths=[],
                         num_workers_per_csx=0, execution_strategy=strategies[args.strategy], job_labels=[],
                         job_time_sec=None, disable_version_check=False)
    config = RunConfig(cs_config=cs_config, save_checkpoints_steps=100, save_summary_steps=2, tf_random_seed=1,
                       log_step_count_steps=4)
    params = {"seed": 0, "mode": args.mode}
    use_cs = args.target == "CSX"
    with cs1_enable_summaries():
        estimator = Estimator(model_fn, model_dir=args.model_dir, config=config, params=params)
        if args.validate_only or args.compile_only:
            estimator.compile(input_fn, validate_only=args.validate_only)
        elif args.mode == "train":
            estimator.train(input_fn, max_steps=args.max_steps, use_cs=use_cs)
        else:
            result = estimator.evaluate(input_fn, steps=4, use_cs=use_cs)
            print("EVAL", {key: float(value) for key, value in sorted(result.items())})


if __name__ == "__main__":
    main()
