"""Every kernel kind in the compiler's LIBRARY has a numpy implementation; the package stays TF-free."""
from __future__ import annotations

import os
import subprocess
import sys

from cerebras_tf.compiler.kernels import LIBRARY
from cerebras_tf.ir import WRITES
from cerebras_tf.wse.kernels import KERNELS, run_kernel


def test_every_library_kind_is_implemented():
    missing = sorted({d.kind for d in LIBRARY.values()} - set(KERNELS))
    assert not missing, f"kinds without a numpy kernel: {missing}"
    assert WRITES <= set(KERNELS)


def test_unknown_kind_is_named():
    try:
        run_kernel("no_such_kind", [], {})
    except KeyError as err:
        assert "no_such_kind" in str(err)
    else:
        raise AssertionError("expected KeyError")


def test_kernels_import_without_tensorflow():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = "import sys, cerebras_tf.wse.kernels; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
