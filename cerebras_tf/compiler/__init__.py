"""The WSE compiler: a captured Estimator graph -> the WSE kernel IR (the only cerebras_tf part that reads TF graphs).

    result = compile_model(model, validate_only=False, compile_dir=..., system_name=...)
    result.program        # ir.Program: kernels in execution order, tensors, variables, layers
    result.kernel_counts  # kernels by kind
    result.report         # human-readable report (also report.txt in the artifact)
    result.reused         # True when the artifact in compile_dir was reused

Modules: ir (the IR and its JSON/npz form), fold (static folding), kernels
(the kernel library), lower (graph -> IR, casts), artifact (compile_dir),
report (the text report), driver (compile_model), costs (per-layer costs for
placement, TF-free), initial (variables' initial values, computed by TF).
Importing this package, `ir` or `costs` does not import TensorFlow: an
executor can load programs without it.
"""
from __future__ import annotations

from typing import Any

from cerebras_tf.compiler import ir
from cerebras_tf.compiler.ir import Program

__all__ = ["CompileResult", "Program", "compile_model", "ir"]


def __getattr__(name: str) -> Any:
    if name in ("CompileResult", "compile_model"):
        from cerebras_tf.compiler import driver  # imports TF

        return getattr(driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
