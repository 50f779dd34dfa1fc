"""Zoo-style run scripts, unchanged, through `python -m cerebras_tf.csoft`: R1.8's appliance flow in graph mode
(CSX pipeline training on the simulated system, CPU evaluation, weight streaming refused) and R1.7's container
flow with --cs_ip, pipelined and in the weight-streaming container. The script is tests/csoft/zoo_like_run.py
(written here, in the zoo's shape)."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys

import tensorflow as tf

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zoo_like_run.py")
LONE_CHIEF = json.dumps({"cluster": {"chief": ["localhost:2222"]}, "task": {"type": "chief", "index": 0}})


def _run(flavour: str, *args: str, eager: bool = False, tf_config: str | None = None
         ) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", ZOO_LIKE_EAGER="1" if eager else "0")
    if tf_config:
        env["TF_CONFIG"] = tf_config
    return subprocess.run([sys.executable, "-m", "cerebras_tf.csoft", flavour, SCRIPT, *args], env=env,
                          capture_output=True, text=True, timeout=300)


def _eval_metrics(result: subprocess.CompletedProcess) -> dict[str, float]:
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("EVAL "))
    return ast.literal_eval(line[len("EVAL "):])  # the dict of floats the script printed


def test_r18_appliance_flow_in_graph_mode(tmp_path):
    model_dir = str(tmp_path / "model")
    trained = _run("appliance", "CSX", "pipeline", "--model_dir", model_dir, "--mode", "train", "--max_steps", "6",
                   "--mgmt_address", "mgmt.example:443")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert re.search(r"Training on the simulated CS system: no Cerebras appliance cluster is reachable.*"
                     r"mgmt_address 'mgmt.example:443' is not contacted", trained.stderr), trained.stderr[-3000:]
    assert tf.train.latest_checkpoint(model_dir).endswith("model.ckpt-6")
    events = [name for name in os.listdir(model_dir) if name.startswith("events.out.tfevents")]
    tags = {value.tag for name in events for event in tf.compat.v1.train.summary_iterator(os.path.join(model_dir, name))
            for value in event.summary.value}
    assert "train/cost" in tags, tags  # computed on the system inside cs1_enable_summaries()

    evaluated = _eval_metrics(_run("appliance", "CPU", "--model_dir", model_dir, "--mode", "eval"))
    assert evaluated["global_step"] == 6.0 and evaluated["eval/mse"] == evaluated["loss"]

    # R1.8's weight streaming: the same math on the simulated system, laid out one layer at a time; the same
    # model_dir resumes, and CPU evaluates its checkpoint.
    streaming = _run("appliance", "CSX", "weight_streaming", "--model_dir", model_dir, "--max_steps", "9",
                     "--mgmt_address", "mgmt.example:443")
    assert streaming.returncode == 0, streaming.stderr[-3000:]
    assert re.search(r"Estimated [\d,]+ samples/s on WSE-2 \(weight streaming, 1 system; limited by",
                     streaming.stderr), streaming.stderr[-3000:]
    assert tf.train.latest_checkpoint(model_dir).endswith("model.ckpt-9")
    assert _eval_metrics(_run("appliance", "CPU", "--model_dir", model_dir, "--mode", "eval"))["global_step"] == 9.0
    # two systems: data parallel, each on its own batch; the checkpoint evaluates on CPU as before
    two = _run("appliance", "CSX", "weight_streaming", "--model_dir", model_dir, "--max_steps", "12",
               "--num_csx", "2", "--mgmt_address", "mgmt.example:443")
    assert two.returncode == 0, two.stderr[-3000:]
    assert "Training data parallel on 2 simulated systems" in two.stderr
    assert re.search(r"Estimated [\d,]+ samples/s on WSE-2 \(weight streaming, 2 systems",
                     two.stderr), two.stderr[-3000:]
    assert tf.train.latest_checkpoint(model_dir).endswith("model.ckpt-12")
    assert _eval_metrics(_run("appliance", "CPU", "--model_dir", model_dir, "--mode", "eval"))["global_step"] == 12.0


def test_r17_container_flow_with_a_cs_ip(tmp_path):
    model_dir = str(tmp_path / "model")
    trained = _run("container", "--cs_ip", "localhost:9000", "--model_dir", model_dir, "--max_steps", "4",
                   eager=True, tf_config=LONE_CHIEF)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "Training on the simulated CS system 'localhost:9000'" in trained.stderr
    assert tf.train.latest_checkpoint(model_dir).endswith("model.ckpt-4")


def test_r17_weight_streaming_container_flow_with_a_cs_ip(tmp_path):
    """The weight_streaming flavour: the script finds tfwse and the weight-streaming estimator, trains in weight
    streaming with --cs_ip and evaluates its eval_metric_ops on the simulated system."""
    model_dir = str(tmp_path / "model")
    trained = _run("weight_streaming", "--cs_ip", "localhost:9000", "--model_dir", model_dir, "--max_steps", "4",
                   eager=True, tf_config=LONE_CHIEF)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "Training on the simulated CS system 'localhost:9000'" in trained.stderr
    assert re.search(r"Estimated [\d,]+ samples/s on WSE-2 \(weight streaming, 1 system; limited by",
                     trained.stderr), trained.stderr[-3000:]
    assert tf.train.latest_checkpoint(model_dir).endswith("model.ckpt-4")
    evaluated = _eval_metrics(_run("weight_streaming", "--cs_ip", "localhost:9000", "--model_dir", model_dir,
                                   "--mode", "eval", eager=True, tf_config=LONE_CHIEF))
    assert evaluated["global_step"] == 4.0 and evaluated["eval/mse"] >= 0.0
