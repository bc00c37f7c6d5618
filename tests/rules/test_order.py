"""Declared rule order (edgeflow/rules/order.py): a rule names the rules it runs before or
after; the recipe loader checks its list, and its onnx rules against the target's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeflow.recipe import load_recipe
from edgeflow.rules import builtin_rules
from edgeflow.rules.base import RuleSpec
from edgeflow.rules.order import after_the_targets, misordered
from edgeflow.targets import load_profile
from tests.conftest import DEMO_RECIPE, DEMO_WEIGHTS, REPO
from tests.rules.test_user_rules import problems

WRAP = "{rule: fx.wrap_leaf, functions: [torch.flatten]}"


@pytest.fixture
def recipe(write_recipe):
    base = DEMO_RECIPE.read_text().replace("../models/digits_cnn.pt", str(DEMO_WEIGHTS))

    def make(rewrites: list[str]) -> Path:
        listed = "".join(f"  - {r}\n" for r in rewrites)
        return write_recipe(base + f"rewrites:\n{listed}", "ordered.yaml")

    return make


def test_wrap_leaf_after_another_fx_rule_is_a_located_error_whose_hint_works(recipe) -> None:
    [problem] = problems(recipe(["fx.remove_dropout", WRAP]))
    assert "ordered.yaml:" in problem and "rewrites[1]: 'fx.wrap_leaf' runs after " in problem
    assert "it decides how the module is traced" in problem
    assert problem.endswith("hint: move 'fx.wrap_leaf' above 'fx.remove_dropout'")
    assert load_recipe(recipe([WRAP, "fx.remove_dropout"]))  # as the hint says


def test_a_recipes_rule_that_a_target_default_must_precede_runs_again_after_it() -> None:
    """armnn feeds token ids as float (onnx.ids_as_float), whose one-hot MatMul
    onnx.lower_matmul lowers; the target's defaults run after the recipe's rules, so a recipe
    that lists lower_matmul itself (as the precheck suggests it for a MatMul) has it run
    again after ids_as_float, with its own options, and nowhere else."""
    theirs = load_profile("armnn").rewrite_specs()
    lower = next(s for s in theirs if s.name == "onnx.lower_matmul")
    mine = RuleSpec(lower.rule, lower.rule.Options(), "onnx.lower_matmul")
    run = [s.name for s in after_the_targets([mine], theirs)]
    assert run.index("onnx.lower_matmul") == run.index("onnx.ids_as_float") + 1
    assert run.count("onnx.lower_matmul") == 1
    assert next(s for s in after_the_targets([mine], theirs) if s.name == lower.name) is mine
    fold = next(s for s in theirs if s.name == "onnx.fold_constants")  # nothing precedes it
    assert [s.name for s in after_the_targets([fold], theirs)] == [
        s.name for s in theirs if s.name != "onnx.fold_constants"
    ]


@pytest.mark.parametrize("target", sorted(p.stem for p in (REPO / "targets").glob("*.yaml")))
def test_every_targets_defaults_keep_the_declared_order(target: str) -> None:
    profile = load_profile(target)
    rules = [builtin_rules()[e["rule"]] for e in profile.rewrites or []]
    names = [r.name for r in rules]
    assert [m.message(names) for m in misordered(rules)] == []


def test_declared_names_are_rules() -> None:
    known = builtin_rules()
    levels = {name.split(".")[0] for name in known}
    for rule in known.values():
        for name in (*rule.runs_before, *rule.runs_after):
            assert name in known or (name.endswith(".*") and name[:-2] in levels), name
