"""The digits CNN from Keras and from Flax (recipes/digits_keras.yaml, digits_jax.yaml, their
weights trained by `dvc repro`) on every target: float32 within 1e-5 of the source
framework's own outputs, int8 at most one point below its accuracy."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.recipe import load_recipe
from tests import needs
from tests.conftest import REPO
from tests.report import plots_in

pytestmark = pytest.mark.slow

TARGETS = ("tflite", "tflite_micro", "armnn", "onnxruntime_micro")
# (recipe, the path each target takes): Keras natively to the TFLite family, else via ONNX
BUILDS = [
    *(("digits_keras", t, "native" if t != "onnxruntime_micro" else "onnx") for t in TARGETS),
    *(("digits_keras", t, "onnx") for t in ("tflite", "armnn")),  # the other path
    *(("digits_jax", t, "onnx") for t in TARGETS),
]


def build(recipe: str, target: str, mode: str, via: str, cache: Path, out: Path) -> dict:
    needs.require("tensorflow" if recipe == "digits_keras" else "jax2onnx")
    if target in ("tflite", "tflite_micro", "armnn"):
        needs.require("tflite", *(["armnn"] if target == "armnn" else []))
    overrides = {"target": target, "quantization.mode": mode}
    if recipe == "digits_keras":
        overrides["convert.via"] = via
    loaded = load_recipe(REPO / "recipes" / f"{recipe}.yaml", overrides)
    result = run_build(loaded, Cache(cache), out, print)
    if target in ("tflite", "tflite_micro", "armnn"):  # the .tflite takes NHWC images as they are
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=str(result.build_dir / "model.tflite"))
        assert interpreter.get_input_details()[0]["shape"].tolist() == [1, 8, 8, 1]
    # TensorFlow's own converter has no ONNX graph to estimate memory on: no memory plot
    expected = ["latency", "outputs", "confusion-logits"] + (["memory"] if via == "onnx" else [])
    if result.metrics.get("not_verified"):
        expected = ["memory"]
    assert plots_in((result.build_dir / "report.html").read_text()) == expected
    return result.metrics


@pytest.mark.parametrize(("recipe", "target", "via"), BUILDS)
def test_float32_and_int8_on_every_target(
    recipe: str, target: str, via: str, shared_cache: Path, tmp_path: Path
) -> None:
    float32 = build(recipe, target, "none", via, shared_cache, tmp_path)
    assert float32["verified"]
    assert float32["conversion"]["path"] == via
    assert float32["agreement"]["max_abs_diff"] < 1e-5  # 4.3e-6 to 5.7e-6 measured
    assert float32["accuracy"]["drop"] == 0
    int8 = build(recipe, target, "int8", via, shared_cache, tmp_path)
    assert int8["verified"]
    assert int8["accuracy"]["drop"] <= 0.01
    assert int8["agreement"]["min_sqnr_db"] > 30  # 32.5-36.7 dB measured
    if via == "onnx":  # the error each step added: tf2onnx / jax2onnx is exact, int8 is not
        assert int8["conversion"]["source_to_onnx"] < 1e-5
        assert int8["conversion"]["onnx_to_target"] > 1e-3


def test_tensorrt_builds_from_keras_through_onnx(shared_cache: Path, tmp_path: Path) -> None:
    """tensorrt takes the ONNX path; without a GPU the engine is not run (not verified)."""
    metrics = build("digits_keras", "tensorrt", "int8", "onnx", shared_cache, tmp_path)
    assert not metrics["verified"] and "no GPU" in metrics["not_verified"]


def test_the_flax_mobilenet_through_onnx2tf(shared_cache: Path, tmp_path: Path) -> None:
    """jax2onnx wraps every Conv in Transposes; the TFLite family's onnx.cancel_transposes
    takes them out before onnx2tf guesses layouts (without it: top-1 0.10, SQNR -5.7 dB)."""
    needs.require("jax2onnx", "tflite")
    path = REPO / "recipes" / "digits_jax_mobilenet.yaml"
    loaded = load_recipe(path, {"target": "tflite", "quantization.mode": "none"})
    result = run_build(loaded, Cache(shared_cache), tmp_path, print)
    assert result.metrics["verified"]
    assert result.metrics["agreement"]["max_abs_diff"] < 1e-4  # 9.5e-6 measured
    report = (result.build_dir / "report.md").read_text()
    assert "`onnx.cancel_transposes`: changed, 14 matches" in report  # 16 -> 2 Transposes
