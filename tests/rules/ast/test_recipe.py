"""ast.* rules through the recipe: names and options resolve at load; bad options are located."""

from __future__ import annotations

import pytest
import torch

from edgeflow.core.errors import RecipeError
from edgeflow.recipe import load_recipe
from edgeflow.rules.ast.calls import ReplaceCall
from edgeflow.rules.ast.float64 import Float64ToFloat32
from edgeflow.source import example_inputs
from edgeflow.stages.rewrite import rewritten_module

RECIPE = """
name: ast_rules
source:
  kind: pytorch
  model: tests.rules.ast.test_float64:DoubleConv
  inputs:
    - {name: image, shape: [1, 1, 8, 8]}
evaluation: {dataset: "edgeflow.datasets:sklearn_digits", split: test}
target: onnxruntime_micro
rewrites:
"""


def test_rules_and_options_resolve_and_apply(write_recipe) -> None:
    path = write_recipe(
        RECIPE
        + "  - ast.float64_to_float32\n"
        + "  - {rule: ast.replace_call, from: torch.nonzero, to: 'torch:argwhere'}\n"
    )
    recipe = load_recipe(path).recipe
    first, second = recipe.rewrites
    assert first.rule is Float64ToFloat32 and first.options == Float64ToFloat32.Options()
    assert second.rule is ReplaceCall and second.options.from_ == "torch.nonzero"
    torch.manual_seed(0)
    module, records, sources = rewritten_module(recipe, path.parent)
    assert [r["rule"] for r in records] == ["ast.float64_to_float32", "ast.replace_call"]
    assert records[0]["changed"] and not records[1]["changed"]
    assert records[1]["options"] == {"from": "torch.nonzero", "to": "torch:argwhere"}
    assert set(sources) == {
        "ast.float64_to_float32.DoubleConv.forward",
        "ast.float64_to_float32.DoubleConv.finish",
    }
    assert module(*example_inputs(recipe.source.inputs)).dtype == torch.float32


def test_misspelt_option_is_located_with_a_suggestion(write_recipe) -> None:
    path = write_recipe(RECIPE + "  - {rule: ast.replace_call, form: torch.nonzero, to: a.b}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    missing, unknown = [p.render() for p in info.value.problems]
    assert missing.startswith(f"{path}:10:5: rewrites[0].from: missing required key")
    assert unknown.startswith(f"{path}:10:30: rewrites[0].form: unknown key 'form'")
    # The loader suggests field names; the option's field is `from_` (alias `from`).
    assert "hint: did you mean 'from" in unknown


def test_bad_option_value_is_located(write_recipe) -> None:
    path = write_recipe(RECIPE + "  - {rule: ast.float64_to_float32, parameters: maybe}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    [problem] = [p.render() for p in info.value.problems]
    assert problem.startswith(f"{path}:10:48: rewrites[0].parameters: must be a valid boolean")
    assert problem.endswith("(got maybe)")


def test_every_ast_rule_loads_by_name_with_its_options(write_recipe) -> None:
    path = write_recipe(
        RECIPE
        + "  - {rule: ast.nonzero_to_mask, max_size: 16, fill_index: 0}\n"
        + "  - {rule: ast.specialize_shapes, dynamic_batch: true}\n"
        + "  - ast.tensor_if_to_where\n"
        + "  - {rule: ast.unroll_loops, max_iterations: 8}\n"
        + "  - ast.static_item\n"
    )
    specs = load_recipe(path).recipe.rewrites
    assert [s.name for s in specs] == [
        "ast.nonzero_to_mask",
        "ast.specialize_shapes",
        "ast.tensor_if_to_where",
        "ast.unroll_loops",
        "ast.static_item",
    ]
    assert specs[0].options.max_size == 16 and specs[0].options.fill_index == 0
    assert specs[1].options.dynamic_batch and specs[3].options.max_iterations == 8


def test_out_of_range_option_is_located(write_recipe) -> None:
    path = write_recipe(RECIPE + "  - {rule: ast.nonzero_to_mask, max_size: 0}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    [problem] = [p.render() for p in info.value.problems]
    assert problem.startswith(f"{path}:10:43: rewrites[0].max_size: must be greater than 0 (got 0)")
