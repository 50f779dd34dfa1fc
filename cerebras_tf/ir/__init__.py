"""The WSE program IR: the contract between the compiler and the executor (no TensorFlow here).

Modules: program (the dataclasses and their JSON/npz form), vocabulary (kernel
kinds, roles, dtypes), keys (how inputs and outputs are keyed), passes
(TF-free passes over a whole program), costs (per-layer costs for placement),
verify (Program.verify()). Everything is re-exported here: `from cerebras_tf
import ir; ir.Program`.
"""
from cerebras_tf.ir.keys import (
    ASSERT_PREFIX,
    FILE_STREAM_PREFIX,
    EVAL_METRIC_INPUT_PREFIX,
    HOST_CALL_PREFIX,
    HOST_SUMMARY_KINDS,
    PRINT_PREFIX,
    PRINT_STREAMS,
    SUMMARY_PREFIX,
    check_key,
    host_call_arguments,
    host_call_structure,
    input_leaves,
)
from cerebras_tf.ir.program import (
    CONSTANTS_FILE,
    IR_VERSION,
    PROGRAM_FILE,
    Const,
    Kernel,
    Layer,
    Program,
    Tensor,
    Variable,
    array_key,
)
from cerebras_tf.ir.passes import data_parallel_problem, phases, readers
from cerebras_tf.ir.verify import IRError, verify
from cerebras_tf.ir.vocabulary import CHECKS_INPUT, DTYPES, HALF, KINDS, READS_VARIABLES, ROLES, VARIABLE_ROLES, WRITES

__all__ = [
    "ASSERT_PREFIX", "CHECKS_INPUT", "CONSTANTS_FILE", "DTYPES", "EVAL_METRIC_INPUT_PREFIX", "FILE_STREAM_PREFIX",
    "HALF", "HOST_CALL_PREFIX",
    "HOST_SUMMARY_KINDS", "IRError", "IR_VERSION", "KINDS", "PRINT_PREFIX", "PRINT_STREAMS", "PROGRAM_FILE",
    "READS_VARIABLES", "ROLES", "SUMMARY_PREFIX", "VARIABLE_ROLES", "WRITES", "Const", "Kernel", "Layer", "Program",
    "Tensor", "Variable", "array_key", "check_key", "data_parallel_problem",
    "host_call_arguments", "host_call_structure", "input_leaves",
    "phases", "readers", "verify",
]
