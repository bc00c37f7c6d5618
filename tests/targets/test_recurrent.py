"""Recurrent layers end to end: a PyTorch LSTM over the 8 rows of a digit, built for each
target (the TFLite family through its default onnx.unroll_recurrent, onnxruntime_micro with
its native LSTM kernel) and verified against PyTorch."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from edgeflow.cli import main
from tests.targets.conftest import needs_tflite
from tests.targets.test_armnn import needs_armnn
from tests.targets.test_target_rewrites import target_rules

MODEL = '''
import torch
from torch import nn


class RowLSTM(nn.Module):
    """An LSTM reading the digit's 8 rows; the head reads the last hidden state."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.head = nn.Linear(16, 10)

    def forward(self, image):
        _, (h, _) = self.lstm(image.reshape(1, 8, 8))
        return self.head(h.reshape(1, 16))
'''
RECIPE = """
    source:
      kind: pytorch
      model: lstm.py:RowLSTM
      inputs: [{name: image, shape: [1, 1, 8, 8], dtype: float32}]
    calibration: {dataset: "edgeflow.datasets:sklearn_digits", split: calibration, samples: 64}
    evaluation: {dataset: "edgeflow.datasets:sklearn_digits", split: test, metric: agreement}
    quantization: {mode: MODE}
    target: TARGET
    verify: {max_relative_diff: TOLERANCE}
"""


def build(tmp_path: Path, cache: Path, target: str, mode: str, tolerance: float) -> dict:
    (tmp_path / "lstm.py").write_text(MODEL)
    recipe = tmp_path / "recipe.yaml"
    text = textwrap.dedent(RECIPE).replace("TARGET", target).replace("MODE", mode)
    recipe.write_text(text.replace("TOLERANCE", str(tolerance)))
    args = ["run", f"recipe={recipe}", f"cache_dir={cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0
    out = tmp_path / "b" / "recipe" / f"{target}-{mode}"
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.slow
@needs_tflite
@needs_armnn
@pytest.mark.parametrize("target", ["tflite", "tflite_micro", "armnn", "onnxruntime_micro"])
def test_an_lstm_builds_and_verifies_in_float32(
    target: str, tmp_path: Path, shared_cache: Path
) -> None:
    """Measured: max relative diff 2.0e-7 to 3.5e-7 (docs/coverage.md)."""
    metrics = build(tmp_path, shared_cache, target, "none", 1e-3)
    assert metrics["verified"] is True and metrics["agreement"]["max_relative_diff"] <= 1e-3
    rules = target_rules(tmp_path / "recipe.yaml", shared_cache, tmp_path / "b")
    if target == "onnxruntime_micro":  # a native LSTM kernel: no default rewrites
        assert "onnx.unroll_recurrent" not in rules
    else:
        assert rules["onnx.unroll_recurrent"]["matches"] == 1


@pytest.mark.slow
@needs_tflite
@needs_armnn
@pytest.mark.parametrize("target", ["tflite", "tflite_micro", "armnn", "onnxruntime_micro"])
def test_an_lstm_builds_in_int8(target: str, tmp_path: Path, shared_cache: Path) -> None:
    """Measured: top-1 agreement 0.964-0.972, SQNR 40.3-45.4 dB (docs/coverage.md)."""
    metrics = build(tmp_path, shared_cache, target, "int8", 0.1)
    assert metrics["verified"] is True
    assert metrics["agreement"]["top1"] >= 0.9
