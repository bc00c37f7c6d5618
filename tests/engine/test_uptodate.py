"""`edgeflow run`'s up-to-date stamp (edgeflow/engine/uptodate.py): a rerun with nothing
changed is answered from it without Hydra or the stage keys, and every change that a stage
key, the configuration or the build folder could see sends the run the whole way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from edgeflow.cli import main
from edgeflow.engine.uptodate import Invocation
from tests.conftest import DEMO_RECIPE, DEMO_WEIGHTS, REPO

pytestmark = pytest.mark.slow
ANSWERED = "nothing changed since"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo as a user's project: its recipe, its weights, and a model class in the
    project's own code that imports a helper module of the project."""
    root = tmp_path_factory.mktemp("project")
    (root / "recipes").mkdir()
    (root / "models").mkdir()
    shutil.copy(DEMO_WEIGHTS, root / "models" / "digits_cnn.pt")
    (root / "helper.py").write_text("CLASSES = 10\n")
    (root / "net.py").write_text(
        textwrap.dedent(
            """\
            from helper import CLASSES
            from edgeflow.zoo.digits import DigitsCNN


            class Net(DigitsCNN):
                def __init__(self) -> None:
                    super().__init__(num_classes=CLASSES)
            """
        )
    )
    recipe = DEMO_RECIPE.read_text().replace("name: digits_cnn", "name: mine")
    recipe = recipe.replace("edgeflow.zoo.digits:DigitsCNN", "../net.py:Net")
    (root / "recipes" / "mine.yaml").write_text(recipe.replace("init: {num_classes: 10}", ""))
    return root


@pytest.fixture
def inside(project: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))  # as `python -m edgeflow` run there has it
    return project


ARGS = ["recipe=mine", "cache_dir=cache", "build_dir=build"]


