"""A recipe whose source is an ONNX file: the ingest head replaces load/export."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.recipe import load_recipe
from tests.conftest import demo_onnx

pytestmark = pytest.mark.slow


@pytest.fixture
def onnx_recipe(tmp_path: Path, write_recipe) -> Path:
    demo_onnx(tmp_path)
    return write_recipe(
        """
        source:
          kind: onnx
          model: digits.onnx
          inputs: [{name: image, shape: [1, 1, 8, 8]}]
        calibration: {dataset: calib.npz}
        evaluation: {dataset: "edgeflow.datasets:sklearn_digits", split: test}
        quantization: {mode: none, reduce_range: true}
        target: onnxruntime_micro
        verify: {max_abs_diff: 1.0e-4, max_accuracy_drop: 0.01}
        """
    )


def test_onnx_source_float_and_int8(onnx_recipe: Path, tmp_path: Path) -> None:
    cache, build = Cache(tmp_path / "cache"), tmp_path / "build"
    fp32 = run_build(load_recipe(onnx_recipe), cache, build, print)
    assert [o.stage for o in fp32.outcomes][:4] == [
        "ingest",
        "rewrite_onnx",
        "rewrite_target",
        "optimize",
    ]
    assert fp32.metrics["agreement"]["max_abs_diff"] <= 1e-4
    assert fp32.metrics["accuracy"]["source"] >= 0.97
    assert fp32.failed_checks == []

    overrides = {"quantization.mode": "int8", "verify.max_abs_diff": None}
    int8 = run_build(load_recipe(onnx_recipe, overrides), cache, build, print)
    assert {o.stage: o.status for o in int8.outcomes}["ingest"] == "cached"
    assert int8.metrics["accuracy"]["drop"] <= 0.01
    assert int8.metrics["agreement"]["top1"] >= 0.98
    assert (build / "recipe" / "onnxruntime_micro-int8" / "model.ort").is_file()
