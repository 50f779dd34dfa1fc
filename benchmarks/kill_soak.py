"""kill -9 soak: a training run on the simulated WSE, SIGKILLed at random moments (most of them while a
checkpoint is being written) and resumed each time, ends bit for bit where an uninterrupted run ends
(issue 24, item 8). Outside the regular test suite: about a minute per numerics on 2 cores.

    python -m benchmarks.kill_soak [--kills 10] [--steps 5000] [--numerics float32,float16] [--seed S]
    ./dev bench kill_soak [same arguments]

The run is tests/executor/kill_train_script.py: a tiny Adam regressor on the simulated WSE, a checkpoint
every 100 steps, keep_checkpoint_max=3, in the numerics --numerics names (amp.set_half_dtype: float16
rounds matmul inputs to half; float32 does not round; both scale the loss dynamically). Its data has --rows
(40) rows, 5 batches, repeated: like tf.estimator, a resumed run starts input_fn from its beginning, so a
killed series can equal an uninterrupted run only when the data's period divides the checkpoint interval
(--rows 64, 8 batches, is the negative control: resumed runs then see other batches, the verdict must be
DIFFERENT).

For each numerics:
  - an uninterrupted run to --steps in one model_dir (the reference);
  - in another model_dir, --kills times: start the script (it resumes from the latest checkpoint there)
    and SIGKILL it; then one last run to --steps. 80% of the kills aim at a checkpoint save: this process
    watches model_dir (every 0.2 ms) for the first file of a checkpoint it has not seen (a `*.tempstate*`
    file, or `model.ckpt-N.*` for a new N), lets 0-2 saves pass, and kills at once (half of them) or 0-3
    ms later (a save of this model takes a few ms: a later kill finds it done). The other kills fall at a
    uniform moment 1-6 s after the start (import, compile, steps or a save);
  - a row per kill: how it was aimed, when (seconds after that run started), what it left in model_dir
    that an unfinished save leaves (`*.tempstate*` files; a checkpoint whose files are in place but that
    the `checkpoint` file does not name yet; the `checkpoint` file's temporary copy; a checkpoint the
    `checkpoint` file no longer lists but that was not deleted yet), "mid-write" if anything, the step the
    next run restored from (its "Restoring ..." log line; 0: the initial values; "-": the next run was
    killed before it got there) and whether that run took over the dead run's trainer lock and removed
    partial files;
  - the verdict: every variable of the two final checkpoints (tf.train.load_checkpoint: weights, Adam
    slots and powers, global_step, the loss-scale state amp/*) has the same dtype and np.array_equal
    values, and no `*.tempstate*` file, `checkpoint.tmp*` or cerebras_tf.trainer.lock is left in the
    killed series' model_dir.

Exits non-zero if any numerics' final state differs, a run fails, a run did not restore the latest
checkpoint or take over the dead run's lock, a run finished before it could be killed (raise --steps), or
something is left behind. --keep keeps the model_dirs and logs (the work dir is printed).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from cerebras_tf.run.trainer_lock import LOCK_FILE  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "executor", "kill_train_script.py")
AIMED_FRACTION = 0.8
POLL_SECONDS = 0.0002
RANDOM_WINDOW = (1.0, 6.0)
RUN_TIMEOUT = 600.0
CHECKPOINT_FILE = re.compile(r"^model\.ckpt-(\d+)\.(index|data-\d+-of-\d+)(\.tempstate\d+)?$")


class Kill(NamedTuple):
    aim: str  # "save+1.3ms" / "random"
    seconds: float  # after the run's start
    left: str  # what the kill left in model_dir ("-": nothing of a save)
    mid_write: bool
    saved: int  # the latest checkpoint's step after the kill (0: none)
    lock_left: bool  # a trainer lock file is in model_dir after the kill


class Row(NamedTuple):
    kill: Kill
    resumed_from: int | None  # the next run's "Restoring" step (0: from the initial values)
    lock_taken_over: bool
    partial_removed: int


def _command(model_dir: str, steps: int, numerics: str, rows: int) -> list[str]:
    return [sys.executable, SCRIPT, model_dir, str(steps), "--numerics", numerics, "--rows", str(rows)]


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": ROOT + (os.pathsep + path if path else ""), "TF_CPP_MIN_LOG_LEVEL": "2"}


def _start(command: list[str], log_path: str) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=_env())


def _tail(log_path: str, lines: int = 15) -> str:
    with open(log_path) as log:
        return "".join(log.readlines()[-lines:])


class RunFailed(Exception):
    pass


def _run_to_end(command: list[str], log_path: str) -> float:
    started = time.monotonic()
    proc = _start(command, log_path)
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RunFailed(f"{' '.join(command)} did not finish in {RUN_TIMEOUT:.0f} s; log {log_path}:\n"
                        f"{_tail(log_path)}") from None
    if rc != 0:
        raise RunFailed(f"{' '.join(command)} exited with {rc}; log {log_path}:\n{_tail(log_path)}")
    return time.monotonic() - started


def _checkpoint_steps(names: Sequence[str]) -> set[int]:
    return {int(match.group(1)) for match in map(CHECKPOINT_FILE.match, names) if match}


def _checkpoint_state(model_dir: str) -> tuple[int, set[int]]:
    """The step of the checkpoint model_dir's `checkpoint` file names (0: none) and the steps it lists."""
    import tensorflow as tf

    state = tf.train.get_checkpoint_state(model_dir)
    if state is None or not state.model_checkpoint_path:
        return 0, set()
    step = lambda path: int(path.rsplit("-", 1)[1])  # noqa: E731
    return step(state.model_checkpoint_path), {step(path) for path in state.all_model_checkpoint_paths}


