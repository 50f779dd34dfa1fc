"""Every zoo model (MLP, CNN, transformer) compiles through CerebrasEstimator.compile with no unsupported op."""
from __future__ import annotations

import os

import pytest

from cerebras_tf.compiler import artifact
from examples.zoo import MODELS

# Kernel kinds each model must exercise (forward, gradient, optimizer, schedule).
EXPECTED_KINDS = {
    "mlp": {"matmul", "bias_add", "relu", "relu_grad", "tanh", "tanh_grad", "random_uniform",
            "softmax_cross_entropy", "apply_adam", "gradient_seed", "exp", "pow"},
    "cnn": {"conv2d", "conv2d_backprop_input", "conv2d_backprop_filter", "fused_batch_norm",
            "fused_batch_norm_grad", "max_pool", "max_pool_grad", "avg_pool", "avg_pool_grad",
            "squared_difference", "rsqrt", "apply_momentum", "assign_sub_variable", "select",
            "sparse_softmax_cross_entropy"},
    "transformer": {"gather_variable", "batch_matmul", "softmax", "log_softmax", "transpose", "gather",
                    "unsorted_segment_sum", "l2_loss", "assign_variable", "tanh", "pow", "minimum", "select",
                    "random_uniform", "mean", "rsqrt"},
}
# tf.nn.gelu (the MLP's) lowers to Erf on TF 2.15 and to Erfc on TF >= 2.16.
GELU_KINDS = {"mlp": {"erf", "erfc"}}


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_zoo_model_validates_and_compiles(zoo_estimator, tmp_path, name):
    est = zoo_estimator(name, compile_dir=str(tmp_path / "compile"))

    checked = est.compile(MODELS[name].input_fn, validate_only=True)
    assert checked.validate_only and not checked.reused
    assert "to_half" not in checked.kernel_counts  # validate_only stops after kernel matching
    assert not os.path.exists(tmp_path / "compile")  # and writes nothing

    result = est.compile(MODELS[name].input_fn)
    counts = result.kernel_counts
    assert EXPECTED_KINDS[name] <= set(counts), EXPECTED_KINDS[name] - set(counts)
    assert name not in GELU_KINDS or GELU_KINDS[name] & set(counts), counts
    assert counts["to_half"] > 0
    assert {k.kind for k in result.program.kernels} - {"to_half"} == set(checked.kernel_counts)
    assert not result.reused
    directory = tmp_path / "compile" / "train"
    for name_ in ("program.json", "constants.npz", artifact.REPORT_FILE, artifact.MANIFEST_FILE):
        assert (directory / name_).is_file()
    assert "Kernels by kind:" in result.report and result.graph_hash in result.report


def test_eval_program_streams_loss_and_host_call_and_updates_nothing(zoo_estimator, tmp_path):
    est = zoo_estimator("mlp", compile_dir=str(tmp_path / "compile"))
    program = est.compile(MODELS["mlp"].input_fn, mode="eval").program
    assert program.mode == "eval"
    assert set(program.outputs) == {"loss", "host_call/0", "host_call/1"} and program.host_call["args"] == [
        {"tensor": "host_call/0"}, {"tensor": "host_call/1"}]
    assert program.outputs["host_call/0"] == program.inputs["labels"]
    assert program.gradient_seed is None and not program.gradients
    assert {k.role for k in program.kernels} == {"forward"}
    assert "random_uniform" not in program.kernel_counts()  # dropout is off outside training
    assert (tmp_path / "compile" / "eval" / "program.json").is_file()
