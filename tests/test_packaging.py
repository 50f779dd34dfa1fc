"""The package's metadata agrees with itself: pyproject.toml's version is cerebras_tf.__version__ and has a
CHANGELOG entry, and every stack's lock file (constraints/py<python>-tf<tf>.txt, what ./dev and CI install) is one
set pyproject.toml's ranges allow for that Python, with the TensorFlow the file is named for and, from TF 2.16 on,
the tf-keras of the same version."""
from __future__ import annotations

import glob
import os
import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import cerebras_tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "pyproject.toml"), "rb") as _handle:
    PROJECT = tomllib.load(_handle)["project"]
LOCKS = sorted(glob.glob(os.path.join(ROOT, "constraints", "py*-tf*.txt")))


def test_the_version_is_the_packages_and_the_changelogs():
    assert cerebras_tf.__version__ == PROJECT["version"]
    with open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8") as handle:
        assert f"\n## {PROJECT['version']}\n" in handle.read()


def _pins(path: str) -> dict[str, Version]:
    pins = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line and not line.startswith("#"):
                name, version = line.split("==")
                pins[canonicalize_name(name)] = Version(version)
    return pins


def test_there_is_a_lock_per_stack_ci_runs():
    names = {os.path.basename(path) for path in LOCKS}
    assert {"py3.11-tf2.15.txt", "py3.12-tf2.16.txt", "py3.12-tf2.21.txt", "py3.13-tf2.21.txt"} <= names


@pytest.mark.parametrize("path", LOCKS, ids=os.path.basename)
def test_each_lock_is_a_set_the_ranges_allow(path):
    python, tf = re.fullmatch(r"py(\d+\.\d+)-tf(\d+\.\d+)\.txt", os.path.basename(path)).groups()
    pins = _pins(path)
    environment = {"python_version": python, "python_full_version": f"{python}.0", "extra": ""}
    requirements = PROJECT["dependencies"] + [r for extra in ("test", "examples", "lint")
                                              for r in PROJECT["optional-dependencies"][extra]]
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{os.path.basename(path)} lacks {requirement.name}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{os.path.basename(path)}: {requirement.name}=={pins[name]} is outside {text!r}")
    assert pins["tensorflow"].release[:2] == tuple(int(p) for p in tf.split("."))
    if Version(tf) >= Version("2.16"):
        assert pins["tf-keras"].release[:2] == pins["tensorflow"].release[:2]
        assert "tensorflow-estimator" not in pins
    else:
        assert pins["tensorflow-estimator"].release[:2] == pins["tensorflow"].release[:2]
    assert "cerebras-tf" not in pins