def save_traces(model_dir: str) -> dict[tuple[str, str], str]:
    """Traces of unfinished checkpoint saves in model_dir, each with its description: `*.tempstate*` files, a
    checkpoint newer than the one the `checkpoint` file names, the `checkpoint` file's temporary copy, and a
    checkpoint the `checkpoint` file no longer lists but that is still there (killed before deleting it)."""
    if not os.path.isdir(model_dir):  # killed before the run made it
        return {}
    names = os.listdir(model_dir)
    latest, listed = _checkpoint_state(model_dir)
    traces = {}
    for name in names:
        if ".tempstate" in name:
            traces["tempstate", name] = f"{name.split('.tempstate')[0]}.tempstate*"
        elif name.startswith("checkpoint.tmp"):
            traces["tmp", name] = "checkpoint.tmp* (the `checkpoint` file being replaced)"
    complete: dict[int, list[str]] = {}
    for match in map(CHECKPOINT_FILE.match, names):
        if match and not match.group(3):
            complete.setdefault(int(match.group(1)), []).append(match.string)
    for step, files in sorted(complete.items()):
        kinds = "+".join(sorted(name.split(".")[2].split("-")[0] for name in files))
        # the files' times in the key: a checkpoint saved again under the same step is a new trace
        when = str(max(_mtime(os.path.join(model_dir, name)) for name in files))
        if step > latest:
            traces["newer", f"{step}@{when}"] = f"ckpt-{step} {kinds} in place, not in `checkpoint`"
        elif step not in listed:
            traces["unlisted", f"{step}@{when}"] = f"ckpt-{step} dropped from `checkpoint`, not deleted"
    return traces


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return 0


def _kill_during_save(proc: subprocess.Popen, model_dir: str, rng: np.random.RandomState) -> str | None:
    """SIGKILL proc right after the first file of its (1 + 0..2)th new checkpoint appears; the aim, or None
    if proc ended first."""
    passes = rng.randint(0, 3)
    delay = 0.0 if rng.rand() < 0.5 else rng.uniform(0.0, 0.003)
    try:
        known = _checkpoint_steps(os.listdir(model_dir))
    except FileNotFoundError:
        known = set()
    while proc.poll() is None:
        try:
            new = _checkpoint_steps(os.listdir(model_dir)) - known
        except FileNotFoundError:
            new = set()
        if new:
            if passes == 0:
                if delay:
                    until = time.perf_counter() + delay
                    while time.perf_counter() < until:
                        pass
                proc.send_signal(signal.SIGKILL)
                return f"save+{delay * 1e3:.1f}ms"
            passes -= 1
            known |= new
        time.sleep(POLL_SECONDS)
    return None


def _kill_at_random(proc: subprocess.Popen, started: float, rng: np.random.RandomState) -> str | None:
    at = started + rng.uniform(*RANDOM_WINDOW)
    while proc.poll() is None and time.monotonic() < at:
        time.sleep(0.005)
    if proc.poll() is not None:
        return None
    proc.send_signal(signal.SIGKILL)
    return "random"


