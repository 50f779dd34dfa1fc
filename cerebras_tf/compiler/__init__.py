"""The WSE compiler: a captured Estimator graph -> the WSE kernel IR (the only cerebras_tf part that reads TF graphs).

    result = compile_model(model, validate_only=False, compile_dir=..., system_name=...)
    result.program        # ir.Program: kernels in execution order, tensors, variables, layers
    result.kernel_counts  # kernels by kind
    result.report         # human-readable report (also report.txt in the artifact)
    result.reused         # True when the artifact in compile_dir was reused

Modules: fold (static folding), kernels (TF op types -> the IR's kernel
kinds), lower (graph -> IR, casts), functions (the captured graph's function
library: cond/case branches), artifact (compile_dir), report (the text
report), layout (placement on the fabric), driver (compile_model), initial
(variables' initial values, computed by TF). The IR itself, its verifier and
the TF-free passes are the package `cerebras_tf.ir`. Importing this package
does not import TensorFlow (compile_model does, on first use).
"""
from __future__ import annotations

from typing import Any

from cerebras_tf import ir
from cerebras_tf.ir import Program

__all__ = ["CompileResult", "Program", "compile_model", "ir"]


def __getattr__(name: str) -> Any:
    if name in ("CompileResult", "compile_model"):
        from cerebras_tf.compiler import driver  # imports TF

        return getattr(driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
