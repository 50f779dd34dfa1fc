"""README.md and docs/*.md keep working: every relative link reaches a file (and its #heading), every `./dev`
command is one ./dev has, every `python -m` module can run, and every repository path they name exists.

Nothing is run or imported: modules are found as `python -m` finds them (without importing their packages),
so the whole file takes milliseconds.
"""
from __future__ import annotations

import glob
import importlib.machinery
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, "docs", "*.md")))
README_MAX_LINES = 150  # the README is the front page; the depth is in docs/

FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
# Repository paths the docs name on purpose although they do not exist here.
NOT_HERE = {
    "cerebras_tf/wse/reference_models.py",  # where benchmarks/reference_models.py used to be (a historical note)
}


def _read(doc: str) -> str:
    with open(os.path.join(ROOT, doc), encoding="utf-8") as handle:
        return handle.read()


def _prose(text: str) -> str:
    """The text outside fenced code blocks (a fence's lines are blanked, so line numbers stay)."""
    return FENCE.sub(lambda match: "\n" * match.group(0).count("\n"), text)


def _code(text: str) -> list[str]:
    """The contents of the fenced code blocks and the inline code spans (joined across line breaks)."""
    blocks = [match.group(1) for match in FENCE.finditer(text)]
    spans = re.findall(r"`([^`]+)`", re.sub(r"[ \t]*\n[ \t]*", " ", _prose(text)))
    return blocks + spans


def _anchors(doc: str) -> set[str]:
    """GitHub's anchors for the headings of `doc`: lower case, punctuation dropped, spaces to hyphens, a repeated
    heading suffixed -1, -2, ..."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", _prose(_read(doc)), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in anchors:
            n += 1
            candidate = f"{slug}-{n}"
        anchors.add(candidate)
    return anchors


def _dev_commands() -> set[str]:
    """The subcommands ./dev's usage line lists: `usage: ./dev {example|test|...} [args]`."""
    with open(os.path.join(ROOT, "dev"), encoding="utf-8") as handle:
        usage = re.search(r"usage: \./dev \{([\w|]+)\}", handle.read())
    assert usage, "./dev has no usage line"
    return set(usage.group(1).split("|"))


def _module_spec(name: str):
    """The spec `python -m name` would run (a package's __main__), found without importing any package."""
    parts = name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(parts[0], [ROOT] + sys.path)
    for depth in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:depth + 1]), spec.submodule_search_locations)
    if spec is not None and spec.submodule_search_locations:
        spec = importlib.machinery.PathFinder.find_spec(name + ".__main__", spec.submodule_search_locations)
    return spec


def test_the_readme_is_a_front_page():
    lines = _read("README.md").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move the depth to a guide in docs/"
    for doc in DOCS[1:]:
        assert f"({doc})" in _read("README.md"), f"README.md does not link {doc}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_relative_link_reaches_a_file_and_its_heading(doc):
    broken = []
    for target in LINK.findall(_prose(_read(doc))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
        if not os.path.exists(os.path.join(ROOT, linked)):
            broken.append(f"{target}: no file {linked}")
        elif anchor and (not linked.endswith(".md") or anchor not in _anchors(linked)):
            broken.append(f"{target}: {linked} has no heading #{anchor} (it has {sorted(_anchors(linked))})")
    assert not broken, f"{doc}:\n  " + "\n  ".join(broken)


@pytest.mark.parametrize("doc", DOCS)
def test_every_dev_command_is_one_dev_has(doc):
    commands, bad = _dev_commands(), []
    for code in _code(_read(doc)):
        for command, argument in re.findall(r"(?<![\w/.])\./dev(?:[ \t]+([\w-]+))?(?:[ \t]+([\w-]+))?", code):
            if command and command not in commands:
                bad.append(f"./dev {command}: ./dev has {sorted(commands)}")
            elif command == "bench" and argument and not argument.isupper() and not argument.startswith("-"):
                if not os.path.exists(os.path.join(ROOT, "benchmarks", argument + ".py")):
                    bad.append(f"./dev bench {argument}: no benchmarks/{argument}.py")
    assert not bad, f"{doc}:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("doc", DOCS)
def test_every_python_m_module_can_run(doc):
    modules = {module for code in _code(_read(doc))
               for module in re.findall(r"\bpython[\d.]*[ \t]+-m[ \t]+([\w.]+)", code)
               if not any(part.isupper() for part in module.split("."))}  # benchmarks.NAME: a placeholder
    missing = sorted(module for module in modules if _module_spec(module) is None)
    assert not missing, f"{doc}: `python -m` cannot run {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_repository_path_named_exists(doc):
    """`tests/executor/test_disk_full.py`, `estimator/runtime/`, `estimator/__init__` (a module)."""
    tops = ("cerebras_tf/", "estimator/", "examples/", "tests/", "benchmarks/", "docs/", ".ci/")
    missing = sorted({span for span in _code(_read(doc))
                      if span.startswith(tops) and re.fullmatch(r"[\w./-]+", span) and span not in NOT_HERE
                      and not any(os.path.exists(os.path.join(ROOT, span + ext)) for ext in ("", ".py"))})
    assert not missing, f"{doc} names paths that do not exist: {missing}"


def test_the_checks_find_what_they_look_for():
    """The patterns above see the README's links, commands and modules (a pattern that matches nothing passes)."""
    text = _read("README.md")
    assert "docs/porting.md#the-rules-and-their-errors" in LINK.findall(_prose(text))
    assert "bad-numbers" in _anchors("docs/running-on-the-system.md")
    assert {"example", "test", "lint", "bench", "setup"} <= _dev_commands()
    assert _module_spec("cerebras_tf.csoft") is not None and _module_spec("examples.fc_digits.run") is not None
    assert _module_spec("cerebras_tf.no_such_module") is None and _module_spec("cerebras_tf.rules") is None
    assert any("./dev example" in code for code in _code(text))
