"""The design's hard seams, checked on the source tree."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _python_files(*parts: str) -> list[pathlib.Path]:
    return sorted(ROOT.joinpath(*parts).rglob("*.py"))


@pytest.mark.parametrize("package", ["wse", "amp"])
def test_numpy_only_packages_never_import_tensorflow(package):
    for path in _python_files("cerebras_tf", package):
        offending = {m for m in _imported_modules(path) if m.split(".")[0] in ("tensorflow", "tensorflow_estimator")}
        assert not offending, f"{path.relative_to(ROOT)} imports {offending}"


def test_only_the_estimator_layer_touches_tensorflow_estimator():
    for path in _python_files("cerebras_tf") + _python_files("examples"):
        offending = {m for m in _imported_modules(path) if m.startswith("tensorflow_estimator")}
        assert not offending, f"{path.relative_to(ROOT)} imports {offending}"


def test_the_estimator_runtime_imports_only_tensorflow():
    """estimator.runtime must work where tensorflow-estimator cannot be installed (TF >= 2.16)."""
    for path in _python_files("estimator", "runtime"):
        offending = {m for m in _imported_modules(path)
                     if m.split(".")[0] == "tensorflow_estimator" or m.split(".")[0] == "cerebras_tf"
                     or (m.startswith("estimator") and not m.startswith("estimator.runtime"))}
        assert not offending, f"{path.relative_to(ROOT)} imports {offending}"


def test_estimator_layer_never_imports_the_cerebras_layer():
    for path in _python_files("estimator"):
        offending = {m for m in _imported_modules(path) if m.split(".")[0] == "cerebras_tf"}
        assert not offending, f"{path.relative_to(ROOT)} imports {offending}"


def test_numpy_only_packages_load_without_tensorflow():
    code = "import sys, cerebras_tf.amp, cerebras_tf.wse; print('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
