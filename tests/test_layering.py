"""The design's seams, checked on the source tree: package imports form a one-way DAG, and who may import what."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The TF side of amp: the one module of a TF-free package that imports TensorFlow (imported lazily).
TF_SIDE_MODULES = {"cerebras_tf/amp/tf_loss_scaling.py"}

# unit -> imports it must never make (a prefix of a module or unit name).
FORBIDDEN = {
    "cerebras_tf.ir": ("tensorflow", "cerebras_tf."),  # the IR depends on nothing of the project but itself
    "cerebras_tf.wse": ("tensorflow", "cerebras_tf.compiler", "cerebras_tf.rules", "cerebras_tf.input_workers",
                        "cerebras_tf.run", "estimator"),
    "cerebras_tf.amp": ("tensorflow", "cerebras_tf.compiler", "cerebras_tf.wse", "cerebras_tf.rules", "estimator"),
    # the host side of a run is above what it runs: nothing it drives may import it
    "cerebras_tf.compiler": ("cerebras_tf.run",),
    "cerebras_tf.rules": ("cerebras_tf.run",),
    "cerebras_tf.input_workers": ("cerebras_tf.run",),
    "cerebras_tf.precheck": ("cerebras_tf.run",),
    "cerebras_tf.settings": ("cerebras_tf.run",),
    "estimator": ("cerebras_tf",),
}


def _unit(module: str) -> str | None:
    """The node of the package graph a module belongs to: a subpackage or top-level module of cerebras_tf,
    or the estimator package. Bare `cerebras_tf` (which Python imports before any of its submodules
    anyway) is no node, except as the file cerebras_tf/__init__.py itself (see _file_unit)."""
    parts = module.split(".")
    if parts[0] == "estimator":
        return "estimator"
    if parts[0] == "cerebras_tf" and len(parts) > 1:
        return ".".join(parts[:2])
    return None


def _file_unit(path: pathlib.Path) -> str:
    return _unit(_module_name(path)) or "cerebras_tf (public API)"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, tree: ast.AST | None = None) -> set[str]:
    """Every module `path` imports, at the top or inside a function (a lazy import is still a dependency)."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree or ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: `from . import x` in package a.b is a.b.x
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
    return names


def _sources() -> list[pathlib.Path]:
    return sorted(ROOT.joinpath("cerebras_tf").rglob("*.py")) + sorted(ROOT.joinpath("estimator").rglob("*.py"))


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in _sources():
        unit = _file_unit(path)
        targets = {_unit(name) for name in _imports(path)}
        graph.setdefault(unit, set()).update(t for t in targets if t is not None and t != unit and t in _all_units())
    return graph


