"""The wheel carries the built-in recipes, targets, pipelines and demo weights, and finds them."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_wheel_carries_and_finds_builtins(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        check=True,
    )
    [wheel] = tmp_path.glob("edgeflow-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in (
        "edgeflow/_data/recipes/digits_cnn.yaml",
        "edgeflow/_data/targets/onnxruntime_micro.yaml",
        "edgeflow/_data/pipelines/pytorch.yaml",
        "edgeflow/_data/pipelines/onnx.yaml",
        "edgeflow/_data/models/digits_cnn.pt",
    ):
        assert expected in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # From an unrelated folder, the unpacked wheel alone must resolve and validate the demo.
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from edgeflow.cli import main; sys.exit(main(sys.argv[1:]))",
            "validate",
            "digits_cnn",
        ],
        cwd=elsewhere,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    builtin = site / "edgeflow" / "_data" / "recipes" / "digits_cnn.yaml"
    assert f"{builtin}: ok (digits_cnn -> onnxruntime_micro-int8)" in proc.stdout
