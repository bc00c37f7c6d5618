"""The keyword-spotting demo end to end through the CLI: the committed DS-CNN weights, data
synthesized with espeak-ng, the real exporter and runtime, accuracy on unseen speakers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeflow.cli import main
from edgeflow.recipe import load_recipe
from tests import needs
from tests.conftest import REPO

pytestmark = [pytest.mark.slow, needs.mark("espeak-ng")]
RECIPE = REPO / "recipes" / "keyword_spotter.yaml"


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The synthesized splits made once for this module, in a folder of its own."""
    path = tmp_path_factory.mktemp("keywords")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EDGEFLOW_DATA_CACHE", str(path))
        yield path


def build(tmp_path: Path, cache: Path, quantization: str) -> dict:
    args = ["run", "recipe=keyword_spotter", "target=onnxruntime_micro", f"cache_dir={cache}"]
    assert main([*args, f"build_dir={tmp_path}", f"quantization={quantization}"]) == 0
    out = tmp_path / "keyword_spotter" / f"onnxruntime_micro-{quantization}"
    return json.loads((out / "metrics.json").read_text())


def test_recipe_loads_and_names_the_committed_weights() -> None:
    loaded = load_recipe(RECIPE)
    source = loaded.recipe.source
    assert source.inputs[0].shape == [1, 1, 49, 10]
    assert (REPO / "models" / "keyword_spotter.pt").stat().st_size < 150_000


def test_float32_build_keeps_the_accuracy(
    tmp_path: Path, shared_cache: Path, data_cache: Path
) -> None:
    metrics = build(tmp_path, shared_cache, "none")
    assert metrics["verified"] is True
    assert metrics["accuracy"]["source"] >= 0.9  # 1,200 test clips of 22 unseen voices
    assert metrics["accuracy"]["artifact"] == metrics["accuracy"]["source"]
    assert metrics["agreement"]["top1"] == 1.0
    assert metrics["agreement"]["max_abs_diff"] <= 1e-4
    assert sorted(p.name.split("-")[0] for p in data_cache.glob("*.npz")) == ["test"]


def test_int8_build_within_the_recipes_budget(
    tmp_path: Path, shared_cache: Path, data_cache: Path
) -> None:
    metrics = build(tmp_path, shared_cache, "int8")
    assert metrics["verified"] is True
    assert metrics["accuracy"]["drop"] <= 0.01
    assert metrics["agreement"]["top1"] >= 0.98
