"""tensorflow/estimator's own unit tests (v2.15.0) as the yardstick of our Estimator runtime (estimator/runtime/).

    /work/main/.venv-3.11/bin/python -m benchmarks.upstream_estimator_tests --upstream DIR
        [--tests estimator_test,run_config_test,...] [--results DIR] [--reuse-baseline] [--jobs N]
        [--test-timeout SECS] [--only-runtime] [--json FILE] [--verbose]

DIR is a checkout of github.com/tensorflow/estimator at tag v2.15.0 (nothing is fetched at run time), e.g.
`git --git-dir=<bare clone> archive v2.15.0 | tar -x -C /tmp/tf-estimator-2.15`. Its test files are run in
place, never copied: each file in a subprocess of its own (benchmarks/upstream_runner.py) with this Python,
which must be the TF 2.15 stack with tensorflow-estimator 2.15 installed (Python 3.11, .venv-3.11), twice
(estimator_test with TF 2 behaviour disabled, as upstream's BUILD runs it):

  tf.estimator  as-is: the baseline, upstream's tests against upstream's code;
  runtime       with cerebras-tf's runtime put in place of tf.estimator's public objects.

How the runtime takes tf.estimator's place (upstream_runner.substitute and _ModuleView):
  1. Before the test file is imported, every public name of tf.estimator and tf.compat.v1.estimator (top
     level, .experimental, .export; the tensorflow-estimator wheel's generated API modules list them) is
     pointed at the runtime's object of that name (estimator.runtime, estimator.runtime.experimental,
     estimator.runtime.export; estimator.runtime.v1 for the tf.compat.v1 Estimator) wherever
     tensorflow_estimator's modules hold upstream's object: the API namespaces behind tf.estimator and
     tf.compat.v1.estimator, the defining modules (`estimator.Estimator`/`EstimatorV2`,
     `model_fn.EstimatorSpec`, `run_config.RunConfig`, `training.train_and_evaluate`, `exporter.*`,
     `export.export.*`, `hooks.hooks.*`, `mode_keys.ModeKeys`) and re-exporting ones (`estimator_lib`,
     `export.export_lib`). So `estimator.EstimatorV2(...)`, `model_fn_lib.EstimatorSpec(...)`,
     `tf.estimator.RunConfig()` in a test build the runtime's objects, and the code under test is ours.
     A public name the runtime lacks becomes a stub that fails when used ("... is not provided by
     cerebras-tf's Estimator runtime"), except canned estimators, heads and feature-column helpers, which
     stay upstream's (tests that build one are marked "canned"; they show whether the runtime's functions
     accept tf.estimator's estimators). TF's own objects that tf.estimator re-exports (the session hooks,
     ExportOutput classes) are the same objects in both.
  2. After the import, the test file's references to upstream modules with a runtime counterpart
     (training -> estimator.runtime.training, run_config -> run_config, estimator -> estimator,
     export.export -> receivers, hooks.hooks -> training_hooks, ...; upstream_runner.COUNTERPARTS) become
     views. A name step 1 did not replace is the counterpart's object of the same name when it has one:
     `export.SupervisedInputReceiver`, or a private one such as `training._TrainingExecutor` (the runtime
     mirrors upstream's internal names, so a test of train_and_evaluate's executor tests ours, and
     mock.patch.object on the view patches ours). Otherwise it is upstream's own object, and the test's
     record says so: "upstream privates" (e.g. estimator._load_global_step_from_checkpoint_dir, with which
     tests read a checkpoint's step) and other upstream names (constants such as run_config.TaskType).

The table shows, per file, the tests that pass on tf.estimator and, of those, the ones that pass on the
runtime; then the tests that pass on tf.estimator but fail on the runtime, grouped by their error, each
labelled, first match first: canned (built an upstream canned estimator), distribution/ps (made or read a
runtime RunConfig with parameter servers from TF_CONFIG or a distribute strategy, or the test's name or its
error names distribution), private (read a private name of an upstream module, upstream's object or the
runtime's of the same name, or a private member the runtime's objects lack), or other.

Each test runs with a per-test time limit (--test-timeout); a test that hangs or crashes its process is
recorded as such and the file resumes after it in a new process. Results go to --results (JSONL per file and
mode; default a temporary directory); --reuse-baseline reuses complete baseline results found there, and
--only-runtime runs only the runtime side against them. --tests also takes early_stopping_test and
extenders_test (upstream's tests of API the runtime added for issue 25; not in the issue's suite).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The suite: short name -> path in the checkout.
TEST_FILES = {
    "estimator_test": "tensorflow_estimator/python/estimator/estimator_test.py",
    "run_config_test": "tensorflow_estimator/python/estimator/run_config_test.py",
    "training_test": "tensorflow_estimator/python/estimator/training_test.py",
    "exporter_test": "tensorflow_estimator/python/estimator/exporter_test.py",
    "export_test": "tensorflow_estimator/python/estimator/export/export_test.py",
    "model_fn_test": "tensorflow_estimator/python/estimator/model_fn_test.py",
    "hooks_test": "tensorflow_estimator/python/estimator/hooks/hooks_test.py",
}
# Not in issue 25's suite, run on request (--tests): the tests of API the runtime added for it.
EXTRA_TEST_FILES = {
    "early_stopping_test": "tensorflow_estimator/python/estimator/early_stopping_test.py",
    "extenders_test": "tensorflow_estimator/python/estimator/extenders_test.py",
}
ALL_TEST_FILES = {**TEST_FILES, **EXTRA_TEST_FILES}
# Files upstream runs with TF 2 behaviour disabled (tensorflow_estimator/python/estimator/BUILD: estimator_test
# has "an internal build dep disabling tf2 behavior"; 33 of its tests are v1-only): so does this harness.
V1_BEHAVIOUR = {"estimator_test"}
MODES = ("tf.estimator", "runtime")
PASSED = ("pass", "xfail")
_DISTRIBUTION = re.compile(r"distribut|strateg|parameter ?server|\bps\b|`ps`|run_?ps|mirrored|collective", re.I)


def _child_env(tmp: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", TMPDIR=tmp, TEST_TMPDIR=tmp,
               PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""), PYTHONWARNINGS="ignore")
    env.pop("TF_CONFIG", None)
    env.pop("CEREBRAS_TF_ESTIMATOR", None)
    return env


def _read(path: str) -> tuple[dict[str, dict[str, Any]], str | None, bool, dict[str, Any] | None]:
    """(finished tests by id, the test started but not finished, whether the file ran to its end, the
    substitution report) from a results file."""
    results: dict[str, dict[str, Any]] = {}
    running, done, substitution = None, False, None
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a kill
                if "start" in record:
                    running = record["start"]
                elif "id" in record:
                    results[record["id"]] = record
                    running = None
                elif "substitution" in record:
                    substitution = record["substitution"]
                elif record.get("done"):
                    done = True
    return results, running, done, substitution


def run_file(python: str, path: str, mode: str, out: str, test_timeout: float, verbose: bool,
             v1_behaviour: bool = False) -> None:
    """Run one test file in one mode to the end, restarting after a test that hangs or kills the process."""
    while True:
        results, _, done, _ = _read(out)
        if done:
            return
        tmp = tempfile.mkdtemp(prefix="upstream-estimator-")
        command = [python, "-m", "benchmarks.upstream_runner", "--file", path, "--mode", mode, "--out", out,
                   *(["--disable-v2-behavior"] if v1_behaviour else []), "--skip", *results]
        log = open(out + ".log", "a")  # noqa: SIM115 - the child's stderr, kept for reading failures
        process = subprocess.Popen(command, cwd=ROOT, env=_child_env(tmp), stdout=log, stderr=log,
                                   start_new_session=True)
        last, since = None, time.time()
        reason = None
        while process.poll() is None:
            time.sleep(1)
            _, running, _, _ = _read(out)
            if running != last:
                last, since = running, time.time()
            elif running is not None and time.time() - since > test_timeout:
                reason = f"timeout: over {test_timeout:.0f} s"
                os.killpg(process.pid, 9)
                process.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
        results, running, done, _ = _read(out)
        if done:
            return
        if running is None:  # died between tests (import error, or crash in the harness itself)
            with open(out + ".log") as f:
                tail = f.read()[-3000:]
            raise RuntimeError(f"{os.path.basename(path)} ({mode}) stopped outside any test:\n{tail}")
        reason = reason or f"process died (exit code {process.returncode})"
        if verbose:
            print(f"  {os.path.basename(path)} [{mode}] {running}: {reason}", file=sys.stderr)
        with open(out, "a") as f:
            f.write(json.dumps({"id": running, "outcome": "error", "error": "Crash", "message": reason,
                                "seconds": None, "upstream_estimator": False, "upstream_privates": []}) + "\n")


def _signature(record: dict[str, Any]) -> str:
    """A failure's group: its exception type and the first line of its message, with the parts that differ
    from test to test (paths, numbers, addresses, quoted names) blurred."""
    message = (record.get("message") or "").strip().splitlines()
    first = message[0] if message else ""
    first = re.sub(r"/[\w./+-]+", "<path>", first)
    first = re.sub(r"0x[0-9a-f]+", "<addr>", first)
    first = re.sub(r"(?<![\w.])\d+(\.\d+)?", "<n>", first)
    return f"{record.get('error')}: {first[:160]}"


def _label(record: dict[str, Any], test_id: str) -> str:
    if record.get("upstream_estimator"):
        return "canned"
    text = f"{test_id} {record.get('message') or ''}"
    if record.get("distributed_config") or _DISTRIBUTION.search(text):
        return "distribution/ps"
    if (record.get("upstream_privates") or record.get("runtime_privates")
            or re.search(r"has no attribute '_|object has no attribute \"_", text)):
        return "private"
    return "other"


def summarize(name: str, base: dict[str, dict[str, Any]], ours: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    baseline_pass = sorted(t for t, r in base.items() if r["outcome"] in PASSED)
    summary: dict[str, Any] = {"file": name, "tests": len(base), "baseline_pass": len(baseline_pass)}
    if ours is None:
        return summary
    runtime_pass = [t for t in baseline_pass if ours.get(t, {}).get("outcome") in PASSED]
    failing = {t: ours.get(t, {"outcome": "missing", "error": "Missing", "message": "not run"})
               for t in baseline_pass if t not in runtime_pass}
    groups: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for test_id, record in sorted(failing.items()):
        groups[_signature(record)].append((test_id, _label(record, test_id)))
    summary.update(
        runtime_pass=len(runtime_pass),
        runtime_pass_using_upstream_privates={t: ours[t]["upstream_privates"] for t in runtime_pass
                                              if ours[t].get("upstream_privates")},
        runtime_pass_with_canned=sorted(t for t in runtime_pass if ours[t].get("upstream_estimator")),
        failing=dict(sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))),
        labels=collections.Counter(label for tests in groups.values() for _, label in tests),
        upstream_names=sorted({n for r in ours.values() for n in r.get("upstream_names") or []}),
        only_runtime_pass=sorted(t for t, r in ours.items() if r["outcome"] in PASSED and t not in baseline_pass),
    )
    return summary


def print_report(summaries: list[dict[str, Any]], substitution: dict[str, Any] | None) -> None:
    print(f"{'test file':<18} {'tests':>5} {'tf.estimator':>12} {'runtime':>8}  failing on the runtime by label")
    totals = collections.Counter()
    for s in summaries:
        labels = s.get("labels") or {}
        shown = ", ".join(f"{label} {count}" for label, count in sorted(labels.items())) or "-"
        runtime = s.get("runtime_pass", "-")
        print(f"{s['file']:<18} {s['tests']:>5} {s['baseline_pass']:>12} {runtime:>8}  {shown}")
        totals.update(tests=s["tests"], baseline_pass=s["baseline_pass"], runtime_pass=s.get("runtime_pass", 0))
        totals.update(labels)
    if len(summaries) > 1:
        shown = ", ".join(f"{k} {v}" for k, v in sorted(totals.items())
                          if k not in ("tests", "baseline_pass", "runtime_pass")) or "-"
        print(f"{'total':<18} {totals['tests']:>5} {totals['baseline_pass']:>12} {totals['runtime_pass']:>8}  "
              f"{shown}")
    for s in summaries:
        if s.get("upstream_names"):
            print(f"\n== {s['file']}: other upstream names the tests read (not tf.estimator API, no runtime "
                  f"counterpart): {', '.join(s['upstream_names'])}")
        if not s.get("failing") and not s.get("runtime_pass_using_upstream_privates"):
            continue
        print(f"\n== {s['file']}: pass on tf.estimator, fail on the runtime ({s['baseline_pass'] - s['runtime_pass']})")
        for signature, tests in s["failing"].items():
            print(f"  [{len(tests)}] {signature}")
            for test_id, label in tests:
                print(f"        {test_id}  ({label})")
        if s["runtime_pass_using_upstream_privates"]:
            print("  passing on the runtime while using upstream privates (test helpers reading results):")
            for test_id, names in s["runtime_pass_using_upstream_privates"].items():
                print(f"        {test_id}: {', '.join(names)}")
        if s["runtime_pass_with_canned"]:
            print(f"  passing on the runtime with an upstream canned estimator: {len(s['runtime_pass_with_canned'])}")
        if s["only_runtime_pass"]:
            print(f"  pass on the runtime only: {', '.join(s['only_runtime_pass'])}")
    if substitution:
        print("\nPublic names the runtime does not provide (stubs that fail when used):")
        print("  " + (", ".join(substitution["not_in_runtime"]) or "none"))
        print(f"Kept upstream's (canned estimators, heads, feature-column helpers): {len(substitution['excluded'])}; "
              f"replaced by the runtime's: {len(substitution['replaced'])}; the same object in both: "
              f"{len(substitution['shared'])}.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True, help="a checkout of tensorflow/estimator at v2.15.0")
    parser.add_argument("--tests", default=",".join(TEST_FILES),
                        help=f"comma-separated, of {', '.join(ALL_TEST_FILES)} (default: {', '.join(TEST_FILES)})")
    parser.add_argument("--results", help="directory for the per-file results (default: a temporary one)")
    parser.add_argument("--reuse-baseline", action="store_true", help="reuse complete baseline results in --results")
    parser.add_argument("--only-runtime", action="store_true", help="skip the baseline (needs --reuse-baseline "
                        "results to compare with)")
    parser.add_argument("--python", default=sys.executable, help="the TF 2.15 + tensorflow-estimator Python")
    parser.add_argument("--jobs", type=int, default=1, help="test files run at once (default 1)")
    parser.add_argument("--test-timeout", type=float, default=90.0, help="seconds one test may take")
    parser.add_argument("--json", help="also write the summaries to this file")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)

    names = [n.strip() for n in args.tests.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_TEST_FILES]
    if unknown:
        parser.error(f"unknown test files {unknown}; known: {', '.join(ALL_TEST_FILES)}")
    missing = [ALL_TEST_FILES[n] for n in names
               if not os.path.isfile(os.path.join(args.upstream, ALL_TEST_FILES[n]))]
    if missing:
        parser.error(f"{args.upstream} is not a tensorflow/estimator checkout: missing {missing}")
    results_dir = args.results or tempfile.mkdtemp(prefix="upstream-estimator-results-")
    os.makedirs(results_dir, exist_ok=True)

    def out_path(name: str, mode: str) -> str:
        return os.path.join(results_dir, f"{name}.{mode.replace('.', '_')}.jsonl")

    jobs = []
    for name in names:
        for mode in MODES:
            out = out_path(name, mode)
            if mode == "tf.estimator" and (args.reuse_baseline or args.only_runtime) and _read(out)[2]:
                continue
            if mode == "tf.estimator" and args.only_runtime:
                parser.error(f"--only-runtime: no complete baseline for {name} in {results_dir}")
            for stale in (out, out + ".log"):
                if os.path.exists(stale):
                    os.remove(stale)
            jobs.append((name, mode, out))
    started = time.time()

    def run(job: tuple[str, str, str]) -> None:
        name, mode, out = job
        t0 = time.time()
        run_file(args.python, os.path.join(args.upstream, ALL_TEST_FILES[name]), mode, out, args.test_timeout,
                 args.verbose, v1_behaviour=name in V1_BEHAVIOUR)
        if args.verbose:
            print(f"  {name} [{mode}] done in {time.time() - t0:.0f} s", file=sys.stderr)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(run, jobs))
    summaries, substitution = [], None
    for name in names:
        base = _read(out_path(name, "tf.estimator"))[0]
        ours, _, _, report = _read(out_path(name, "runtime"))
        substitution = substitution or report
        summaries.append(summarize(name, base, ours))
    print(f"tensorflow/estimator's tests from {args.upstream} ({time.time() - started:.0f} s; results in "
          f"{results_dir})\n")
    print_report(summaries, substitution)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summaries": summaries, "substitution": substitution}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