def _restored_from(log_path: str) -> tuple[int | None, bool, int]:
    """(the step the run restored from, 0 for the initial values, None if it was killed before it got
    there; whether it took over a dead trainer's lock; how many partial files it removed)."""
    with open(log_path) as log:
        text = log.read()
    restored = re.search(r"Restoring the simulated WSE's weights from \S*model\.ckpt-(\d+)\.", text)
    step = int(restored.group(1)) if restored else (0 if "The simulated WSE computes" in text else None)
    removed = re.search(r"Removed (\d+) partial file", text)
    return step, "Taking over the trainer lock" in text, int(removed.group(1)) if removed else 0


def killed_series(model_dir: str, steps: int, numerics: str, rows: int, kills: int, rng: np.random.RandomState,
                  logs: str) -> list[Row]:
    """Start, SIGKILL and restart the script `kills` times in model_dir, then run it to `steps`."""
    aimed = set(rng.permutation(kills)[:round(AIMED_FRACTION * kills)].tolist())
    command = _command(model_dir, steps, numerics, rows)
    done: list[Kill] = []
    for index in range(kills):
        log_path = os.path.join(logs, f"{numerics}-run{index}.log")
        before = save_traces(model_dir)
        started = time.monotonic()
        proc = _start(command, log_path)
        try:
            aim = (_kill_during_save(proc, model_dir, rng) if index in aimed else
                   _kill_at_random(proc, started, rng))
            seconds = time.monotonic() - started
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=60)
        if aim is None:
            if proc.returncode != 0:
                raise RunFailed(f"run {index} exited with {proc.returncode}; log {log_path}:\n{_tail(log_path)}")
            raise RunFailed(f"run {index} reached step {steps} before kill {index + 1} of {kills}: raise --steps")
        new = {key: text for key, text in save_traces(model_dir).items() if key not in before}
        done.append(Kill(aim, seconds, "; ".join(new.values()) or "-", bool(new), _checkpoint_state(model_dir)[0],
                         os.path.exists(os.path.join(model_dir, LOCK_FILE))))
    _run_to_end(command, os.path.join(logs, f"{numerics}-final.log"))
    rows_out = []
    for index, kill in enumerate(done):
        next_log = os.path.join(logs, f"{numerics}-run{index + 1}.log" if index + 1 < kills
                                else f"{numerics}-final.log")
        rows_out.append(Row(kill, *_restored_from(next_log)))
    return rows_out


def compare(reference_dir: str, killed_dir: str) -> tuple[list[str], dict[str, np.ndarray]]:
    """Differences between the latest checkpoints of the two model_dirs (empty: bit-identical) and the
    reference's values."""
    import tensorflow as tf

    want = tf.train.load_checkpoint(reference_dir)
    got = tf.train.load_checkpoint(killed_dir)
    names = sorted(want.get_variable_to_shape_map())
    other = set(got.get_variable_to_shape_map())
    problems = [f"{name}: missing" for name in names if name not in other]
    problems += [f"{name}: not in the uninterrupted run" for name in sorted(other - set(names))]
    values = {}
    for name in names:
        values[name] = a = want.get_tensor(name)
        if name not in other:
            continue
        b = got.get_tensor(name)
        if np.asarray(a).dtype != np.asarray(b).dtype or not np.array_equal(a, b):
            diff = (np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))
                    if np.shape(a) == np.shape(b) else float("nan"))
            problems.append(f"{name}: differs (max |diff| {diff:.3g}; {np.asarray(a).dtype} vs "
                            f"{np.asarray(b).dtype})")
    return problems, values


def leftovers(model_dir: str) -> list[str]:
    return sorted(name for name in os.listdir(model_dir) if ".tempstate" in name or name == LOCK_FILE
                  or name.startswith("checkpoint.tmp"))


def _print_table(header: Sequence[str], rows: list[Sequence[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths)))


