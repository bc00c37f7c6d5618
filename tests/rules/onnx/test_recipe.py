"""onnx.* rules from a recipe: entries load, bad options are located, a build runs them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from edgeflow.core.errors import RecipeError
from edgeflow.recipe import load_recipe
from edgeflow.rules.onnx.decompose import Decompose
from edgeflow.rules.onnx.simplify import Simplify
from tests.rules.onnx.helpers import model, ops, run

RECIPE = """
source:
  kind: onnx
  model: m.onnx
  inputs: [{name: x, shape: [1, 16]}]
evaluation: {dataset: eval.npz}
target: onnxruntime_micro
rewrites:
  - onnx.simplify
  - {rule: onnx.decompose, ops: [Gelu]}
verify: {max_abs_diff: 1.0e-4}
"""


def gelu_mlp() -> onnx.ModelProto:
    """x[1,16] -> MatMul -> Add -> Identity -> Gelu -> MatMul -> y[1,4] at opset 20."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["a"]),
        helper.make_node("Identity", ["a"], ["i"]),
        helper.make_node("Gelu", ["i"], ["g"]),
        helper.make_node("MatMul", ["g", "w2"], ["y"]),
    ]
    weights = {
        "w1": rng.standard_normal((16, 32)).astype(np.float32) / 4,
        "b1": rng.standard_normal(32).astype(np.float32),
        "w2": rng.standard_normal((32, 4)).astype(np.float32) / 4,
    }
    return model(nodes, [("x", T.FLOAT, [1, 16])], [("y", T.FLOAT, [1, 4])], weights, opset=20)


@pytest.fixture
def recipe(tmp_path: Path, write_recipe) -> Path:
    m = gelu_mlp()
    onnx.save(m, str(tmp_path / "m.onnx"))
    x = np.random.default_rng(1).standard_normal((48, 16)).astype(np.float32) * 2
    labels = np.concatenate([run(m, {"x": row[None]})[0] for row in x]).argmax(1)
    np.savez(tmp_path / "eval.npz", x=x, label=labels)
    return write_recipe(RECIPE)


def test_rewrites_load_with_their_options(recipe: Path) -> None:
    rewrites = load_recipe(recipe).recipe.rewrites
    assert [(s.rule, s.options) for s in rewrites] == [
        (Simplify, Simplify.Options()),
        (Decompose, Decompose.Options(ops=["Gelu"])),
    ]


@pytest.mark.parametrize(
    ("entry", "token", "key", "message", "hint"),
    [
        (
            "{rule: onnx.decompose, ops: [Gelo]}",
            "Gelo",
            "rewrites[1].ops[0]",
            "must be one of Gelu, Erf, HardSwish, HardSigmoid, LayerNormalization, Softplus, Mish, "
            "Softsign, Elu, Selu, PRelu, ReduceL2, LpNormalization (got Gelo)",
            "did you mean 'Gelu'?",
        ),
        (
            "{rule: onnx.decompose, opz: [Gelu]}",
            "opz",
            "rewrites[1].opz",
            "unknown key 'opz'",
            "did you mean 'ops'?",
        ),
        (
            "{rule: onnx.optimize, passes: [fuse_bn_into_conw]}",
            "fuse_",
            "rewrites[1].passes[0]",
            "unknown onnxoptimizer pass 'fuse_bn_into_conw'",
            "did you mean 'fuse_bn_into_conv'?",
        ),
        (
            "{rule: onnx.cut, outputs: []}",
            "outputs",
            "rewrites[1].outputs",
            "list should have at least 1 item after validation, not 0 (got a list)",
            None,
        ),
        (
            "onnx.decompos",
            "onnx.decompos",
            "rewrites[1]",
            "unknown rule 'onnx.decompos'",
            "did you mean 'onnx.decompose'?",
        ),
    ],
)
def test_bad_options_are_located(
    recipe: Path, entry: str, token: str, key: str, message: str, hint: str | None
) -> None:
    """Each problem points at the offending token: file:line:col, dotted key, hint."""
    text = recipe.read_text().replace("{rule: onnx.decompose, ops: [Gelu]}", entry)
    recipe.write_text(text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if entry in ln)
    col = text.splitlines()[line - 1].index(token) + 1
    with pytest.raises(RecipeError) as info:
        load_recipe(recipe)
    [problem] = info.value.problems
    assert (problem.file, problem.line, problem.col, problem.key) == (str(recipe), line, col, key)
    assert problem.message == message
    if hint:
        assert problem.hint and problem.hint.startswith(hint)


@pytest.mark.slow
def test_a_build_runs_the_rules_and_verifies(recipe: Path, tmp_path: Path) -> None:
    from edgeflow.engine.cache import Cache
    from edgeflow.engine.runner import run_build

    cache = Cache(tmp_path / "c")
    result = run_build(load_recipe(recipe), cache, tmp_path / "b", print)
    outcomes = {o.stage: o for o in result.outcomes}
    assert list(outcomes)[:4] == ["ingest", "rewrite_onnx", "rewrite_target", "optimize"]
    assert outcomes["rewrite_onnx"].status == "ran"
    assert result.failed_checks == []
    assert result.metrics["verified"] is True
    assert result.metrics["agreement"]["max_abs_diff"] <= 1e-4
    assert result.metrics["accuracy"]["drop"] == 0
    entry = cache.entry("rewrite_onnx", outcomes["rewrite_onnx"].key)
    rules = json.loads((entry / "rewrite_onnx.json").read_text())["rules"]
    assert [(r["rule"], r["changed"]) for r in rules] == [
        ("onnx.simplify", True),
        ("onnx.decompose", True),
    ]
    [site] = rules[1]["sites"]
    assert site["status"] == "changed" and site["where"] and site["message"]
    after = ops(onnx.load(str(entry / "model.onnx")))
    assert "Gelu" not in after and "Identity" not in after and after["Erf"] == 1
