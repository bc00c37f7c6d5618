"""A stage sees only the recipe keys it declares: they are what its cache key covers."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeflow.engine.keys import recipe_slice
from edgeflow.recipe import load_recipe
from edgeflow.stages.base import Stage, StageContext
from tests.conftest import DEMO_RECIPE


def _noop(ctx: StageContext) -> None:
    return None


def test_undeclared_recipe_keys_are_refused(tmp_path: Path) -> None:
    stage = Stage("probe", "test", _noop, reads=("quantization.mode", "source.inputs"))
    ctx = StageContext(stage, load_recipe(DEMO_RECIPE), {}, tmp_path)
    assert ctx.recipe.quantization.mode == "int8"
    assert ctx.recipe.source.inputs[0].name == "image"
    with pytest.raises(AssertionError, match=r"reads 'quantization\.per_channel'"):
        _ = ctx.recipe.quantization.per_channel
    with pytest.raises(AssertionError, match=r"reads 'source\.weights'"):
        _ = ctx.recipe.source.weights
    with pytest.raises(AssertionError, match="uses the target without reading it"):
        _ = ctx.profile


def test_recipe_slice_hashes_files_and_code() -> None:
    loaded = load_recipe(DEMO_RECIPE)
    sliced = recipe_slice(loaded, ("source", "quantization.mode"))
    assert sliced["quantization.mode"] == "int8"
    assert sliced["source"]["weights"]["file"] == "digits_cnn.pt"
    assert len(sliced["source"]["weights"]["sha256"]) == 64
    assert sliced["source"]["model"]["ref"] == "edgeflow.zoo.digits:DigitsCNN"
    other = recipe_slice(load_recipe(DEMO_RECIPE, {"quantization.mode": "none"}), ("source",))
    assert other["source"] == sliced["source"]
