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


@pytest.mark.parametrize("target", ["tflite", "tflite_micro"])
def test_int16_activations_are_closer_to_pytorch_than_int8(
    target: str, tmp_path: Path, shared_cache: Path
) -> None:
    """TFLite's 16x8 mode: int8 weights, int16 activations and I/O (onnx2tf's
    full_integer_quant_with_int16_act), run in LiteRT and in TFLite Micro."""
    int8 = build(tmp_path / "a", shared_cache, target=target, **{"quantization.mode": "int8"})
    wide = build(
        tmp_path / "b",
        shared_cache,
        target=target,
        **{"quantization.mode": "int8", "quantization.activations": "int16"},
    )
    assert wide["accuracy"]["drop"] <= 0.01 and wide["agreement"]["top1"] >= 0.98
    # measured on both runtimes: max abs diff 0.192 with int16 activations, 0.286 with int8
    assert wide["agreement"]["max_abs_diff"] < int8["agreement"]["max_abs_diff"]
    report = (tmp_path / "b" / "digits_cnn" / f"{target}-int8-int16act" / "report.md").read_text()
    assert "TFLite 16x8: symmetric int8 weights, symmetric int16 activations" in report
    if target == "tflite_micro":
        assert wide["arena_bytes"] > int8["arena_bytes"]  # two bytes per activation
        predicted = wide["arena_predicted_bytes"]
        assert abs(predicted - wide["arena_bytes"]) / wide["arena_bytes"] <= 0.25


def test_int16_activations_need_a_16x8_runtime() -> None:
    from edgeflow.core.errors import RecipeError

    with pytest.raises(RecipeError) as err:
        load_recipe(DEMO_RECIPE, {"target": "armnn", "quantization.activations": "int16"})
    text = err.value.render()
    assert "quantization.activations" in text and "choose tflite or tflite_micro" in text
