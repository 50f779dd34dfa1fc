"""Scripts that call tf.compat.v1.disable_eager_execution() first, as the Model Zoo's R1.8 run.py does, get
everything an eager script gets on the simulated CS system (issue 22, items 2 and 3). Graph mode is
process-wide: graph_mode_run.py runs the checks in a process of its own and prints one line per check."""
from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "graph_mode_run.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKS = ["validate and compile", "training on the system matches the Estimator", "summaries",
          "evaluate with host_call", "nested conds",
          "a while loop in a nested branch is refused", "two input workers", "predict",
          "a features entry replaced by model_fn", "an appliance evaluation with eval_metric_ops"]


def test_a_graph_mode_script_validates_compiles_trains_evaluates_and_predicts_on_the_system(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}  # this tree's code, not an install
    result = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True, env=env,
                            timeout=600)
    passed = [line[3:] for line in result.stdout.splitlines() if line.startswith("OK ")]
    assert passed == CHECKS, f"passed {passed}; exit {result.returncode}:\n{result.stderr[-4000:]}"
    assert result.returncode == 0
