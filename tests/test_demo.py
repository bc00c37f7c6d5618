"""The built-in demo end to end through the CLI: real data, real exporter, real runtime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeflow.cli import main
from edgeflow.core.errors import RecipeError
from edgeflow.recipe import load_recipe

pytestmark = pytest.mark.slow

METRICS_SHAPE = {
    "recipe": str,
    "target": str,
    "quantization": str,
    "verified": bool,
    "accuracy": {"source": float, "artifact": float, "drop": float},
    "agreement": {
        "top1": float,
        "max_abs_diff": float,
        "max_relative_diff": float,
        "non_finite_samples": int,
        "min_sqnr_db": float,
        "outputs": {
            "logits": {
                "kind": str,
                "sqnr_db": float,
                "relative_error": float,
                "max_abs_diff": float,
                "top1": float,
            }
        },
    },
    "latency_ms": {"p50": float, "p90": float},
    "size_bytes": int,
}


def build(tmp_path: Path, cache: Path, *overrides: str) -> dict:
    args = ["run", "recipe=digits_cnn", "target=onnxruntime_micro", f"cache_dir={cache}"]
    assert main([*args, f"build_dir={tmp_path / 'build'}", *overrides]) == 0
    mode = next((o.split("=")[1] for o in overrides if o.startswith("quantization")), "int8")
    out = tmp_path / "build" / "digits_cnn" / f"onnxruntime_micro-{mode}"
    assert (out / "model.ort").stat().st_size > 10_000
    assert "Reshape" in (out / "required_operators_and_types.config").read_text()
    assert "# digits_cnn -> onnxruntime_micro" in (out / "report.md").read_text()
    return json.loads((out / "metrics.json").read_text())


def assert_shape(value: object, shape: object) -> None:
    if isinstance(shape, dict):
        assert isinstance(value, dict) and set(value) == set(shape)
        for key, sub in shape.items():
            assert_shape(value[key], sub)
    else:
        assert isinstance(value, shape), (value, shape)  # type: ignore[arg-type]


def test_int8_demo_is_verified(tmp_path: Path, shared_cache: Path) -> None:
    metrics = build(tmp_path, shared_cache, "quantization=int8")
    assert_shape(metrics, METRICS_SHAPE)
    assert metrics["verified"] is True
    assert metrics["accuracy"]["source"] >= 0.97
    assert metrics["accuracy"]["drop"] <= 0.01
    assert metrics["agreement"]["top1"] >= 0.98
    logits = metrics["agreement"]["outputs"]["logits"]
    assert logits["kind"] == "classes" and logits["top1"] == metrics["agreement"]["top1"]
    # 28.7 dB measured; the int8 default floor is 15 dB (checks.json has the row)
    assert 25 < logits["sqnr_db"] == metrics["agreement"]["min_sqnr_db"] < 40
    assert metrics["latency_ms"]["p90"] >= metrics["latency_ms"]["p50"] > 0


def test_fp32_demo_matches_pytorch(tmp_path: Path, shared_cache: Path) -> None:
    metrics = build(tmp_path, shared_cache, "quantization.mode=none")
    assert metrics["agreement"]["max_abs_diff"] <= 1e-4
    assert metrics["agreement"]["top1"] == 1.0
    assert metrics["agreement"]["min_sqnr_db"] > 100  # 129.7 dB measured
    assert metrics["accuracy"]["drop"] == 0.0


def test_fp16_demo(tmp_path: Path, shared_cache: Path) -> None:
    metrics = build(tmp_path, shared_cache, "quantization=fp16")
    assert metrics["agreement"]["max_abs_diff"] <= 5e-2
    assert metrics["agreement"]["top1"] >= 0.99


def test_failed_threshold_exits_nonzero_and_keeps_the_artifact(
    tmp_path: Path, shared_cache: Path, write_recipe, capsys
) -> None:
    from tests.conftest import DEMO_RECIPE

    text = DEMO_RECIPE.read_text().replace("../models/", f"{DEMO_RECIPE.parent.parent}/models/")
    path = write_recipe(text.replace("verify:\n", "verify:\n  max_abs_diff: 1.0e-6\n"))
    code = main(["run", f"recipe={path}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"])
    assert code == 1
    err = capsys.readouterr().err
    assert "verification failed: verify.max_abs_diff:" in err
    assert "is above the threshold 1e-06" in err
    kept = tmp_path / "b" / "recipe" / "onnxruntime_micro-int8"
    assert (kept / "model.ort").is_file()
    assert json.loads((kept / "metrics.json").read_text())["verified"] is False


def test_relative_diff_threshold(tmp_path: Path, shared_cache: Path, write_recipe) -> None:
    """verify.max_relative_diff: |artifact - source| / max|source| per output; the int8 demo
    is about 3.5% off its logits' range, so 1e-3 fails and 0.1 holds."""
    from tests.conftest import DEMO_RECIPE

    text = DEMO_RECIPE.read_text().replace("../models/", f"{DEMO_RECIPE.parent.parent}/models/")
    path = write_recipe(text.replace("verify:\n", "verify:\n  max_relative_diff: 1.0e-3\n"))
    args = [f"recipe={path}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(["run", *args]) == 1
    metrics = json.loads((tmp_path / "b/recipe/onnxruntime_micro-int8/metrics.json").read_text())
    relative = metrics["agreement"]["max_relative_diff"]
    assert 1e-3 < relative < 0.1
    ratio = metrics["agreement"]["max_abs_diff"] / relative  # the largest |logit| of the source
    assert ratio > 1
    assert main(["run", *args, "verify.max_relative_diff=0.1"]) == 0


def test_agreement_metric_needs_no_labels(tmp_path: Path, shared_cache: Path, write_recipe) -> None:
    """evaluation.metric: agreement compares with the source only: no labels, no accuracy."""
    from tests.conftest import DEMO_RECIPE

    text = DEMO_RECIPE.read_text().replace("../models/", f"{DEMO_RECIPE.parent.parent}/models/")
    text = text.replace("split: test, metric: top1", "split: test, metric: agreement")
    text = text.replace("  max_accuracy_drop: 0.01", "  max_relative_diff: 0.1")
    path = write_recipe(text)
    args = [f"recipe={path}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(["run", *args]) == 0
    metrics = json.loads((tmp_path / "b/recipe/onnxruntime_micro-int8/metrics.json").read_text())
    assert metrics["accuracy"] is None and metrics["verified"] is True
    assert metrics["agreement"]["top1"] >= 0.98
    with pytest.raises(RecipeError, match=r"does not apply to evaluation\.metric: agreement"):
        load_recipe(write_recipe(text.replace("verify:\n", "verify:\n  max_accuracy_drop: 0.01\n")))
