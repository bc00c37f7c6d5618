"""STFT front ends: a strided Conv1d by a constant DFT basis over raw audio, then magnitude
(and log), built for tflite and tflite_micro and verified against the source model.

TorchScript's export of reflect padding on [1, T] audio computes the pads from int64
constants that nothing folded, so no shape after the Pad was known and onnx2tf took the
Conv1d's NCW input for NWC ("tf.nn.convolution": "Depth of output (258) is not a multiple of
the number of groups (640)"); ingest folds the subgraph into a constant (edgeflow/stages/
_normalise.py), as the targets' default onnx.fold_constants did before.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from edgeflow.cli import main
from tests.targets.conftest import needs_tflite

FRONT_END = '''
import numpy as np
import torch
from torch import nn


def basis(n_fft):
    """Real and imaginary DFT rows times a Hann window: [2 * (n_fft // 2 + 1), 1, n_fft]."""
    n, k = np.arange(n_fft), np.arange(n_fft // 2 + 1)[:, None]
    window = np.hanning(n_fft + 1)[:-1]
    rows = np.concatenate([np.cos(2 * np.pi * k * n / n_fft), -np.sin(2 * np.pi * k * n / n_fft)])
    return torch.from_numpy((rows * window)[:, None, :].astype(np.float32))


class Magnitude(nn.Module):
    """silero-vad's front end: reflect padding of [1, T] audio, the basis, |X|."""

    def __init__(self, n_fft=256, hop=128):
        super().__init__()
        self.bins, self.hop = n_fft // 2 + 1, hop
        self.register_buffer("basis", basis(n_fft))

    def forward(self, audio):
        padded = nn.functional.pad(audio, (0, 64), mode="reflect").unsqueeze(1)
        y = nn.functional.conv1d(padded, self.basis, stride=self.hop)
        re, im = y[:, : self.bins], y[:, self.bins :]
        return torch.sqrt(re * re + im * im)


class LogSpectrogram(nn.Module):
    """A Whisper-sized STFT (n_fft 400, hop 160) over [1, 1, T] audio: log |X|."""

    def __init__(self, n_fft=400, hop=160):
        super().__init__()
        self.bins = n_fft // 2 + 1
        self.conv = nn.Conv1d(1, 2 * self.bins, n_fft, stride=hop, bias=False)
        self.conv.weight.data = basis(n_fft)

    def forward(self, audio):
        y = self.conv(audio)
        re, im = y[:, : self.bins], y[:, self.bins :]
        return torch.log(torch.sqrt(re * re + im * im + 1e-6) + 1e-6)


def tones(split="test", count=8, shape=(1, 576)):
    """Sine tones in noise (fixed seed per split), [count, *shape[1:]]."""
    rng = np.random.default_rng({"test": 0, "calibration": 1}.get(split, 2))
    t = np.arange(shape[-1]) / 16000
    freq = rng.uniform(100, 4000, (count,) + (1,) * (len(shape) - 1))
    noise = rng.standard_normal((count, *shape[1:])) * 0.05
    return {"audio": (np.sin(2 * np.pi * freq * t) * 0.5 + noise).astype(np.float32)}
'''
ONNX_RECIPE = """
    source:
      kind: onnx
      model: magnitude.onnx
      inputs: [{name: audio, shape: [1, 576], dtype: float32}]
    calibration: {dataset: "front_end.py:tones", split: calibration, samples: 8}
    evaluation: {dataset: "front_end.py:tones", split: test, metric: agreement}
    quantization: {mode: none}
    target: TARGET
    verify: {max_relative_diff: 1.0e-3}
"""
TORCH_RECIPE = """
    source:
      kind: pytorch
      model: front_end.py:LogSpectrogram
      inputs: [{name: audio, shape: [1, 1, 16000], dtype: float32}]
    calibration:
      dataset: "front_end.py:tones"
      split: calibration
      samples: 8
      options: {shape: [1, 1, 16000]}
    evaluation:
      dataset: "front_end.py:tones"
      split: test
      metric: agreement
      options: {shape: [1, 1, 16000]}
    quantization: {mode: none}
    target: TARGET
    verify: {max_relative_diff: 1.0e-3}
"""


def write(tmp_path: Path, recipe: str, target: str, extra: str = "") -> Path:
    (tmp_path / "front_end.py").write_text(FRONT_END)
    if "magnitude.onnx" in recipe:
        _export_magnitude(tmp_path)
    path = tmp_path / "recipe.yaml"
    path.write_text(textwrap.dedent(recipe).replace("TARGET", target) + extra)
    return path


def _export_magnitude(folder: Path) -> None:
    """The TorchScript exporter's ONNX (the one that computes the pads in the graph)."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("front_end", folder / "front_end.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.onnx.export(
        module.Magnitude(),
        (torch.randn(1, 576),),
        str(folder / "magnitude.onnx"),
        dynamo=False,
        opset_version=17,
        input_names=["audio"],
        output_names=["magnitude"],
    )


def build(recipe: Path, cache: Path, out: Path) -> int:
    return main(["run", f"recipe={recipe}", f"cache_dir={cache}", f"build_dir={out}"])


@pytest.mark.slow
@needs_tflite
@pytest.mark.parametrize("target", ["tflite", "tflite_micro"])
def test_a_padded_stft_front_end_builds_and_verifies(
    target: str, tmp_path: Path, shared_cache: Path
) -> None:
    """Measured: max relative diff 1.2e-7 (max abs 3.8e-6) on both, in float32."""
    recipe = write(tmp_path, ONNX_RECIPE, target)
    assert build(recipe, shared_cache, tmp_path / "b") == 0
    folder = tmp_path / "b" / "recipe" / f"{target}-none"
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["verified"] is True
    assert metrics["agreement"]["max_relative_diff"] <= 1e-3
    report = (folder / "report.md").read_text()
    # the pads' int64 subgraph is folded at ingest, before the target's own fold_constants
    (folded,) = [line for line in report.splitlines() if "constant nodes folded" in line]
    assert "ConstantOfShape x1" in folded and "Concat x" in folded
    assert "CONV_2D" in report and "retried" not in report  # onnx2tf converted at once


@pytest.mark.slow
@needs_tflite
def test_without_the_target_rewrites_ingest_has_folded_the_pads(
    tmp_path: Path, shared_cache: Path
) -> None:
    """The cause, measured before ingest folded constant subgraphs: without the target's
    rewrites the precheck suggested onnx.fold_constants, and onnx2tf, let through, failed on
    the Conv1d ("tf.nn.convolution": "not a multiple of the number of groups"). Ingest
    folds them now, so the build verifies with the target's rewrites off."""
    recipe = write(tmp_path, ONNX_RECIPE, "tflite", "target_rewrites: false\n")
    assert build(recipe, shared_cache, tmp_path / "b") == 0
    metrics = json.loads((tmp_path / "b" / "recipe" / "tflite-none" / "metrics.json").read_text())
    assert metrics["verified"] is True
    assert any("constant nodes folded" in note for note in metrics["ingest"])


@pytest.mark.slow
@needs_tflite
@pytest.mark.parametrize("target", ["tflite", "tflite_micro"])
def test_a_whisper_sized_log_spectrogram_builds_and_verifies(
    target: str, tmp_path: Path, shared_cache: Path
) -> None:
    """n_fft 400, hop 160 (402 output channels, kernel 400, stride 160) from PyTorch through
    the dynamo exporter (no padding subgraph): measured max relative diff 2.1e-4 (LiteRT)
    and 1.9e-4 (TFLite Micro) of the log magnitude's range. Its float32 arena (317,780 B)
    needs a 512 KiB board on TFLM."""
    board = "precheck: {board: cortex_m7_512k}\n" if target == "tflite_micro" else ""
    recipe = write(tmp_path, TORCH_RECIPE, target, board)
    assert build(recipe, shared_cache, tmp_path / "b") == 0
    folder = tmp_path / "b" / "recipe" / f"{target}-none"
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["verified"] is True
    assert metrics["agreement"]["max_relative_diff"] <= 1e-3
