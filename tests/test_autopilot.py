"""`rewrites: auto` and `edgeflow fix` end to end: the fixes edgeflow knows, applied for the
user, recorded, cached like written rules, and written into the recipe."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgeflow.cli import main
from edgeflow.core.errors import EdgeflowError
from edgeflow.fix import edited
from tests import needs

RECIPE = """\
# an ONNX file from an old exporter: opset 9, an Erf
name: old_erf
source:
  kind: onnx
  model: old.onnx   # written by the test
  inputs: [{name: x, shape: [1, 4]}]
target_rewrites: false  # the profile's own decompose off: auto must find it
evaluation: {dataset: data.npz, metric: agreement}
target: tflite
verify: {latency_runs: 2, warmup_runs: 1}
"""


@pytest.fixture
def old_erf(tmp_path: Path) -> Path:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Erf", ["r"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 4
    onnx.save(model, str(tmp_path / "old.onnx"))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x=rng.standard_normal((8, 4)).astype(np.float32))
    path = tmp_path / "old_erf.yaml"
    path.write_text(RECIPE, encoding="utf-8")
    return path


def _run(recipe: Path, cache: Path, *args: str) -> int:
    build = recipe.parent / "build"
    return main(["run", f"recipe={recipe}", f"cache_dir={cache}", f"build_dir={build}", *args])


@pytest.mark.slow
@needs.mark("tflite")
def test_auto_applies_what_the_precheck_proves_and_is_cached_like_a_written_rule(
    old_erf: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(old_erf, shared_cache) == 2  # Erf: the precheck refuses it
    err = capsys.readouterr().err
    assert "| Erf | 1 | not supported by tflite |" in err and "+rewrites=[auto]" in err
    assert _run(old_erf, shared_cache, "rewrites=auto") == 0
    out = capsys.readouterr().out
    assert "auto rewrites: {rule: onnx.decompose" in out
    build = old_erf.parent / "build" / "old_erf" / "tflite-none"
    metrics = json.loads((build / "metrics.json").read_text())
    assert metrics["verified"] is True and len(metrics["auto_rewrites"]) == 1
    assert metrics["auto_rewrites"][0].startswith("{rule: onnx.decompose")
    assert metrics["agreement"]["max_abs_diff"] < 1e-5
    report = (build / "report.md").read_text()
    assert "auto rewrites of the ONNX graph (rewrites: auto)" in report
    assert "removed Erf: not supported by tflite" in report
    # the same build again: every stage from the cache, the same choice
    assert _run(old_erf, shared_cache, "rewrites=auto") == 0
    out = capsys.readouterr().out
    assert "precheck       cached" in out and " ran " not in out.split("html")[0]
    # written as a list entry after the recipe's own rules it is the same build
    assert _run(old_erf, shared_cache, "+rewrites=[auto]") == 0
    assert "precheck       cached" in capsys.readouterr().out


@pytest.mark.slow
@needs.mark("tflite")
def test_fix_writes_the_chosen_rules_into_the_recipe_and_builds_it_as_written(
    old_erf: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build = f"build_dir={old_erf.parent / 'build'}"
    code = main(["fix", str(old_erf), f"cache_dir={shared_cache}", build, "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    text = old_erf.read_text()
    lines = text.splitlines()
    at = lines.index("rewrites:")
    assert lines[at - 1] == "# rules chosen by `edgeflow fix` (rewrites: auto)"
    assert lines[at + 1].startswith("  - {rule: onnx.decompose")
    assert (
        lines[at + 2]
        == "target_rewrites: false  # the profile's own decompose off: auto must find it"
    )
    # every other line as it was, comments included
    assert [ln for ln in lines if ln not in lines[at - 1 : at + 2]] == RECIPE.splitlines()
    assert "+rewrites:\n" in out and "fix: as written: edgeflow run" in out
    assert out.rstrip().endswith("verified: every threshold in the recipe holds")
    assert main(["validate", str(old_erf)]) == 0
    # nothing left to choose: the file stays as it is
    assert main(["fix", str(old_erf), f"cache_dir={shared_cache}", build, "--quiet"]) == 0
    assert old_erf.read_text() == text
    assert "no change needed" in capsys.readouterr().out


def test_fix_keeps_every_other_byte_and_places_rules_by_level() -> None:
    text = (
        "source: {kind: onnx}   # mine\n"
        "rewrites:\n"
        "  - fx.fuse_conv_bn   # first\n"
        "  - {rule: onnx.fold_if}   # second\n"
        "  - rule: onnx.fix_shapes\n"
        "  - auto\n"
        "\n"
        "# the data\n"
        "quantization: {mode: int8}   # q\n"
    )
    out = edited(text, ["ast.nonzero_to_mask", "{rule: onnx.convert_opset, opset: 13}"], True)
    assert out == (
        "source: {kind: onnx}   # mine\n"
        "rewrites:\n"
        "  - ast.nonzero_to_mask\n"
        "  - fx.fuse_conv_bn   # first\n"
        "  - {rule: onnx.fold_if}   # second\n"
        "  - rule: onnx.fix_shapes\n"
        "  - {rule: onnx.convert_opset, opset: 13}\n"
        "\n"
        "# the data\n"
        "quantization: {mode: int8, fallback: auto}   # q\n"
    )
    block = "rewrites: auto  # choose\nquantization:\n  mode: int8\ntarget: tflite\n"
    assert edited(block, ["onnx.decompose"], True) == (
        "rewrites:  # choose\n  - onnx.decompose\nquantization:\n  mode: int8\n"
        "  fallback: auto\ntarget: tflite\n"
    )


def test_fix_refuses_a_built_in_recipe_and_a_file_edited_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fix", "digits_cnn"]) == 2
    assert "copy it into your repository" in capsys.readouterr().err
    from edgeflow import fix

    path = tmp_path / "r.yaml"
    path.write_text("rewrites: auto\n")
    path.write_text("rewrites: auto  # edited in an editor meanwhile\n")
    with pytest.raises(EdgeflowError, match="changed while fix ran its builds"):
        fix._write(path, "rewrites: []\n", "rewrites: auto\n")
    assert path.read_text() == "rewrites: auto  # edited in an editor meanwhile\n"
    assert [p.name for p in tmp_path.iterdir()] == ["r.yaml"]  # no temporary file left


GATE = """
import torch


