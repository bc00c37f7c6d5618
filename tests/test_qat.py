"""QAT export: the QAT-fine-tuned digits demo keeps its own int8 scales, without calibration,
and its int8 artifact matches the QAT model's accuracy."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from edgeflow.cli import main
from edgeflow.core.errors import EdgeflowError
from edgeflow.recipe import find_recipe, load_recipe
from edgeflow.stages.quantize import _from_qat


@pytest.mark.slow
def test_qat_digits_int8_artifact_matches_the_qat_model(tmp_path: Path, shared_cache: Path) -> None:
    args = ["run", "recipe=digits_cnn_qat", f"cache_dir={shared_cache}", f"build_dir={tmp_path}"]
    assert main(args) == 0
    out = tmp_path / "digits_cnn_qat" / "onnxruntime_micro-int8"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True
    assert metrics["accuracy"]["source"] >= 0.97  # the QAT model's own accuracy (fake quant)
    assert abs(metrics["accuracy"]["drop"]) <= 0.005  # measured: 0.9889 -> 0.9889
    assert metrics["agreement"]["top1"] >= 0.98
    report = (out / "report.md").read_text()
    assert "the QAT model's own scales (4 weight tensors stored as int8), no calibration" in report
    config = (out / "required_operators_and_types.config").read_text()
    assert "QLinearConv" in config  # int8 kernels, not float ops between Q/DQ


def test_qat_needs_no_calibration_but_a_qdq_consumer(tmp_path: Path) -> None:
    loaded = load_recipe(find_recipe("digits_cnn_qat"))
    assert loaded.recipe.calibration is None and loaded.recipe.quantization.method == "qat"
    with pytest.raises(EdgeflowError, match=r"quantization\.method: target 'tflite' cannot"):
        load_recipe(find_recipe("digits_cnn_qat"), {"target": "tflite"})


def test_qat_without_qdq_in_the_model_is_explained(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    onnx.save(helper.make_model(graph), str(tmp_path / "m.onnx"))
    with pytest.raises(EdgeflowError, match="has none") as info:
        _from_qat(tmp_path / "m.onnx", tmp_path / "out.onnx")
    assert "ast.freeze_fake_quant" in (info.value.hint or "")
    assert not (tmp_path / "out.onnx").exists()
