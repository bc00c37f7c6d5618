"""`edgeflow explain` names the user's line, the cause in plain words and the rules that help."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgeflow.cli import main

MODEL = """
import torch


class Gate(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


class Count(torch.nn.Module):
    def forward(self, x):
        n = torch.nonzero(x > 0).shape[0]
        return x * n


class Constant(torch.nn.Module):
    def forward(self, x):
        return x * torch.tensor(0.5)  # a TracerWarning, but nothing data-dependent


class ShapeChecked(torch.nn.Module):
    def forward(self, x):
        if x.dim() != 2 or x.shape[-1] != 4:  # decided by shapes: fine for static shapes
            raise ValueError("x must be [N, 4]")
        return x * 2


class Positive(torch.nn.Module):
    def forward(self, x):
        return x[x > 0].sum(0, keepdim=True)
"""


@pytest.fixture
def recipe_for(tmp_path: Path, write_recipe):
    (tmp_path / "model.py").write_text(MODEL)
    np.savez(tmp_path / "eval.npz", x=np.ones((4, 4), np.float32), label=np.zeros(4))

    def make(cls: str, rewrites: str = "") -> Path:
        return write_recipe(
            f"""
            source:
              kind: pytorch
              model: model.py:{cls}
              inputs: [{{name: x, shape: [1, 4]}}]
            evaluation: {{dataset: eval.npz}}
            target: onnxruntime_micro
            {rewrites}
            """,
            f"{cls.lower()}.yaml",
        )

    return make


def test_data_dependent_branch_is_located_and_explained(recipe_for, tmp_path, capsys) -> None:
    assert main(["explain", str(recipe_for("Gate")), "--json"]) == 1
    attempts = {a["method"]: a for a in json.loads(capsys.readouterr().out)}
    fx = attempts["torch.fx.symbolic_trace"]
    assert fx["ok"] is False
    assert fx["location"] == f"{tmp_path / 'model.py'}:7"
    assert fx["code"] == "if x.sum() > 0:"
    assert fx["cause"].startswith("data-dependent control flow")
    assert "ast.tensor_if_to_where" in fx["rules"]
    strict = attempts["torch.export (strict)"]
    assert strict["ok"] is False and "ast.tensor_if_to_where" in strict["rules"]


def test_nonzero_size_is_explained(recipe_for, tmp_path, capsys) -> None:
    assert main(["explain", str(recipe_for("Count"))]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    assert "nonzero / boolean-mask indexing" in out
    assert f"{tmp_path / 'model.py'}:14: n = torch.nonzero(x > 0).shape[0]" in out
    assert "ast.nonzero_to_mask" in out


def test_clean_model_explains_nothing(capsys) -> None:
    assert main(["explain", "digits_cnn"]) == 0
    assert "FAILED" not in capsys.readouterr().out


def test_torchscript_traces_are_judged_by_what_they_bake_in(recipe_for, capsys) -> None:
    assert main(["explain", str(recipe_for("Gate")), "--json"]) == 1
    attempts = {a["method"]: a for a in json.loads(capsys.readouterr().out)}
    baked = attempts["torch.onnx.export (torchscript)"]
    assert baked["ok"] is False and "baked in as a constant" in baked["cause"]
    assert "Converting a tensor to a Python boolean" in baked["error"]
    assert baked["rules"] == ["ast.tensor_if_to_where", "ast.static_item"]
    assert main(["explain", str(recipe_for("Constant"))]) == 0  # torch.tensor(0.5) is fine
    capsys.readouterr()


def test_graph_hazards_of_both_onnx_exporters_are_counted(recipe_for, capsys) -> None:
    assert main(["explain", str(recipe_for("Positive")), "--json"]) == 1
    rows = [a for a in json.loads(capsys.readouterr().out) if a["method"].endswith(": graph")]
    script = [r for r in rows if r["method"] == "torch.onnx.export (torchscript): graph"]
    assert script and script[0]["error"] == "the exported graph contains 1 NonZero"
    assert "ast.nonzero_to_mask" in script[0]["rules"]


def test_no_rewrites_shows_what_the_rewrites_fix(recipe_for, capsys) -> None:
    recipe = recipe_for("Gate", "rewrites: [ast.tensor_if_to_where]")
    assert main(["explain", str(recipe)]) == 0
    assert "FAILED" not in capsys.readouterr().out
    assert main(["explain", str(recipe), "--no-rewrites"]) == 1
    assert "data-dependent control flow" in capsys.readouterr().out


def test_shape_checks_are_not_baked_branches_for_static_shapes(recipe_for, capsys) -> None:
    main(["explain", str(recipe_for("ShapeChecked")), "--json"])
    attempts = {a["method"]: a for a in json.loads(capsys.readouterr().out)}
    assert attempts["torch.onnx.export (torchscript)"]["ok"] is True  # traced: shapes static
    assert attempts["torch.fx.symbolic_trace"]["rules"] == ["ast.specialize_shapes"]
