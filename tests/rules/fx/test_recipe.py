"""fx rules from a recipe's `rewrites:` list: loaded, validated with located errors, applied."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import fx

from edgeflow.core.errors import RecipeError
from edgeflow.core.refs import ImportRef
from edgeflow.recipe import load_recipe
from edgeflow.source import build_module
from edgeflow.stages._rewritten import rewritten_module
from tests.rules.fx.helpers import ops

MODEL = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.act = nn.SiLU()
        self.drop = nn.Dropout(0.2)
        self.fc = nn.Linear(4, 3)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, image):
        h = self.drop(self.act(self.bn(self.conv(image))))
        return self.fc(h.mean((2, 3)))
"""

HEAD = """
name: fx_rules
source:
  kind: pytorch
  model: model.py:Net
  weights: net.pt
  inputs:
    - {name: image, shape: [2, 1, 8, 8]}
evaluation: {dataset: data.npz}
target: onnxruntime_micro
rewrites:
"""


@pytest.fixture
def recipe_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "model.py").write_text(MODEL)
    net = ImportRef.parse("model.py:Net", tmp_path).load()()
    torch.save(net.state_dict(), tmp_path / "net.pt")
    image = np.random.default_rng(0).random((4, 1, 8, 8), dtype=np.float32)
    np.savez(tmp_path / "data.npz", image=image, label=np.zeros(4, dtype=np.int64))
    monkeypatch.chdir(tmp_path)  # file paths in rule options resolve from here
    return tmp_path


def write(recipe_dir: Path, rewrites: str) -> Path:
    path = recipe_dir / "recipe.yaml"
    path.write_text(textwrap.dedent(HEAD).lstrip() + textwrap.dedent(rewrites).lstrip("\n"))
    return path


def test_rules_load_and_apply_in_order(recipe_dir: Path) -> None:
    path = write(
        recipe_dir,
        """
        - fx.fuse_conv_bn
        - {rule: fx.replace_activation, from: silu, to: x_sigmoid}
        - fx.remove_dropout
        """,
    )
    recipe = load_recipe(path).recipe
    assert [spec.name for spec in recipe.rewrites] == [
        "fx.fuse_conv_bn",
        "fx.replace_activation",
        "fx.remove_dropout",
    ]
    assert recipe.rewrites[1].options.model_dump(mode="json") == {
        "from_": "silu",
        "to": "x_sigmoid",
    }
    module, records, sources = rewritten_module(recipe, path.parent)
    assert isinstance(module, fx.GraphModule)
    assert [(r["rule"], r["changed"], r["matches"]) for r in records] == [
        ("fx.fuse_conv_bn", True, 1),
        ("fx.replace_activation", True, 1),
        ("fx.remove_dropout", True, 1),
    ]
    assert records[1]["graph"]["kind"] == "GraphModule"  # the previous rule's graph
    assert set(sources) == {f"{r['rule']}.graph" for r in records}
    assert ops(module) == {"Conv2d": 1, "sigmoid": 1, "mul": 1, ".mean": 1, "Linear": 1}
    image = torch.rand(2, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(module(image), build_module(recipe.source)(image))


def at(path: Path, fragment: str) -> str:
    """`recipe.yaml:line:col` of the first occurrence of fragment (paths shown from the cwd)."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if fragment in line:
            return f"{path.name}:{number}:{line.index(fragment) + 1}"
    raise AssertionError(fragment)


def problems(path: Path) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    return [p.render() for p in info.value.problems]


def test_unsupported_activation_pair_is_located(recipe_dir: Path) -> None:
    path = write(recipe_dir, "  - {rule: fx.replace_activation, from: silu, to: tanh}\n")
    [problem] = problems(path)
    assert problem.startswith(
        f"{at(path, 'tanh')}: rewrites[0].to: cannot replace silu with 'tanh'"
    )
    assert "(supported: silu -> x_sigmoid, gelu -> gelu_tanh, relu -> relu6," in problem
    assert problem.endswith("hint: write to: x_sigmoid")


def test_unknown_activation_is_located(recipe_dir: Path) -> None:
    path = write(recipe_dir, "  - {rule: fx.replace_activation, from: swish, to: x_sigmoid}\n")
    [problem] = problems(path)
    choices = "silu, gelu, relu, hardswish, hardsigmoid"
    assert problem.startswith(f"{at(path, 'swish')}: rewrites[0].from: must be one of {choices}")


def test_bad_options_of_other_rules_are_located(recipe_dir: Path) -> None:
    path = write(
        recipe_dir,
        """
        - {rule: fx.remove_batchnorm, fold: true, atoll: 0.1}
        - {rule: fx.replace_pattern, pattern: patterns.py, replacement: "p.py:r"}
        - {rule: fx.wrap_leaf, functions: []}
        """,
    )
    found = problems(path)
    assert len(found) == 3
    assert found[0].startswith(f"{at(path, 'atoll')}: rewrites[0].atoll: unknown key 'atoll'")
    assert "did you mean 'atol'?" in found[0]
    assert found[1].startswith(
        f"{at(path, 'patterns.py')}: rewrites[1].pattern: expected 'package.module:"
    )
    assert found[2].startswith(
        f"{at(path, 'functions')}: rewrites[2].functions: list should have at least 1"
    )
