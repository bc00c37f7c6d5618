"""onnxruntime_micro's .ort artifact is byte-reproducible: two conversions of one model give
one file, which computes what the model does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from edgeflow.schema.sections import Quantization, TensorSpec
from edgeflow.targets import load_profile
from edgeflow.targets.base import ConvertJob
from edgeflow.targets.onnxruntime_micro import backend as onnxruntime_micro


def test_two_conversions_give_one_file_that_computes_the_same(tmp_path: Path) -> None:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 3)
    ).eval()
    source = tmp_path / "m.onnx"
    torch.onnx.export(model, (torch.zeros(1, 1, 8, 8),), str(source), dynamo=False,
                      input_names=["x"], opset_version=17)  # fmt: skip
    onnx.checker.check_model(onnx.load(str(source)))
    files = []
    for i in range(4):  # a fresh session each time: the converter's raw bytes differ
        out = tmp_path / f"out{i}"
        out.mkdir()
        job = ConvertJob(source, out, load_profile("onnxruntime_micro"), Quantization(),
                         [TensorSpec(name="x", shape=[1, 1, 8, 8])], None)  # fmt: skip
        onnxruntime_micro.convert(job)
        files.append((out / "model.ort").read_bytes())
    assert len(set(files)) == 1
    x = np.random.default_rng(0).random((1, 1, 8, 8), dtype=np.float32)
    want = ort.InferenceSession(str(source)).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(tmp_path / "out0" / "model.ort")).run(None, {"x": x})[0]
    assert np.array_equal(want, got)