def soak(numerics: str, steps: int, kills: int, rows: int, rng: np.random.RandomState, work: str) -> bool:
    """One numerics: the reference, the killed series, the table and the verdict; True if bit-identical and
    nothing is left behind."""
    reference_dir, killed_dir = os.path.join(work, f"{numerics}-reference"), os.path.join(work, f"{numerics}-killed")
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    started = time.monotonic()
    reference_seconds = _run_to_end(_command(reference_dir, steps, numerics, rows),
                                    os.path.join(logs, f"{numerics}-reference.log"))
    series_started = time.monotonic()
    series = killed_series(killed_dir, steps, numerics, rows, kills, rng, logs)
    series_seconds = time.monotonic() - series_started
    print(f"\n{numerics}: {kills} kills, then a run to step {steps} (--rows {rows}); uninterrupted run "
          f"{reference_seconds:.1f} s, killed series {series_seconds:.1f} s")
    header = ("kill", "aimed", "after", "left in model_dir by the kill", "mid-write", "resumed from",
              "next run")
    table = []
    for index, row in enumerate(series):
        kill = row.kill
        if row.resumed_from is None:
            resumed, after = "-", "killed before restoring"
        else:
            resumed = str(row.resumed_from) + ("" if row.resumed_from == kill.saved else f" (!= {kill.saved})")
            after = ("lock taken over" if row.lock_taken_over else "lock NOT taken over") if kill.lock_left \
                else "no lock left"
            if row.partial_removed:
                after += f", {row.partial_removed} partial file(s) removed"
        table.append((str(index + 1), kill.aim, f"{kill.seconds:.2f} s", kill.left, "yes" if kill.mid_write else "no",
                      resumed, after))
    _print_table(header, table)
    problems, values = compare(reference_dir, killed_dir)
    left = leftovers(killed_dir)
    reached = [(i + 1, row) for i, row in enumerate(series) if row.resumed_from is not None]
    wrong_resume = [str(i) for i, row in reached if row.resumed_from != row.kill.saved]
    not_taken = [str(i) for i, row in reached if row.kill.lock_left and not row.lock_taken_over]
    unlisted = sorted(text for (kind, _), text in save_traces(killed_dir).items() if kind == "unlisted")
    mid = sum(row.kill.mid_write for row in series)
    state = ", ".join(f"{name}={values[name].item()}" for name in sorted(values)
                      if name.startswith("amp/") or name == "global_step")
    ok = not problems and not left and not wrong_resume and not not_taken and int(values["global_step"]) == steps
    verdict = "BIT-IDENTICAL" if not problems else "DIFFERENT"
    print(f"{numerics}: {verdict}: {len(values) - len(problems)}/{len(values)} variables of the final checkpoints "
          f"equal ({state}); {mid}/{kills} kills mid-write; *.tempstate*, lock or checkpoint.tmp* left in "
          f"model_dir: {', '.join(left) or 'none'}; {time.monotonic() - started:.1f} s")
    for problem in problems:
        print(f"  {problem}")
    if wrong_resume:
        print(f"  kills {', '.join(wrong_resume)}: the next run did not restore the latest checkpoint the kill left")
    if not_taken:
        print(f"  kills {', '.join(not_taken)}: the next run did not say it took over the trainer lock")
    if mid * 2 < kills:
        print(f"  note: only {mid} of {kills} kills landed while a checkpoint was being written (a busy machine "
              "delays the kills; run again)")
    if unlisted:
        print(f"  note: still in model_dir, no longer in `checkpoint` (nothing deletes them): {'; '.join(unlisted)}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5000, help="the step both runs end at")
    parser.add_argument("--numerics", default="float32,float16", help="comma-separated half dtypes")
    parser.add_argument("--rows", type=int, default=40, help="rows of the repeated data (64: negative control)")
    parser.add_argument("--seed", type=int, default=None, help="the kills' random moments (default: random)")
    parser.add_argument("--keep", action="store_true", help="keep the model_dirs and logs")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    rng = np.random.RandomState(seed)
    work = tempfile.mkdtemp(prefix="kill_soak-")
    print(f"kill -9 soak: {args.kills} SIGKILLs per numerics, --seed {seed}, work dir {work}")
    started = time.monotonic()
    results = {}
    try:
        for numerics in args.numerics.split(","):
            try:
                results[numerics] = soak(numerics, args.steps, args.kills, args.rows, rng, work)
            except RunFailed as error:
                print(f"\n{numerics}: FAILED: {error}")
                results[numerics] = False
    finally:
        if args.keep:
            print(f"\nKept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nTotal {time.monotonic() - started:.1f} s: " + ", ".join(
        f"{numerics} {'OK' if ok else 'FAIL'}" for numerics, ok in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
