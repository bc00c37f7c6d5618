"""tests/needs.py: a missing dependency skips a test, but fails it where CI is set; what .ci/run
installs is what needs.py registers, and no test checks one of them on its own."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import needs
from tests.conftest import REPO

ABSENT = "edgeflow_no_such_module"
SKIP_MESSAGE = (
    f"a fake runtime is not installed (no module {ABSENT}): "
    "install a fake runtime with pip install -c constraints.txt -e '.[tflite]'"
)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> str:
    """A registered dependency that is never installed."""
    dep = needs.Dependency("a fake runtime", "tflite", modules=(ABSENT,))
    monkeypatch.setitem(needs.DEPENDENCIES, "fake", dep)
    return "fake"


@pytest.mark.parametrize(
    ("value", "set_"),
    [("", False), ("0", False), ("false", False), ("False", False), ("no", False),
     ("off", False), ("true", True), ("1", True), ("yes", True), ("github-actions", True)],
)  # fmt: skip
def test_what_counts_as_ci(monkeypatch: pytest.MonkeyPatch, value: str, set_: bool) -> None:
    monkeypatch.setenv("CI", value)
    assert needs.ci() is set_


def test_a_missing_dependency_skips_without_ci(monkeypatch: pytest.MonkeyPatch, fake: str) -> None:
    monkeypatch.delenv("CI", raising=False)
    assert needs.missing(fake) == f"no module {ABSENT}"
    with pytest.raises(pytest.skip.Exception) as info:
        needs.require(fake)
    assert str(info.value) == SKIP_MESSAGE
    assert needs.installed(fake) is False


def test_a_missing_dependency_fails_under_ci(monkeypatch: pytest.MonkeyPatch, fake: str) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception) as info:
        needs.require(fake)
    assert str(info.value) == (
        f"{SKIP_MESSAGE}. CI is set and .ci/run installs it "
        "(pip install -c constraints.txt -e '.[dev]', which holds [tflite]): a failure, not a skip"
    )
    with pytest.raises(pytest.fail.Exception):
        needs.installed(fake)
    with pytest.raises(pytest.fail.Exception):
        needs.module(ABSENT)


def test_a_missing_command_names_its_apt_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    dep = needs.Dependency("a fake tool", apt="fake-tool fake-lib", commands=("fake-tool-cmd",))
    monkeypatch.setitem(needs.DEPENDENCIES, "fake-tool", dep)
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception) as info:
        needs.command("fake-tool-cmd")
    assert str(info.value) == (
        "a fake tool is not installed (no command fake-tool-cmd): install a fake tool with "
        "sudo apt-get install -y fake-tool fake-lib. CI is set and .ci/run installs it "
        "(its apt-get line installs fake-tool fake-lib): a failure, not a skip"
    )


def test_an_installed_dependency_goes_on_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    present = needs.Dependency(
        "JSON", "dev", modules=("json",), commands=(Path(sys.executable).name,)
    )
    monkeypatch.setitem(needs.DEPENDENCIES, "present", present)
    monkeypatch.setenv("CI", "true")
    needs.require("present")
    assert needs.installed("present") is True
    assert needs.module("json").dumps([1]) == "[1]"
    assert needs.command(Path(sys.executable).name) == str(Path(sys.executable))


def test_only_registered_names_are_accepted() -> None:
    with pytest.raises(AssertionError, match=r"no dependency \['tensorflo'\]"):
        needs.mark("tensorflo")
    with pytest.raises(AssertionError, match="numpy is no module of a dependency"):
        needs.module("numpy")


MARKED = """
import pytest
from tests import needs

needs.DEPENDENCIES["fake"] = needs.Dependency("a fake runtime", "tflite", modules=("{absent}",))


@pytest.fixture
def expensive():
    print("FIXTURE MADE")


@needs.mark("fake")
def test_marked(expensive):
    pass
"""


@pytest.mark.parametrize("ci", ["", "true"])
def test_the_marker_skips_or_fails_before_any_fixture(tmp_path: Path, ci: str) -> None:
    """In a pytest of its own, with tests/conftest.py's hook loaded as a plugin."""
    (tmp_path / "test_marked.py").write_text(textwrap.dedent(MARKED.format(absent=ABSENT)))
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(REPO)}
    args = ["-m", "pytest", "-p", "tests.conftest", "-p", "no:xdist", "-p", "no:cacheprovider"]
    args += ["-rs", "-s", "-o", "addopts=", "test_marked.py"]
    done = subprocess.run(
        [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert "FIXTURE MADE" not in done.stdout
    if ci:
        assert done.returncode == 1, done.stdout
        assert "1 error" in done.stdout
        assert ".ci/run installs it" in done.stdout
    else:
        assert done.returncode == 0, done.stdout
        assert "1 skipped" in done.stdout
        assert f": {SKIP_MESSAGE}\n" in done.stdout  # -rs: SKIPPED [1] <where>: <why>


def test_every_dependency_is_one_that_ci_installs() -> None:
    """An extra of [dev] (.ci/run installs .[dev]), or a package on .ci/run's apt-get line."""
    by_extra: dict[str, set[str]] = {}
    for line in importlib.metadata.requires("edgeflow") or []:
        requirement, _, marker = line.partition(";")
        if extra := re.search(r"extra == [\"'](\w+)", marker):
            by_extra.setdefault(extra[1], set()).add(requirement.strip())
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8").replace("\\\n", " ")
    [apt_line] = [line for line in script.splitlines() if "apt-get install" in line]
    apt = set(apt_line.split())
    for name, dep in needs.DEPENDENCIES.items():
        assert bool(dep.extra) != bool(dep.apt), name  # one way to install it
        if dep.extra:  # every requirement of its extra is one of [dev]'s
            assert by_extra[dep.extra] <= by_extra["dev"], (name, dep.extra)
        assert set(dep.apt.split()) <= apt, (name, dep.apt)


def test_no_test_checks_a_registered_dependency_by_itself() -> None:
    """pytest.importorskip or shutil.which of what needs.py registers would skip under CI."""
    modules = {m.split(".")[0] for d in needs.DEPENDENCIES.values() for m in d.modules}
    commands = {c for d in needs.DEPENDENCIES.values() for c in d.commands}
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name in ("needs.py", "test_needs.py"):
            continue
        text = path.read_text(encoding="utf-8")
        for name in re.findall(r"importorskip\(\s*[\"']([\w.]+)", text):
            if name.split(".")[0] in modules:
                found.append(f"{path.relative_to(REPO)}: importorskip({name})")
        for name in re.findall(r"which\(\s*[\"']([\w.-]+)", text):
            if name in commands:
                found.append(f"{path.relative_to(REPO)}: which({name})")
    assert found == [], "use tests/needs.py: " + ", ".join(found)