def _all_units() -> set[str]:
    return {_file_unit(p) for p in _sources()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_package_imports_form_a_one_way_dag():
    graph = _package_graph()
    cycle = _cycle(graph)
    assert cycle is None, "packages import each other: " + " -> ".join(cycle or [])
    assert "cerebras_tf.ir" in graph and "cerebras_tf.wse" in graph["cerebras_tf.compiler"]  # the graph is real


# The host side of a run on the system is one package; these names are its modules, not top-level ones.
RUN_MODULES = {"chief", "host_checks", "tensor_text", "divergence", "tensorboard", "host_kernels_tf", "trainer_lock"}


def test_the_host_side_of_a_run_is_one_package_between_the_compiler_and_the_system():
    """train(use_cs=True) walks estimator -> precheck -> rules -> compiler -> run -> wse: cs_estimator hands the
    compiled program to cerebras_tf.run, which drives the wse/ executor; the run's modules live nowhere else."""
    graph = _package_graph()
    assert {"cerebras_tf.compiler", "cerebras_tf.wse", "cerebras_tf.input_workers"} <= graph["cerebras_tf.run"]
    assert "cerebras_tf.run" in graph["cerebras_tf.cs_estimator"]
    assert {path.stem for path in ROOT.joinpath("cerebras_tf", "run").glob("*.py")} == RUN_MODULES | {"__init__"}
    assert not {path.stem for path in ROOT.joinpath("cerebras_tf").glob("*.py")} & (RUN_MODULES | {"cs_training"})


def test_no_package_makes_an_import_it_must_not():
    offending = []
    for path in _sources():
        relative = path.relative_to(ROOT).as_posix()
        unit = _file_unit(path)
        for name in sorted(_imports(path)):
            if relative in TF_SIDE_MODULES and name.split(".")[0] == "tensorflow":
                continue
            forbidden = FORBIDDEN.get(unit, ())
            if any(name == f.rstrip(".") or name.startswith(f if f.endswith(".") else f + ".") or name == f
                   for f in forbidden) and _unit(name) != unit:
                offending.append(f"{relative} imports {name}")
            if name.startswith("tensorflow_estimator") and unit != "estimator":
                offending.append(f"{relative} imports {name} (only estimator/ may)")
    for path in sorted(ROOT.joinpath("examples").rglob("*.py")):
        offending += [f"{path.relative_to(ROOT)} imports {name}" for name in _imports(path)
                      if name.startswith("tensorflow_estimator")]
    assert not offending, "\n".join(offending)


def test_the_estimator_runtime_imports_only_tensorflow():
    """estimator.runtime must work where tensorflow-estimator cannot be installed (TF >= 2.16)."""
    offending = []
    for path in sorted(ROOT.joinpath("estimator", "runtime").rglob("*.py")):
        offending += [f"{path.relative_to(ROOT)} imports {name}" for name in sorted(_imports(path))
                      if name.split(".")[0] in ("tensorflow_estimator", "cerebras_tf")
                      or (name.split(".")[0] == "estimator" and not name.startswith("estimator.runtime"))]
    assert not offending, "\n".join(offending)


def _runtime_imports(path: pathlib.Path) -> set[str]:
    """The modules `path` imports when it runs: _imports without those under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = [ast.Pass()]
    return _imports(path, tree)


def _estimator_runtime_graph() -> dict[str, set[str]]:
    """estimator/runtime's modules -> the modules of it they import at runtime (`from estimator.runtime import
    x` counts as x; the package itself is no node)."""
    modules = {path.stem for path in ROOT.joinpath("estimator", "runtime").glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(ROOT.joinpath("estimator", "runtime").glob("*.py")):
        targets = {name.split(".")[2] for name in _runtime_imports(path)
                   if name.startswith("estimator.runtime.") and name.split(".")[2] in modules}
        graph[path.stem] = targets - {path.stem}
    return graph


def test_the_estimator_runtime_modules_import_one_way():
    """trainer, evaluator, predictor, saved_model and distributed build and run the graphs through the Estimator
    they are handed (tf.estimator's methods: _call_model_fn, _create_and_assert_global_step, ...) without
    importing estimator.py, whose Estimator calls them; only the modules that need the class itself import it."""
    graph = _estimator_runtime_graph()
    cycle = _cycle(graph)
    assert cycle is None, "estimator/runtime modules import each other: " + " -> ".join(cycle or [])
    importers = {module for module, targets in graph.items() if "estimator" in targets}
    assert importers == {"__init__", "v1", "extenders", "training", "early_stopping"}, importers
    assert {"trainer", "evaluator", "distributed"} <= graph["estimator"]  # the graph is real


def test_tf_free_packages_load_without_tensorflow():
    code = "import sys, cerebras_tf.ir, cerebras_tf.amp, cerebras_tf.wse; print('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_the_cerebras_name_stand_ins_are_the_top_layer():
    """cerebras_tf.csoft serves the Cerebras package names on request; nothing of the project imports it, so
    no run depends on whether the names are served."""
    offending = [f"{path.relative_to(ROOT)} imports {name}" for path in _sources()
                 if _file_unit(path) != "cerebras_tf.csoft"
                 for name in sorted(_imports(path)) if _unit(name) == "cerebras_tf.csoft"]
    assert not offending, "\n".join(offending)
    assert "cerebras_tf.csoft" in _package_graph()  # the unit is real
