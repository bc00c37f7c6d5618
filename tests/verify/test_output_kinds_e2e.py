"""Output kinds through the CLI: an ONNX model built in code with a one-value probability
and a segmentation-like map, verified in onnxruntime; figures in metrics.json, report.md and
the checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from edgeflow.cli import main

pytestmark = pytest.mark.slow


def two_headed(folder: Path) -> Path:
    """x [1, 8] -> speech = Sigmoid(sum(x)) [1, 1], mask = Reshape(x * 2) [1, 2, 2, 2]."""
    shape = numpy_helper.from_array(np.array([1, 2, 2, 2], np.int64), "shape")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=1),
            helper.make_node("Sigmoid", ["s"], ["speech"]),
            helper.make_node("Mul", ["x", "two"], ["m"]),
            helper.make_node("Reshape", ["m", "shape"], ["mask"]),
        ],
        "two_headed",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 8])],
        [
            helper.make_tensor_value_info("speech", T.FLOAT, [1, 1]),
            helper.make_tensor_value_info("mask", T.FLOAT, [1, 2, 2, 2]),
        ],
        [shape, two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, str(folder / "two.onnx"))
    data = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
    np.savez(folder / "data.npz", x=data)
    return folder / "two.onnx"


def run(folder: Path, verify: str, outputs: str = "") -> tuple[int, dict, str]:
    two_headed(folder)
    declared = f", outputs: {outputs}" if outputs else ""
    (folder / "r.yaml").write_text(
        "source: {kind: onnx, model: two.onnx, inputs: [{name: x, shape: [1, 8]}]}\n"
        f"evaluation: {{dataset: data.npz, metric: agreement{declared}}}\n"
        "target: onnxruntime_micro\n"
        f"verify: {{latency_runs: 2, warmup_runs: 0, {verify}}}\n"
    )
    args = [f"cache_dir={folder / 'c'}", f"build_dir={folder / 'b'}"]
    code = main(["run", f"recipe={folder / 'r.yaml'}", *args])
    out = folder / "b" / "r" / "onnxruntime_micro-none"
    return code, json.loads((out / "metrics.json").read_text()), (out / "report.md").read_text()


def test_top1_on_outputs_that_are_no_class_vectors_fails_saying_so(tmp_path: Path) -> None:
    code, metrics, report = run(tmp_path, "min_top1_agreement: 0.9, min_decision_agreement: 1.0")
    assert code == 1 and metrics["verified"] is False
    agreement = metrics["agreement"]
    assert "top1" not in agreement and set(agreement["outputs"]) == {"speech", "mask"}
    speech, mask = agreement["outputs"]["speech"], agreement["outputs"]["mask"]
    assert speech["kind"] == "probability" and speech["decision"] == 1.0
    assert mask["kind"] == "values" and mask["sqnr_db"] > 100 and mask["relative_error"] < 1e-6
    assert "| 0 `speech` | [1] | probability (by shape) |" in report
    assert "decision agreement 1.0000 at 0.5" in report
    assert "| 1 `mask` | [2, 2, 2] | values (by shape) |" in report
    assert (
        "- **FAIL**: verify.min_top1_agreement: no output is a class vector, so there is nothing "
        "it can measure ('speech' [1] is probability by its shape, 'mask' [2, 2, 2] is values by "
        "its shape); declare evaluation.outputs.<name>.kind: classes for a class output, or use "
        "verify.min_sqnr_db\n" in report
    )
    assert "| verify.min_top1_agreement | n/a | 0.9 | **FAIL** |" in report
    assert "| verify.min_decision_agreement (`speech`) | 1 | 1 | pass |" in report


def test_a_declared_per_pixel_class_map_and_an_unknown_name(tmp_path: Path, capsys) -> None:
    code, metrics, report = run(
        tmp_path, "min_top1_agreement: 0.99", "{mask: {kind: classes, axis: 1}}"
    )
    assert code == 0 and metrics["verified"] is True
    mask = metrics["agreement"]["outputs"]["mask"]
    assert mask["kind"] == "classes" and mask["top1"] == 1.0 and mask["sequence"] == 1.0
    assert metrics["agreement"]["top1"] == 1.0
    assert "| verify.min_top1_agreement (`mask`) | 1 | 0.99 | pass |" in report
    capsys.readouterr()
    code, _, _ = run(tmp_path, "min_top1_agreement: 0.99", "{masks: {kind: values}}")
    assert code == 2
    err = capsys.readouterr().err
    assert "evaluation.outputs.masks: the model has no output 'masks' (its outputs: speech, " in err
    assert "did you mean 'mask'?" in err
