"""ConvTranspose on the TFLite family: re-measured, onnx2tf writes TRANSPOSE_CONV and the
runtimes compute it (the probe failed only for want of `kernel_shape`, targets/_onnx2tf.py);
a PyTorch upsampling decoder passes the precheck, builds and verifies."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from edgeflow.cli import main
from tests.targets.conftest import needs_tflite

MODEL = '''
import torch
from torch import nn


class Upsampler(nn.Module):
    """Conv, ReLU, then a stride-2 ConvTranspose2d with its bias (as torch builds it)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)

    def forward(self, image):
        return self.up(torch.relu(self.conv(image)))
'''
RECIPE = """
    source:
      kind: pytorch
      model: upsampler.py:Upsampler
      inputs: [{name: image, shape: [1, 1, 8, 8], dtype: float32}]
    calibration: {dataset: "edgeflow.datasets:sklearn_digits", split: calibration, samples: 64}
    evaluation: {dataset: "edgeflow.datasets:sklearn_digits", split: test, metric: agreement}
    quantization: {mode: MODE}
    target: TARGET
    verify: {max_relative_diff: TOLERANCE}
"""


@pytest.mark.slow
@needs_tflite
@pytest.mark.parametrize(
    ("target", "mode", "tolerance"),
    [
        ("tflite", "none", 1e-3),
        ("tflite_micro", "none", 1e-3),
        ("tflite", "int8", 0.1),
        ("tflite_micro", "int8", 0.1),
    ],
)
def test_a_conv_transpose_decoder_builds_and_verifies(
    target: str, mode: str, tolerance: float, tmp_path: Path, shared_cache: Path
) -> None:
    """Measured: max relative diff 2.3e-7 (LiteRT) and 1.5e-7 (TFLite Micro) in float32,
    0.062 on both in int8 (per-channel, 64 calibration digits)."""
    (tmp_path / "upsampler.py").write_text(MODEL)
    recipe = tmp_path / "recipe.yaml"
    text = textwrap.dedent(RECIPE).replace("TARGET", target).replace("MODE", mode)
    recipe.write_text(text.replace("TOLERANCE", str(tolerance)))
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0
    folder = tmp_path / "b" / "recipe" / f"{target}-{mode}"
    precheck = json.loads((folder / "precheck.json").read_text())
    assert precheck["passed"] is True and precheck["ops"]["ConvTranspose"] == 1
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["verified"] is True
    assert metrics["agreement"]["max_relative_diff"] <= tolerance
    assert "TRANSPOSE_CONV" in (folder / "report.md").read_text()
