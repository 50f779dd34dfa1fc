"""`./dev`: picks the newest supported Python, keeps one venv per stack (Python version, and TensorFlow version when
it is not that Python's newest; .venv links to the one in use), installs the stack's lock file, says which stack it
set up and what it installs the first time, nothing when nothing changed, and refuses or rebuilds what it cannot use.

Runs the real script on a copy of the project files with stand-in interpreters that answer version queries,
make a "venv" holding a copy of themselves, and record the rest of their arguments instead of installing.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fake_python(path, version: str | None) -> str:
    """A stand-in for `python<version>` (None: one that does not run, as a pyenv shim of an unselected version)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if version is None:
        path.write_text("#!/bin/sh\necho 'pyenv: version not installed' >&2\nexit 127\n")
    else:
        path.write_text(f"""#!/bin/sh
case "$1" in
  -c) echo "{version}"; exit 0 ;;
  --version) echo "Python {version}.0"; exit 0 ;;
  -m) if [ "$2" = venv ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; exit 0; fi ;;
esac
echo "$@" >> "$(dirname "$0")/../calls.log"
echo "pip output for: $*"
""")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _project(tmp_path):
    project = tmp_path / "project"
    project.mkdir(parents=True)
    for name in ("dev", "pyproject.toml", "setup.cfg"):
        shutil.copy2(os.path.join(ROOT, name), project / name)
    shutil.copytree(os.path.join(ROOT, "constraints"), project / "constraints")
    return project


def _dev(project, *args, python=None, path=None, tf=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(project.parent / "home")}  # no pyenv versions there
    env.pop("PYTHON", None)
    env.pop("TF", None)
    if python is not None:
        env["PYTHON"] = python
    if tf is not None:
        env["TF"] = tf
    if path is not None:
        env["PATH"] = path
    return subprocess.run(["bash", str(project / "dev"), *(args or ("setup",))], capture_output=True, text=True,
                          timeout=60, env=env)


