"""This repository's dvc.yaml reproduces the demo in a fresh clone; DVC reads its metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.mark.skipif(
    not (REPO / ".git").exists() or shutil.which("dvc") is None,
    reason="needs a git checkout of edgeflow and the dvc command (pip install 'edgeflow[dvc]')",
)
def test_dvc_repro_in_a_fresh_clone(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    repro = subprocess.run(["dvc", "repro"], cwd=clone, capture_output=True, text=True, check=False)
    assert repro.returncode == 0, repro.stdout + repro.stderr
    assert "verified: every threshold in the recipe holds" in repro.stdout
    shown = subprocess.run(
        ["dvc", "metrics", "show", "--json"], cwd=clone, capture_output=True, text=True, check=True
    )
    metrics = json.loads(shown.stdout)
    [(_, by_file)] = metrics.items()
    data = by_file["data"]["build/digits_cnn/onnxruntime_micro-int8/metrics.json"]["data"]
    assert data["verified"] is True
    assert data["accuracy"]["drop"] <= 0.01 and data["agreement"]["top1"] >= 0.98
