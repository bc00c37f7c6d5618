"""The precheck: every finding at once, with a suggested rule; as a command and as a stage."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import torch

from edgeflow.cli import main
from tests.conftest import DEMO_RECIPE, DEMO_WEIGHTS


class Wobbly(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x.double()).float() * 2


@pytest.fixture
def wobbly(tmp_path: Path) -> Path:
    path = tmp_path / "wobbly.onnx"
    torch.onnx.export(
        Wobbly(),
        (torch.rand(1, 4),),
        str(path),
        dynamo=False,
        opset_version=17,
        input_names=["x"],
        dynamic_axes={"x": {0: "batch"}},
    )
    return path


def test_precheck_command_lists_every_finding_with_a_rule(wobbly: Path, capsys) -> None:
    assert main(["precheck", str(wobbly), "--target", "tflite_micro", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    by_op = {f["operator"]: f for f in report["findings"]}
    assert report["passed"] is False
    assert by_op["(inputs)"]["nodes"] == ["x"] and by_op["(inputs)"]["rule"] == "onnx.fix_shapes"
    assert by_op["(float64)"]["rule"] == "onnx.cast_float64_to_float32"
    assert by_op["(float64)"]["count"] >= 3
    # onnxruntime takes float64 and dynamic shapes, but has no float64 Erf kernel, as it says:
    assert main(["precheck", str(wobbly), "--target", "onnxruntime_micro", "--json"]) == 1
    [erf] = json.loads(capsys.readouterr().out)["findings"]
    assert erf["reason"] == "no kernel for double inputs (takes float)"
    assert erf["rule"] == "onnx.cast_float64_to_float32"
    import onnxruntime

    with pytest.raises(Exception, match="Erf"):
        onnxruntime.InferenceSession(str(wobbly), providers=["CPUExecutionProvider"])


def test_operator_list_and_the_suggested_rule_removes_the_finding(
    wobbly: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "no_erf.yaml").write_text(
        "name: no_erf\nbackend: onnxruntime_micro\n"
        "operators: [Cast, Mul, Div, Add, Constant, Sqrt, Clip]\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["precheck", str(wobbly), "--target", "no_erf"]) == 1
    out = capsys.readouterr().out
    assert "| Erf | 1 | not supported by no_erf | /Erf | `onnx.decompose` |" in out

    from edgeflow.rules.base import RewriteContext
    from edgeflow.rules.onnx.decompose import Decompose

    fixed = Decompose().apply(onnx.load(str(wobbly)), Decompose.Options(), RewriteContext([]))
    onnx.save(fixed.model, str(tmp_path / "fixed.onnx"))
    assert main(["precheck", str(tmp_path / "fixed.onnx"), "--target", "no_erf"]) == 0


@pytest.mark.slow
def test_failed_precheck_stops_the_run_unless_the_recipe_continues(
    tmp_path: Path, write_recipe, capsys
) -> None:
    text = DEMO_RECIPE.read_text().replace("../models/digits_cnn.pt", str(DEMO_WEIGHTS))
    text = text.replace("exporter: dynamo", "exporter: torchscript").replace(
        "opset: 18", "opset: 17"
    )
    inline = (
        "target:\n  name: no_gemm\n  backend: onnxruntime_micro\n"
        "  operators: [Conv, Relu, MaxPool, GlobalAveragePool, ReduceMean, Flatten, Reshape]\n"
    )
    path = write_recipe(text.replace("target: onnxruntime_micro\n", inline))
    args = ["run", f"recipe={path}", f"cache_dir={tmp_path}/c", f"build_dir={tmp_path}/b"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "stage 'precheck' failed: the model does not pass the no_gemm precheck" in err
    assert "| Gemm | 1 | not supported by no_gemm |" in err
    assert not (tmp_path / "b").exists()

    path.write_text(path.read_text() + "precheck: {continue_on_failure: true}\n")
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "warning: the model does not pass the no_gemm precheck" in out
    assert "continuing because the recipe sets precheck.continue_on_failure" in out
    report = (tmp_path / "b" / "recipe" / "no_gemm-int8" / "report.md").read_text()
    assert "precheck: FAILED against `no_gemm`" in report and "| Gemm | 1 |" in report