class Gate(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1
"""


@pytest.mark.slow
def test_auto_on_a_pytorch_source_applies_the_rule_explain_names(
    tmp_path: Path, write_recipe, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "gate.py").write_text(GATE)
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "data.npz", x=rng.standard_normal((16, 4)).astype(np.float32))
    recipe = write_recipe(
        """
        source:
          kind: pytorch
          model: gate.py:Gate
          inputs: [{name: x, shape: [1, 4]}]
        evaluation: {dataset: data.npz, metric: agreement}
        target: onnxruntime_micro
        rewrites: auto
        verify: {latency_runs: 2, warmup_runs: 1}
        """
    )
    assert _run(recipe, shared_cache) == 0
    assert "auto rewrites: ast.tensor_if_to_where" in capsys.readouterr().out
    build = tmp_path / "build" / "recipe" / "onnxruntime_micro-none"
    metrics = json.loads((build / "metrics.json").read_text())
    assert metrics["auto_rewrites"] == ["ast.tensor_if_to_where"]
    assert metrics["agreement"]["max_abs_diff"] < 1e-6  # both branches, as torch.where
    assert (
        "auto rewrites of the source (rewrites: auto): `ast.tensor_if_to_where`"
        in (build / "report.md").read_text()
    )


@pytest.mark.slow
@needs.mark("tflite")
def test_fix_over_targets_prints_the_command_for_rules_only_some_need(
    old_erf: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shlex

    build = f"build_dir={old_erf.parent / 'build'}"
    targets = "target=tflite,onnxruntime_micro"  # Erf: onnxruntime runs it, tflite does not
    assert main(["fix", str(old_erf), targets, f"cache_dir={shared_cache}", build, "-q"]) == 0
    out = capsys.readouterr().out
    assert old_erf.read_text() == RECIPE  # no rule every target needs: nothing written
    assert "no change every target needs" in out
    command = out.split("build it with:\n  ")[1].splitlines()[0]
    assert "target=tflite" in command and "+rewrites=[{rule: onnx.decompose" in command
    assert main(shlex.split(command)[1:]) == 0  # works as printed
    assert "verified: every threshold in the recipe holds" in capsys.readouterr().out
