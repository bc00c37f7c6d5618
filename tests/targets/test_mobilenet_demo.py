"""The larger demo (MobileNetV3-style, digits at 32x32) through the targets: what they do
with hard swish, squeeze-excite, depthwise convolutions and a residual."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeflow.cli import main
from tests.targets.conftest import needs_tflite
from tests.targets.test_armnn import needs_armnn

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("offline_env")]


def build(tmp_path: Path, cache: Path, target: str, mode: str, *extra: str) -> tuple[int, dict]:
    args = ["run", "recipe=digits_mobilenet", f"target={target}", f"quantization={mode}", *extra]
    code = main([*args, f"cache_dir={cache}", f"build_dir={tmp_path}"])
    out = tmp_path / "digits_mobilenet" / f"{target}-{mode}"
    return code, json.loads((out / "metrics.json").read_text())


def test_onnxruntime_micro_int8(tmp_path: Path, shared_cache: Path) -> None:
    code, metrics = build(tmp_path, shared_cache, "onnxruntime_micro", "int8")
    assert code == 0 and metrics["verified"]
    assert metrics["accuracy"]["source"] >= 0.96  # measured 0.9778
    assert metrics["accuracy"]["drop"] <= 0.01 and metrics["agreement"]["top1"] >= 0.98


@needs_tflite
def test_tflite_micro_int8_with_the_decomposed_hard_activations(
    tmp_path: Path, shared_cache: Path
) -> None:
    code, metrics = build(tmp_path, shared_cache, "tflite_micro", "int8")
    assert code == 0 and metrics["verified"]
    assert metrics["agreement"]["top1"] >= 0.98
    measured, predicted = metrics["arena_bytes"], metrics["arena_predicted_bytes"]
    assert abs(predicted - measured) / measured <= 0.25  # measured +24% (22,400 B)


@needs_tflite
@needs_armnn
def test_armnn_int8_keeps_its_accuracy_with_padding_as_concatenated_zeros(
    tmp_path: Path, shared_cache: Path
) -> None:
    """The profile's onnx.pad_with_concat keeps Arm NN's int8 PAD (which pads with the
    integer 0, not the zero point) out of the graph."""
    code, metrics = build(tmp_path, shared_cache, "armnn", "int8")
    assert code == 0 and metrics["verified"]
    assert metrics["accuracy"]["artifact"] >= 0.97  # measured 0.9750 (source 0.9778)


@needs_tflite
@needs_armnn
def test_without_it_the_build_fails_and_the_diff_names_the_padded_depthwise_conv(
    tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the target's rewrites Arm NN 22.0 runs the per-tensor int8 graph wrongly and
    without an error; the build fails, and the per-layer diff that follows names the first
    stride-2 depthwise convolution after a PAD whose border is wrong."""
    code, metrics = build(tmp_path, shared_cache, "armnn", "int8", "target_rewrites=false")
    assert code == 1 and metrics["verified"] is False
    assert metrics["accuracy"]["drop"] > 0.1  # measured 0.9778 -> 0.5889
    out = tmp_path / "digits_mobilenet" / "armnn-int8"
    found = json.loads((out / "diff.json").read_text())
    divergence = found["first_divergence"]
    assert divergence["op"] == "Conv" and divergence["sqnr_db"] < 10  # measured 5.0 dB
    assert divergence["inputs_sqnr_db"] > 15  # measured 18.1 dB: the layer before is fine
    assert "first divergence: " in capsys.readouterr().out
    assert (out / "layers_diff.csv").read_text().startswith("tensor,op,node,")


@needs_tflite
@needs_armnn
def test_bisection_finds_the_same_layer_by_converting_prefixes(
    tmp_path: Path, shared_cache: Path
) -> None:
    """`edgeflow diff --bisect` reads no intermediate tensor: it converts and runs prefixes
    of the model, and ends at the padded depthwise convolution the per-layer diff names."""
    args = ["diff", "digits_mobilenet", "--bisect", "target=armnn", "target_rewrites=false"]
    assert main([*args, f"cache_dir={shared_cache}", f"build_dir={tmp_path}"]) == 1
    found = json.loads((tmp_path / "digits_mobilenet" / "armnn-int8" / "bisect.json").read_text())
    first, last = found["first_failing"], found["last_passing"]
    assert first["op"] == "Conv" and first["verdict"] == "diverges"
    assert first["sqnr_db"] < 10  # measured 5.0 dB
    assert last["op"] == "Conv" and last["index"] == first["index"] - 1  # the conv before it
    assert len(found["attempts"]) <= 2 + found["candidates"].bit_length()
    layers = json.loads((tmp_path / "digits_mobilenet" / "armnn-int8" / "diff.json").read_text())
    assert layers["first_divergence"]["node"] == first["node"]  # the build's own diff agrees
