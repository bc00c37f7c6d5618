"""The digits demo through tflite (LiteRT) and tflite_micro (TFLM), real pipeline, offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeflow.cli import main
from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.recipe import load_recipe
from tests.conftest import DEMO_RECIPE
from tests.targets.conftest import needs_tflite

pytestmark = [pytest.mark.slow, needs_tflite, pytest.mark.usefixtures("offline_env")]


@pytest.mark.parametrize("target", ["tflite", "tflite_micro"])
def test_int8_keeps_accuracy(target: str, tmp_path: Path, shared_cache: Path) -> None:
    args = ["run", "recipe=digits_cnn", f"target={target}", "quantization=int8"]
    assert main([*args, f"cache_dir={shared_cache}", f"build_dir={tmp_path}"]) == 0
    out = tmp_path / "digits_cnn" / f"{target}-int8"
    assert (out / "model.tflite").read_bytes()[4:8] == b"TFL3"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True
    assert metrics["accuracy"]["source"] >= 0.97
    assert metrics["accuracy"]["drop"] <= 0.01
    assert metrics["agreement"]["top1"] >= 0.98
    assert metrics["size_bytes"] < 30_000  # int8 weights: a third of the float32 file
    if target == "tflite_micro":
        assert 1_000 < metrics["arena_bytes"] < 20_000
        predicted = metrics["arena_predicted_bytes"]  # measured 6,252 against 5,864 B
        assert abs(predicted - metrics["arena_bytes"]) / metrics["arena_bytes"] <= 0.25
    else:
        assert "arena_bytes" not in metrics
    assert "FULLY_CONNECTED" in (out / "report.md").read_text()


def build(tmp_path: Path, cache: Path, **overrides: object) -> dict:
    loaded = load_recipe(DEMO_RECIPE, {"verify.latency_runs": 20, **overrides})
    result = run_build(loaded, Cache(cache), tmp_path, print)
    assert result.failed_checks == []
    return result.metrics


@pytest.mark.parametrize("target", ["tflite", "tflite_micro"])
def test_float32_matches_pytorch(target: str, tmp_path: Path, shared_cache: Path) -> None:
    overrides = {"target": target, "quantization.mode": "none", "verify.max_abs_diff": 1e-4}
    metrics = build(tmp_path, shared_cache, **overrides)
    assert metrics["agreement"]["max_abs_diff"] <= 1e-4
    assert metrics["agreement"]["top1"] == 1.0
    assert metrics["accuracy"]["drop"] == 0.0
    if target == "tflite_micro":
        predicted = metrics["arena_predicted_bytes"]  # measured 14,572 against 14,920 B
        assert abs(predicted - metrics["arena_bytes"]) / metrics["arena_bytes"] <= 0.25


def test_tflite_fp16(tmp_path: Path, shared_cache: Path) -> None:
    metrics = build(tmp_path, shared_cache, **{"target": "tflite", "quantization.mode": "fp16"})
    assert metrics["agreement"]["max_abs_diff"] <= 5e-2
    assert metrics["agreement"]["top1"] >= 0.99
    assert metrics["size_bytes"] < 40_000  # float16 weights: about half of float32
