"""`./dev setup` says what it installs and shows pip's output the first time, and nothing when nothing changed.

Runs the real script on a copy of the project files with a stand-in for .venv/bin/python that records its
arguments instead of installing anything.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_PYTHON = '#!/bin/sh\necho "$@" >> "$(dirname "$0")/../calls.log"\necho "pip output for: $*"\n'


def _project(tmp_path):
    for name in ("dev", "pyproject.toml", "setup.cfg"):
        shutil.copy2(os.path.join(ROOT, name), tmp_path / name)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return tmp_path


def _setup(project) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(project / "dev"), "setup"], capture_output=True, text=True, timeout=60)


def _calls(project) -> list[str]:
    log = project / ".venv" / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_first_setup_says_what_it_installs_and_shows_pips_output(tmp_path):
    project = _project(tmp_path)
    done = _setup(project)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # setup talks on stderr: stdout stays the command's own
    assert "./dev: installing cerebras-tf and its pinned dependencies" in done.stderr and "2 GB" in done.stderr
    install = [call for call in _calls(project) if "-e .[test,examples,lint]" in call]
    assert install == ["-m pip install -e .[test,examples,lint]"]  # no --quiet: pip's progress shows
    assert "pip output for: -m pip install -e" in done.stderr
    assert "./dev: .venv is ready" in done.stderr


def test_setup_is_silent_when_nothing_changed_and_says_so_when_the_pins_change(tmp_path):
    project = _project(tmp_path)
    _setup(project)
    calls = len(_calls(project))
    again = _setup(project)
    assert again.returncode == 0 and again.stdout == again.stderr == ""
    assert len(_calls(project)) == calls
    with open(project / "setup.cfg", "a", encoding="utf-8") as handle:
        handle.write("\n# changed\n")
    changed = _setup(project)
    assert "./dev: pyproject.toml or setup.cfg changed: updating the packages in .venv" in changed.stderr
    assert len(_calls(project)) == calls + 2
