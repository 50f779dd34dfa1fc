"""The child process of benchmarks/upstream_estimator_tests.py: runs one upstream test file, test by test.

    python -m benchmarks.upstream_runner --file PATH --mode {tf.estimator,runtime} --out RESULTS.jsonl
                                         [--disable-v2-behavior] [--skip TEST_ID ...]

It imports tensorflow/estimator's test file PATH in place (by its path, under a private module name, so its
`if __name__ == "__main__": tf.test.main()` does not run), collects its unittest tests, runs them one at a time
and appends one JSON line per event to RESULTS.jsonl: {"start": id} before a test, then {"id", "outcome",
"error", "message", "traceback", "seconds", "upstream_estimator", "distributed_config", "upstream_privates",
"runtime_privates", "upstream_names"} after it (flushed at once, so the parent knows which test was running if
this process hangs or dies). Outcomes: pass, fail, error, skip, xfail, xpass.

--mode runtime first calls `substitute()`: cerebras-tf's runtime takes the place of tf.estimator's public
objects (see its docstring), before the test file imports anything from tensorflow_estimator; after the import
the file's references to upstream modules become _ModuleViews. --mode tf.estimator changes nothing (the
baseline). `upstream_estimator` says whether the test built tensorflow_estimator's own Estimator class (or a
subclass: a canned estimator); in runtime mode such a test ran upstream's Estimator, not ours.
`distributed_config`: the test made or read a runtime RunConfig with parameter servers or a distribute
strategy. The *_privates and upstream_names lists: what the test read through the _ModuleViews.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
import types
import unittest
from typing import Any

# tf.estimator's public namespaces (as the API generator wrote them into the tensorflow-estimator wheel) and the
# runtime namespace that serves each (substitute() says what becomes of a name the runtime lacks).
API_NAMESPACES = {
    "tensorflow_estimator.python.estimator.api._v2.estimator": "estimator.runtime",
    "tensorflow_estimator.python.estimator.api._v2.estimator.experimental": "estimator.runtime.experimental",
    "tensorflow_estimator.python.estimator.api._v2.estimator.export": "estimator.runtime.export",
    "tensorflow_estimator.python.estimator.api._v1.estimator": "estimator.runtime",
    "tensorflow_estimator.python.estimator.api._v1.estimator.experimental": "estimator.runtime.experimental",
    "tensorflow_estimator.python.estimator.api._v1.estimator.export": "estimator.runtime.export",
}
# tf.compat.v1.estimator names whose object differs from tf.estimator's (v1 Estimator keeps the deprecated
# export_savedmodel): served by the runtime's v1 namespace when the runtime has one.
V1_NAMESPACE = "estimator.runtime.v1"

_upstream_estimator_built = False
# Per test (runtime mode): whether a RunConfig of the runtime had parameter servers in its cluster or a
# distribute strategy (such a test is about distributed training).
_distributed_config = False


def _unwrap(module: Any) -> Any:
    """The module behind TF's TFModuleWrapper (tf.compat.v1's deprecation wrapper), or the module itself."""
    return getattr(module, "_tfmw_wrapped_module", module)


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def public_objects() -> dict[tuple[str, str], Any]:
    """{(api namespace, public name): upstream's object} over tf.estimator's and tf.compat.v1.estimator's
    top level, experimental and export namespaces (subnamespaces themselves left out)."""
    found: dict[tuple[str, str], Any] = {}
    for namespace in API_NAMESPACES:
        module = _unwrap(importlib.import_module(namespace))
        for name, value in vars(module).items():
            if name.startswith("_") or isinstance(value, types.ModuleType):
                continue
            found[(namespace, name)] = value
    return found


def shown_namespace(namespace: str) -> str:
    """An API namespace module as users write it: tf.estimator.export, tf.compat.v1.estimator, ..."""
    version = "_v1" if "api._v1." in namespace + "." else "_v2"
    tail = namespace.split(f"api.{version}.estimator", 1)[1]
    return ("tf.compat.v1.estimator" if version == "_v1" else "tf.estimator") + tail


def _runtime_object(namespace: str, name: str) -> Any:
    """The runtime's object for a public name, or None when the runtime has none."""
    if namespace.endswith("api._v1.estimator"):
        v1 = _import(V1_NAMESPACE)
        if v1 is not None and hasattr(v1, name):
            return getattr(v1, name)
    runtime_namespace = _import(API_NAMESPACES[namespace])
    return getattr(runtime_namespace, name, None) if runtime_namespace is not None else None


# Upstream modules the test files import, and the runtime module with the same role. In the test file's view of
# such a module (a _ModuleView), a name substitute() did not replace (`training._TrainingExecutor`,
# `export.SupervisedInputReceiver`) is the runtime module's object of that name when it has one, else upstream's
# (recorded per test).
COUNTERPARTS = {
    "tensorflow_estimator.python.estimator.estimator": "estimator.runtime.estimator",
    "tensorflow_estimator.python.estimator.estimator_lib": "estimator.runtime",
    "tensorflow_estimator.python.estimator.training": "estimator.runtime.training",
    "tensorflow_estimator.python.estimator.run_config": "estimator.runtime.run_config",
    "tensorflow_estimator.python.estimator.model_fn": "estimator.runtime.spec",
    "tensorflow_estimator.python.estimator.exporter": "estimator.runtime.exporter",
    "tensorflow_estimator.python.estimator.export.export": "estimator.runtime.receivers",
    "tensorflow_estimator.python.estimator.export.export_lib": "estimator.runtime.receivers",
    "tensorflow_estimator.python.estimator.hooks.hooks": "estimator.runtime.training_hooks",
    "tensorflow_estimator.python.estimator.early_stopping": "estimator.runtime.early_stopping",
    "tensorflow_estimator.python.estimator.extenders": "estimator.runtime.extenders",
    "tensorflow_estimator.python.estimator.mode_keys": "estimator.runtime.mode_keys",
}
# Upstream objects defined here are the canned estimators, heads and feature-column helpers: not part of the
# runtime (DESIGN: canned estimators and feature-column helpers excepted), so they stay upstream's.
EXCLUDED_PACKAGES = ("tensorflow_estimator.python.estimator.canned", "tensorflow_estimator.python.estimator.head")

# Per test: the upstream private names the test file read through a _ModuleView that the runtime has no
# counterpart for (so upstream's own object was used).
upstream_privates_used: set[str] = set()
# Per test: the private names it read through a _ModuleView that the runtime's counterpart module has (so the
# test used the runtime's own internals, e.g. training._TrainingExecutor).
runtime_privates_used: set[str] = set()
# Per test: the other (non-private, non-API) upstream names it read that way (constants, helper types).
upstream_names_used: set[str] = set()
# id() of every object substitute() put in upstream's modules.
substituted_ids: set[int] = set()


class NotInRuntime:
    """Stands for a public tf.estimator name the runtime does not provide: any use fails, saying so."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def _fail(self) -> Exception:
        return NotImplementedError(f"{self._name} is not provided by cerebras-tf's Estimator runtime")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._fail()

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise self._fail()

    def __repr__(self) -> str:
        return f"<{self._name}: not in the runtime>"


def _excluded(original: Any) -> bool:
    return getattr(original, "__module__", "").startswith(EXCLUDED_PACKAGES)


def substitute() -> dict[str, Any]:
    """Put cerebras-tf's runtime in place of tf.estimator's public objects; returns what was replaced.

    For every public name of tf.estimator and tf.compat.v1.estimator (top level, experimental, export), every
    reference to upstream's object in tensorflow_estimator's modules becomes the runtime's object of that name
    (estimator.runtime, estimator.runtime.experimental, estimator.runtime.export; estimator.runtime.v1 for
    tf.compat.v1-only differences): in the API namespaces behind tf.estimator / tf.compat.v1.estimator, in the
    modules that define the objects (estimator.Estimator and estimator.EstimatorV2, model_fn.EstimatorSpec,
    run_config.RunConfig, training.train_and_evaluate, ...) and in those that re-export them (estimator_lib,
    export.export_lib, ...). Test files import these modules afterwards, so `estimator.EstimatorV2(...)`,
    `model_fn_lib.EstimatorSpec(...)` and `tf.estimator.RunConfig()` all reach the runtime.
    A public name the runtime lacks becomes a NotInRuntime that fails when used, except the canned estimators,
    heads and feature-column helpers (EXCLUDED_PACKAGES), which stay upstream's. Objects the runtime shares with
    tf.estimator (TF's hooks and ExportOutput classes) are the same object: nothing to replace. A TF object the
    runtime does not re-export is replaced in the API namespaces only (TF's own modules keep it).
    """
    import tensorflow as tf

    originals = public_objects()  # imports every upstream module the API namespaces name (canned ones too)
    everywhere: dict[int, tuple[Any, Any]] = {}  # id(upstream object) -> (it, the runtime's)
    in_api_only: dict[int, tuple[Any, Any]] = {}
    report: dict[str, list[str]] = {"replaced": [], "not_in_runtime": [], "excluded": [], "shared": []}
    for (namespace, name), original in sorted(originals.items()):
        shown = f"{shown_namespace(namespace)}.{name}"
        ours = _runtime_object(namespace, name)
        if ours is original:
            report["shared"].append(shown)
        elif ours is not None:
            everywhere[id(original)] = (original, ours)
            report["replaced"].append(shown)
        elif _excluded(original):
            report["excluded"].append(shown)
        else:
            stub = (original, NotInRuntime(shown))
            tensorflow_estimator_object = getattr(original, "__module__", "").startswith("tensorflow_estimator")
            (everywhere if tensorflow_estimator_object else in_api_only).setdefault(id(original), stub)
            report["not_in_runtime"].append(shown)
    # The tf.estimator lazy loaders copy the module's names into themselves once loaded: load them now.
    loaders = []
    for parent in (tf, tf.compat.v1, tf.compat.v2):
        loader = parent.estimator
        loader.Estimator  # noqa: B018 - loads it
        loaders.append(loader)
        for sub in ("experimental", "export"):
            loaders.append(getattr(loader, sub))
    api_modules = [importlib.import_module(namespace) for namespace in API_NAMESPACES] + loaders
    api_ids = {id(m) for m in api_modules} | {id(_unwrap(m)) for m in api_modules}
    targets = [module for name, module in list(sys.modules.items())
               if name.startswith("tensorflow_estimator") and module is not None] + loaders
    for target in targets:
        for holder in {id(target): target, id(_unwrap(target)): _unwrap(target)}.values():
            for attr, value in list(vars(holder).items()):
                entry = everywhere.get(id(value))
                if entry is None and id(holder) in api_ids:
                    entry = in_api_only.get(id(value))
                if entry is not None and entry[0] is value:
                    setattr(holder, attr, entry[1])
                    substituted_ids.add(id(entry[1]))
    return {key: sorted(set(names)) for key, names in report.items()}


class _ModuleView(types.ModuleType):
    """A test file's view of an upstream module with a runtime counterpart (COUNTERPARTS).

    A name substitute() replaced (a public tf.estimator object) is the runtime's object, as in the module
    itself. Any other name is the counterpart module's object of the same name when it has one (the runtime
    mirrors upstream's names: training._TrainingExecutor, receivers.SupervisedInputReceiver, ...), else
    upstream's own, noted per test (upstream_privates_used / upstream_names_used). Setting or deleting a
    name (mock.patch.object) acts where the name was found, so a mock of training._TrainingExecutor is the
    one the runtime's train_and_evaluate calls.
    """

    def __init__(self, upstream: Any, counterpart: Any) -> None:
        super().__init__(upstream.__name__, upstream.__doc__)
        object.__setattr__(self, "_view_upstream", upstream)
        object.__setattr__(self, "_view_counterpart", counterpart)

    def _view_home(self, name: str, note: bool = False) -> Any:
        upstream = object.__getattribute__(self, "_view_upstream")
        counterpart = object.__getattribute__(self, "_view_counterpart")
        if name.startswith("__"):
            return upstream
        if id(upstream.__dict__.get(name)) in substituted_ids:
            return upstream
        if hasattr(counterpart, name):
            if note and name.startswith("_"):
                runtime_privates_used.add(f"{upstream.__name__.rsplit('.', 1)[-1]}.{name}")
            return counterpart
        if note and hasattr(upstream, name) and not isinstance(getattr(upstream, name), types.ModuleType):
            used = upstream_privates_used if name.startswith("_") else upstream_names_used
            used.add(f"{upstream.__name__.rsplit('.', 1)[-1]}.{name}")
        return upstream

    def __getattribute__(self, name: str) -> Any:
        if name in ("_view_home", "__class__", "_view_upstream", "_view_counterpart"):
            return object.__getattribute__(self, name)
        if name == "__dict__":  # what mock.patch reads to restore a patched name by setting it back
            return _ViewDict(self)
        return getattr(object.__getattribute__(self, "_view_home")(name, note=True), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._view_home(name), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._view_home(name), name)


class _ViewDict(dict):
    """A _ModuleView's names as a mapping: each the value the view gives for it (read only)."""

    def __init__(self, view: _ModuleView) -> None:
        super().__init__()
        self._view = view

    def _names(self) -> set[str]:
        upstream = object.__getattribute__(self._view, "_view_upstream")
        counterpart = object.__getattribute__(self._view, "_view_counterpart")
        return set(vars(upstream)) | {name for name in vars(counterpart) if not name.startswith("__")}

    def __getitem__(self, name: str) -> Any:
        if name not in self._names():
            raise KeyError(name)
        return getattr(self._view, name)

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Any:
        return iter(sorted(self._names()))

    def __len__(self) -> int:
        return len(self._names())

    def keys(self) -> Any:
        return sorted(self._names())

    def items(self) -> Any:
        return [(name, self[name]) for name in self.keys()]

    def values(self) -> Any:
        return [self[name] for name in self.keys()]

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default


def _install_views(test_module: Any) -> None:
    """Make the test file's references to upstream modules with a runtime counterpart _ModuleViews."""
    for attr, value in list(vars(test_module).items()):
        if isinstance(value, types.ModuleType) and value.__name__ in COUNTERPARTS:
            counterpart = _import(COUNTERPARTS[value.__name__])
            if counterpart is not None:
                setattr(test_module, attr, _ModuleView(value, counterpart))


def _watch_upstream_estimator() -> None:
    """Note when tensorflow_estimator's own Estimator (or a subclass: canned estimators) is built.

    Called before substitute(), which replaces the module's `Estimator` by the runtime's."""
    from tensorflow_estimator.python.estimator import estimator as upstream

    cls = upstream.Estimator
    original_init = cls.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        global _upstream_estimator_built
        _upstream_estimator_built = True
        original_init(self, *args, **kwargs)

    cls.__init__ = init


def _watch_runtime_run_config() -> None:
    """Note when a test makes or uses a runtime RunConfig with parameter servers (TF_CONFIG) or a distribute
    strategy (tests often make their configs before they run, in the TestCase's constructor: such a config is
    marked, and a test reading any of its settings is noted)."""
    from estimator.runtime.run_config import RunConfig

    original_init_cluster, original_set = RunConfig._init_cluster, RunConfig._set
    mark = "_harness_distributed"

    def note(config: Any) -> None:
        global _distributed_config
        _distributed_config = True
        object.__setattr__(config, mark, True)

    def init_cluster(self: Any, settings: Any) -> None:
        original_init_cluster(self, settings)
        if settings.num_ps_replicas:
            note(self)

    def set_(self: Any, **kwargs: Any) -> Any:
        if any(kwargs.get(name) is not None for name in ("train_distribute", "eval_distribute",
                                                         "experimental_distribute")):
            note(self)
        return original_set(self, **kwargs)

    def getattribute(self: Any, name: str) -> Any:
        global _distributed_config
        if not name.startswith("__") and object.__getattribute__(self, "__dict__").get(mark):
            _distributed_config = True
        return object.__getattribute__(self, name)

    RunConfig._init_cluster = init_cluster  # type: ignore[method-assign]
    RunConfig._set = set_  # type: ignore[method-assign]
    RunConfig.__getattribute__ = getattribute  # type: ignore[method-assign]


def _iter_tests(suite: Any) -> Any:
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _iter_tests(item)
        else:
            yield item


class _Result(unittest.TestResult):
    """Keeps the outcome of the one test run with it."""

    def __init__(self) -> None:
        super().__init__()
        self.outcome = "pass"
        self.error: str | None = None
        self.message: str | None = None

    def _record(self, outcome: str, err: Any) -> None:
        if self.outcome in ("fail", "error"):
            return  # the first failure counts (a tearDown error after a failure adds nothing)
        self.outcome = outcome
        if err is not None:
            exc_type, exc, tb = err
            self.error = exc_type.__name__
            self.message = str(exc)[:2000]
            self.traceback = "".join(traceback.format_exception(exc_type, exc, tb))[-4000:]

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802 - unittest's name
        self._record("error", err)

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        self._record("fail", err)

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
        self.outcome, self.message = "skip", reason

    def addExpectedFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        self.outcome = "xfail"

    def addUnexpectedSuccess(self, test: Any) -> None:  # noqa: N802
        self.outcome = "xpass"

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        if err is not None:
            self._record("fail" if issubclass(err[0], test.failureException) else "error", err)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--file", required=True)
    parser.add_argument("--mode", choices=("tf.estimator", "runtime"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--skip", nargs="*", default=[])
    parser.add_argument("--disable-v2-behavior", action="store_true",
                        help="tf.compat.v1.disable_v2_behavior() first, as upstream's BUILD does for some files")
    args = parser.parse_args(argv)
    if args.disable_v2_behavior:
        import tensorflow as tf

        tf.compat.v1.disable_v2_behavior()

    from absl import flags

    flags.FLAGS(sys.argv[:1])  # tf.test.TestCase reads absl flags (test_tmpdir): mark them parsed
    out = open(args.out, "a", buffering=1)  # noqa: SIM115 - line-buffered for the whole run

    def emit(record: dict[str, Any]) -> None:
        out.write(json.dumps(record) + "\n")
        out.flush()
        os.fsync(out.fileno())

    _watch_upstream_estimator()
    if args.mode == "runtime":
        emit({"substitution": substitute()})
        _watch_runtime_run_config()
    name = "upstream_" + os.path.splitext(os.path.basename(args.file))[0]
    spec = importlib.util.spec_from_file_location(name, args.file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if args.mode == "runtime":
        _install_views(module)
    tests = list(_iter_tests(unittest.defaultTestLoader.loadTestsFromModule(module)))
    skip = set(args.skip)
    global _upstream_estimator_built, _distributed_config
    for test in tests:
        test_id = test.id().split(".", 1)[1]
        if test_id in skip:
            continue
        emit({"start": test_id})
        _upstream_estimator_built = _distributed_config = False
        upstream_privates_used.clear()
        runtime_privates_used.clear()
        upstream_names_used.clear()
        result = _Result()
        started = time.time()
        test.run(result)
        emit({"id": test_id, "outcome": result.outcome, "error": result.error, "message": result.message,
              "traceback": getattr(result, "traceback", None), "seconds": round(time.time() - started, 2),
              "upstream_estimator": _upstream_estimator_built,
              "distributed_config": _distributed_config, "upstream_privates": sorted(upstream_privates_used),
              "runtime_privates": sorted(runtime_privates_used),
              "upstream_names": sorted(upstream_names_used)})
    emit({"done": True})
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