def _calls(project, venv) -> list[str]:
    log = project / venv / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_first_setup_says_which_stack_and_what_it_installs_and_shows_pips_output(tmp_path):
    project = _project(tmp_path)
    done = _dev(project, python=_fake_python(tmp_path / "bin" / "python3.12", "3.12"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # setup talks on stderr: stdout stays the command's own
    assert "./dev: creating .venv-3.12 with Python 3.12.0" in done.stderr
    assert "TensorFlow 2.21.0 + tf-keras stack" in done.stderr
    assert "./dev: installing cerebras-tf and its locked dependencies" in done.stderr and "2 GB" in done.stderr
    install = [call for call in _calls(project, ".venv-3.12") if "-e .[test,examples,lint]" in call]
    # the stack's lock file holds the exact versions; no --quiet: pip's progress shows
    assert install == ["-m pip install -c constraints/py3.12-tf2.21.txt -e .[test,examples,lint]"]
    assert "pip output for: -m pip install -c constraints/py3.12-tf2.21.txt -e" in done.stderr
    assert "./dev: .venv-3.12 (Python 3.12, TensorFlow 2.21.0 + tf-keras) is ready" in done.stderr
    assert os.readlink(project / ".venv") == ".venv-3.12"


def test_setup_is_silent_when_nothing_changed_and_says_so_when_the_pins_change(tmp_path):
    project = _project(tmp_path)
    python = _fake_python(tmp_path / "bin" / "python3.11", "3.11")
    assert "TensorFlow 2.15.1 + tensorflow-estimator stack" in _dev(project, python=python).stderr
    calls = len(_calls(project, ".venv-3.11"))
    again = _dev(project, python=python)
    assert again.returncode == 0 and again.stdout == again.stderr == ""
    assert len(_calls(project, ".venv-3.11")) == calls
    with open(project / "setup.cfg", "a", encoding="utf-8") as handle:
        handle.write("\n# changed\n")
    changed = _dev(project, python=python)
    assert ("./dev: pyproject.toml, setup.cfg or constraints/py3.11-tf2.15.txt changed: updating the packages in "
            ".venv-3.11") in changed.stderr
    assert len(_calls(project, ".venv-3.11")) == calls + 2
    with open(project / "constraints" / "py3.11-tf2.15.txt", "a", encoding="utf-8") as handle:
        handle.write("# relocked\n")
    assert "updating the packages in .venv-3.11" in _dev(project, python=python).stderr
    assert len(_calls(project, ".venv-3.11")) == calls + 4


def test_tf_chooses_a_stack_of_the_python_with_its_own_venv_and_lock(tmp_path):
    project = _project(tmp_path)
    python = _fake_python(tmp_path / "bin" / "python3.12", "3.12")
    done = _dev(project, python=python, tf="2.16")
    assert done.returncode == 0, done.stderr
    assert "creating .venv-3.12-tf2.16 with Python 3.12.0" in done.stderr
    assert "the TensorFlow 2.16.2 + tf-keras stack" in done.stderr
    assert os.readlink(project / ".venv") == ".venv-3.12-tf2.16"
    install = [call for call in _calls(project, ".venv-3.12-tf2.16") if "-e .[test,examples,lint]" in call]
    assert install == ["-m pip install -c constraints/py3.12-tf2.16.txt -e .[test,examples,lint]"]
    newest = _dev(project, python=python, tf="2.21")  # the Python's newest TF is its plain venv
    assert "creating .venv-3.12 with" in newest.stderr and os.readlink(project / ".venv") == ".venv-3.12"
    assert not (project / ".venv-3.12-tf2.21").exists()


def test_a_tf_without_a_stack_is_refused_naming_the_ones_there_are(tmp_path):
    project = _project(tmp_path)
    python = _fake_python(tmp_path / "bin" / "python3.13", "3.13")
    done = _dev(project, python=python, tf="2.16")
    assert done.returncode == 2
    assert ("./dev: no Python 3.13 stack with TensorFlow 2.16 (constraints/py3.13-tf2.16.txt); "
            "Python 3.13 has: TF=2.21") in done.stderr
    assert not list(project.glob(".venv*"))
    bad = _dev(project, python=python, tf="2.16.2")
    assert bad.returncode == 2 and "TF=2.16.2: give a TensorFlow version as major.minor, e.g. TF=2.16" in bad.stderr


def test_tf_without_python_picks_the_newest_python_that_has_that_stack(tmp_path):
    project = _project(tmp_path)
    bin_dir = tmp_path / "bin"
    _fake_python(bin_dir / "python3.13", "3.13")
    _fake_python(bin_dir / "python3.12", "3.12")
    done = _dev(project, path=f"{bin_dir}:/usr/bin:/bin", tf="2.16")
    assert done.returncode == 0, done.stderr
    assert os.readlink(project / ".venv") == ".venv-3.12-tf2.16"


def test_one_venv_per_python_and_dot_venv_follows_the_one_in_use(tmp_path):
    project = _project(tmp_path)
    _dev(project, python=_fake_python(tmp_path / "bin" / "python3.11", "3.11"))
    _dev(project, python=_fake_python(tmp_path / "bin" / "python3.13", "3.13"))
    assert (project / ".venv-3.11" / "bin" / "python").exists() and (project / ".venv-3.13" / "bin" / "python").exists()
    assert os.readlink(project / ".venv") == ".venv-3.13"
    assert _dev(project, python=str(tmp_path / "bin" / "python3.11")).stderr == ""  # already set up: silent
    assert os.readlink(project / ".venv") == ".venv-3.11"


def test_picks_the_newest_supported_python_that_runs(tmp_path):
    project = _project(tmp_path)
    bin_dir = tmp_path / "bin"
    _fake_python(bin_dir / "python3.13", None)  # on PATH, but does not run
    _fake_python(bin_dir / "python3.12", "3.12")
    _fake_python(bin_dir / "python3.11", "3.11")
    done = _dev(project, path=f"{bin_dir}:/usr/bin:/bin")
    assert done.returncode == 0, done.stderr
    assert "creating .venv-3.12 with Python 3.12.0" in done.stderr
    assert os.readlink(project / ".venv") == ".venv-3.12"


def test_an_unsupported_python_is_refused_naming_the_supported_ones(tmp_path):
    project = _project(tmp_path)
    for version in ("3.10", "3.14"):
        done = _dev(project, python=_fake_python(tmp_path / "bin" / f"python{version}", version))
        assert done.returncode == 2
        assert f"is Python {version}; cerebras-tf supports Python 3.13, 3.12, 3.11" in done.stderr
        assert not (project / ".venv").exists() and not list(project.glob(".venv-*"))


def test_an_old_dot_venv_is_kept_if_supported_and_rebuilt_with_a_clear_line_if_not(tmp_path):
    project = _project(tmp_path)
    _fake_python(project / ".venv" / "bin" / "python", "3.11")  # a .venv from the ./dev before this one
    python = _fake_python(tmp_path / "bin" / "python3.11", "3.11")
    done = _dev(project, python=python)
    assert "./dev: .venv is a Python 3.11 venv from an older ./dev: keeping it as .venv-3.11" in done.stderr
    assert os.readlink(project / ".venv") == ".venv-3.11"

    other = _project(tmp_path / "other")
    _fake_python(other / ".venv" / "bin" / "python", "3.10")
    done = _dev(other, python=python)
    assert done.returncode == 0, done.stderr
    assert ("./dev: .venv was made with Python 3.10, which cerebras-tf does not support (Python 3.13, 3.12, 3.11): "
            "removing it") in done.stderr
    assert "creating .venv-3.11" in done.stderr and os.readlink(other / ".venv") == ".venv-3.11"


def test_python_may_name_a_version(tmp_path):
    project = _project(tmp_path)
    bin_dir = tmp_path / "bin"
    _fake_python(bin_dir / "python3.13", "3.13")
    _fake_python(bin_dir / "python3.11", "3.11")
    done = _dev(project, python="3.11", path=f"{bin_dir}:/usr/bin:/bin")
    assert done.returncode == 0, done.stderr
    assert os.readlink(project / ".venv") == ".venv-3.11"
    missing = _dev(project, python="3.12", path=f"{bin_dir}:/usr/bin:/bin")
    assert missing.returncode == 2 and "PYTHON=3.12: no Python 3.12 found" in missing.stderr
