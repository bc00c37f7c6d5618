"""A time-major CTC output through the CLI: an ONNX model built in code answers [T, B, C]
for [B, T, C] input; with `batch_axis: 1` it is verified per string in onnxruntime, over
padded batches, and a batch axis it cannot have is an error at its line in the recipe."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from edgeflow.cli import main

pytestmark = pytest.mark.slow

BATCH, STEPS, CLASSES, SAMPLES = 3, 4, 5, 7  # 7 samples: batches of 3, 3 and 1 (padded)


def time_major(folder: Path) -> None:
    """x [3, 4, 5] -> ctc = Transpose(Softmax(x)) [4, 3, 5]: time-major, as a CTC head."""
    graph = helper.make_graph(
        [
            helper.make_node("Softmax", ["x"], ["p"], axis=-1),
            helper.make_node("Transpose", ["p"], ["ctc"], perm=[1, 0, 2]),
        ],
        "time_major",
        [helper.make_tensor_value_info("x", T.FLOAT, [BATCH, STEPS, CLASSES])],
        [helper.make_tensor_value_info("ctc", T.FLOAT, [STEPS, BATCH, CLASSES])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, str(folder / "tm.onnx"))
    data = np.random.default_rng(0).standard_normal((SAMPLES, STEPS, CLASSES)) * 4
    np.savez(folder / "data.npz", x=data.astype(np.float32))


def run(folder: Path, batch_axis: int) -> tuple[int, Path]:
    time_major(folder)
    (folder / "r.yaml").write_text(
        "source: {kind: onnx, model: tm.onnx, inputs: [{name: x, shape: [3, 4, 5]}]}\n"
        "evaluation:\n  dataset: data.npz\n  metric: agreement\n  outputs:\n"
        f"    ctc: {{kind: classes, ctc_blank: 0, batch_axis: {batch_axis}}}\n"
        "target: onnxruntime_micro\n"
        "verify: {latency_runs: 2, warmup_runs: 0, min_sequence_agreement: 1.0}\n"
    )
    args = [f"cache_dir={folder / 'c'}", f"build_dir={folder / 'b'}"]
    code = main(["run", f"recipe={folder / 'r.yaml'}", *args])
    return code, folder / "b" / "r" / "onnxruntime_micro-none"


def test_a_time_major_ctc_output_is_verified_per_string(tmp_path: Path) -> None:
    code, out = run(tmp_path, 1)
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True
    ctc = metrics["agreement"]["outputs"]["ctc"]
    assert ctc["kind"] == "classes" and ctc["batch_axis"] == 1
    assert ctc["sequences"] == SAMPLES and ctc["sequence"] == 1.0  # 7 strings, not 4 x 7
    assert ctc["top1"] == 1.0
    verify = json.loads(next((tmp_path / "c").rglob("verify.json")).read_text())
    [o] = verify["agreement"]["outputs"]
    assert o["shape"] == [STEPS, CLASSES] and o["positions"] == STEPS
    assert o["sequences_matched"] == SAMPLES and sum(o["per_class"]["picked"]) == SAMPLES * STEPS
    report = (out / "report.md").read_text()
    assert "| 0 `ctc` | [4, 5] (samples on axis 1) | classes |" in report
    assert "| verify.min_sequence_agreement (`ctc`) | 1 | 1 | pass |" in report


def test_a_batch_axis_the_output_cannot_have_is_located(tmp_path: Path, capsys) -> None:
    code, _ = run(tmp_path, 3)
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: stage 'ingest' failed: ")  # where the rank is first known
    assert (
        "r.yaml:6:52: evaluation.outputs.ctc.batch_axis: output 'ctc' has shape [4, 3, 5], no "
        "axis 3 (got 3)" in err
    )
    assert "hint: set batch_axis to the axis of [4, 3, 5] that holds the samples" in err
