"""This repository's dvc.yaml (edgeflow dvc init's stages next to the training stages)
reproduces the shipped recipes' builds in a fresh clone; DVC reads their metrics."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import needs
from tests.conftest import REPO

pytestmark = pytest.mark.slow


@needs.mark("dvc")
@pytest.mark.skipif(  # a source archive, not a checkout: nothing .ci/run installs
    not (REPO / ".git").exists(), reason="needs a git checkout of edgeflow"
)
def test_dvc_repro_in_a_fresh_clone(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    repro = subprocess.run(["dvc", "repro"], cwd=clone, capture_output=True, text=True, check=False)
    assert repro.returncode == 0, repro.stdout + repro.stderr
    for stage in ("train_digits", "train_digits_keras", "train_digits_flax"):  # weights in git
        assert f"Stage '{stage}' didn't change, skipping" in repro.stdout
    shown = subprocess.run(
        ["dvc", "metrics", "show", "--json"], cwd=clone, capture_output=True, text=True, check=True
    )
    metrics = json.loads(shown.stdout)
    [(_, by_file)] = metrics.items()
    builds = by_file["data"]
    assert sorted(builds) == [
        f"build/{recipe}/default/metrics.json"
        for recipe in (
            "digits_cnn",
            "digits_cnn_qat",
            "digits_jax",
            "digits_keras",
            "digits_mobilenet",
            "keyword_spotter",
        )
    ]
    for found in builds.values():
        data = found["data"]
        assert data["verified"] is True
        assert data["accuracy"]["drop"] <= 0.01 and data["agreement"]["top1"] >= 0.98


def test_this_repositorys_dvc_yaml_is_up_to_date() -> None:
    """`edgeflow dvc init --check`: the committed dvc.yaml/params.yaml are what init writes."""
    from edgeflow.engine import dvcfile

    lines: list[str] = []
    assert not dvcfile.init(REPO, check=True, echo=lines.append), lines