def run(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main(["run", *ARGS, *extra])
    out, err = capsys.readouterr()
    return code, out, err


def stamped(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    """Run until the stamp answers (the first run may have to build or restamp)."""
    for _ in range(2):
        code, out, _ = run(capsys, *extra)
        assert code == 0, out
        if ANSWERED in out:
            return out
    raise AssertionError(f"the second run was not answered from the stamp:\n{out}")


def test_a_rerun_with_nothing_changed_is_answered_from_the_stamp(
    inside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, whole, _ = run(capsys)
    assert code == 0
    answered = stamped(capsys)
    # what a rerun prints: the header, every stage cached, the figures, the verdict
    lines = answered.splitlines()
    assert lines[0] == "edgeflow: mine -> onnxruntime_micro-int8 (pytorch pipeline)"
    assert sum(" cached " in line for line in lines) == 12
    assert "  nothing to do: all 12 stages cached, nothing changed since " in answered
    figures = [line for line in whole.splitlines() if line.startswith("  -> ")]
    assert figures and figures[0] in lines
    assert lines[-1] == "  verified: every threshold in the recipe holds"
    # touching a file changes no content: still answered
    os.utime(inside / "models" / "digits_cnn.pt")
    assert ANSWERED in run(capsys)[1]


def test_the_answer_imports_neither_hydra_nor_the_schema_nor_numpy(inside: Path) -> None:
    script = textwrap.dedent(
        f"""\
        import sys
        from edgeflow.cli import main
        code = main(["run", *{ARGS!r}])
        heavy = ("hydra", "omegaconf", "pydantic", "numpy", "torch")
        heavy = [m for m in heavy if m in sys.modules]
        print("CODE", code, "HEAVY", ",".join(heavy) or "none")
        """
    )
    env = {**os.environ, "PYTHONPATH": f"{inside}{os.pathsep}{REPO}"}
    for _ in range(2):  # the first may restamp (this interpreter's sys.path is another)
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False
        )
    assert done.returncode == 0, done.stderr
    assert ANSWERED in done.stdout
    assert "CODE 0 HEAVY none" in done.stdout


def _edit(path: Path, old: str, new: str) -> Callable[[], None]:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return lambda: path.write_text(text)


def _recipe(root: Path) -> Callable[[], None]:
    recipe = root / "recipes" / "mine.yaml"
    return _edit(recipe, "min_top1_agreement: 0.98", "min_top1_agreement: 0.97")


def _imported_code(root: Path) -> Callable[[], None]:
    return _edit(root / "helper.py", "CLASSES = 10\n", "CLASSES = 10  # ten digits\n")


def _shadowing_target(root: Path) -> Callable[[], None]:
    (root / "targets").mkdir()
    shutil.copy(REPO / "targets" / "onnxruntime_micro.yaml", root / "targets")
    return lambda: shutil.rmtree(root / "targets")


def _build_file(root: Path) -> Callable[[], None]:
    metrics = root / "build" / "mine" / "onnxruntime_micro-int8" / "metrics.json"
    return _edit(metrics, '"verified": true', '"verified": false')


def _cache_entry(root: Path) -> Callable[[], None]:
    stamp = _stamp(root)
    entry = Path(next(e for e in stamp["entries"] if "/verify/" in e))
    record = entry / "verify.json"
    record.write_text(record.read_text() + " ")
    return lambda: None  # the run discards the entry and computes it again


def _stamp(root: Path) -> dict:
    invocation = Invocation.of(ARGS, quiet=False)
    assert invocation is not None
    return json.loads((root / invocation.stamp).read_text())


def _stamped_as(part: str, value: object) -> Callable[[Path], Callable[[], None]]:
    """The stamp as another edgeflow or another tool's version would have written it."""

    def change(root: Path) -> Callable[[], None]:
        invocation = Invocation.of(ARGS, quiet=False)
        assert invocation is not None
        stamp = json.loads(invocation.stamp.read_text())
        stamp[part] = value if not isinstance(value, dict) else {**stamp[part], **value}
        invocation.stamp.write_text(json.dumps(stamp))
        return lambda: None

    return change


def _environment(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], Callable[[], None]]:
    def change(root: Path) -> Callable[[], None]:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        return lambda: monkeypatch.delenv("OMP_NUM_THREADS")

    return change


CHANGES = {
    "recipe": _recipe,
    "imported code": _imported_code,
    "a target that shadows the built-in": _shadowing_target,
    "a build folder file": _build_file,
    "a cache entry": _cache_entry,
    "a tool's version": _stamped_as("versions", {"onnxruntime": "1.0.0"}),
    "edgeflow's code": _stamped_as("code", "0" * 64),
}


@pytest.mark.parametrize("change", [*CHANGES, "environment"])
def test_each_change_sends_the_run_the_whole_way(
    change: str, inside: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stamped(capsys)
    make = _environment(monkeypatch) if change == "environment" else CHANGES[change]
    undo = make(inside)
    try:
        code, out, err = run(capsys)
        assert ANSWERED not in out, f"{change}: answered from the stamp"
        if change == "a build folder file":  # a file edgeflow did not write: kept, and said
            assert code == 2 and "holds files edgeflow did not write" in err
        else:
            assert code == 0, err
            assert "  verified: every threshold in the recipe holds" in out
            # the run that went the whole way (and rebuilt what changed) stamped itself
            assert ANSWERED in run(capsys)[1]
    finally:
        undo()
    stamped(capsys)


def test_a_missed_threshold_is_answered_with_its_exit_status_and_its_errors(
    inside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    strict = "verify.max_abs_diff=1e-6"
    code, _, whole = run(capsys, strict)
    assert code == 1 and "error: verification failed" in whole
    code, out, err = run(capsys, strict)
    assert code == 1
    if ANSWERED not in out:  # restamped
        code, out, err = run(capsys, strict)
    assert ANSWERED in out and code == 1
    assert err == whole


def test_a_failed_stage_or_recipe_error_writes_no_stamp(
    inside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for extra in ("source.init={num_classes: 5}", "verify.min_top1_agreement=2"):
        invocation = Invocation.of([*ARGS, extra], quiet=False)
        assert invocation is not None
        assert main(["run", *ARGS, extra]) == 2
        assert not invocation.stamp.exists(), extra


@pytest.mark.parametrize(
    "args",
    [
        ["recipe=mine", "-m", "target=tflite,onnxruntime_micro"],
        ["recipe=mine", "hydra.verbose=true"],
        ["recipe=mine", "hydra/launcher=joblib"],
        ["recipe=mine", "~verify.max_abs_diff"],
        ["recipe=mine", "--cfg", "job"],
    ],
)
def test_sweeps_flags_and_hydra_settings_are_never_answered_from_a_stamp(args: list[str]) -> None:
    assert Invocation.of(args, quiet=False) is None


AUDIT = """\
import json, os, sys

opened = set()
WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND


def hook(event, args):
    if event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path, mode, flags = args
    if mode is not None and any(c in mode for c in "wax+"):
        return
    if mode is None and flags & WRITES:
        return
    opened.add(os.path.abspath(os.fsdecode(path)))


sys.addaudithook(hook)
from edgeflow.cli import main

code = main(["run", *sys.argv[1:]])
print("OPENED", json.dumps({"code": code, "opened": sorted(opened)}))
"""


def test_the_stamp_covers_every_file_a_rerun_reads(inside: Path) -> None:
    """A rerun that goes the whole way, watched by an audit hook: every file it opens to
    read is one the stamp checks, or what the stamp checks by other means (installed
    distributions and the standard library by their folders' names and their versions,
    edgeflow by its package's hash, the cache entries and the build folder)."""
    env = {**os.environ, "PYTHONPATH": f"{inside}{os.pathsep}{REPO}"}
    script = inside / "audit.py"
    script.write_text(AUDIT)
    runs = inside / "cache" / "runs"
    for _ in range(2):  # a build, then a rerun that reads only what a rerun reads
        for stamp_file in runs.glob("*.json"):  # no answer from a stamp: the whole way
            stamp_file.unlink()
        done = subprocess.run(
            [sys.executable, str(script), *ARGS],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.split("OPENED ", 1)[1])
    (written,) = runs.glob("*.json")
    stamp = json.loads(written.read_text())
    build = Path(stamp["build"]["folder"]).resolve()
    entries = [Path(e).resolve() for e in stamp["entries"]]
    elsewhere = (sys.base_prefix, sys.prefix, str(Path(json.__file__).parent.parent))
    package = str(REPO / "edgeflow")
    unchecked = []
    for name in found["opened"]:
        path = Path(name)
        if name.startswith(elsewhere) or name.startswith(package + os.sep):
            continue
        if name == "/proc/cpuinfo" and any(v.startswith("host:") for v in stamp["versions"]):
            continue
        if name in stamp["files"] or any(e in path.parents for e in (build, *entries)):
            continue
        if inside / "build" in path.parents and not path.exists():
            continue  # the copies the run published from, gone
        if path == script or path.parent == runs:  # the stamp: looked for, not there
            continue
        unchecked.append(name)
    assert unchecked == []
