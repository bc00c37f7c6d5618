"""User rules by import path: validated like built-ins, applied by the rewrite stage, reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeflow.core.errors import RecipeError, StageFailed
from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.recipe import load_recipe
from tests.conftest import DEMO_RECIPE, DEMO_WEIGHTS

RULES = '''
import copy

from edgeflow.rules.base import AstRule, OnnxRule, RuleOptions, RuleResult


class Scale(AstRule):
    """Multiply the model's output by a factor (a test rule)."""

    name = "user.scale"
    description = "Multiply the output by a factor."

    class Options(RuleOptions):
        factor: float = 1.0

    def apply(self, model, opts, ctx):
        import torch

        class Scaled(torch.nn.Module):
            def __init__(self, inner, factor):
                super().__init__()
                self.inner, self.factor = inner, factor

            def forward(self, x):
                return self.inner(x) * self.factor

        return RuleResult(Scaled(copy.deepcopy(model), opts.factor), True, 1, ["wrapped"])


class Noop(OnnxRule):
    name = "user.noop"
    description = "Change nothing."

    def apply(self, model, opts, ctx):
        return RuleResult(model, False, 0, ["nothing to do"])


NotARule = 3
'''


@pytest.fixture
def recipe(tmp_path: Path, write_recipe):
    (tmp_path / "rules.py").write_text(RULES)
    base = DEMO_RECIPE.read_text().replace("../models/digits_cnn.pt", str(DEMO_WEIGHTS))
    base = base.replace("exporter: dynamo", "exporter: torchscript").replace(
        "opset: 18", "opset: 17"
    )

    def make(rewrites: str) -> Path:
        return write_recipe(base + f"rewrites:\n{rewrites}", "ruled.yaml")

    return make


def problems(path: Path) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    return [p.render() for p in info.value.problems]


def test_user_rules_run_and_are_reported(recipe, tmp_path: Path) -> None:
    path = recipe("  - {rule: rules.py:Scale, factor: 1.0}\n  - rules.py:Noop\n")
    result = run_build(
        load_recipe(path, {"quantization.mode": "none"}),
        Cache(tmp_path / "c"),
        tmp_path / "b",
        print,
    )
    assert result.metrics["agreement"]["max_abs_diff"] <= 1e-4
    report = (result.build_dir / "report.md").read_text()
    # a rule written before sites: its reasons= texts become sites of the whole model
    assert "`user.scale`: changed, 1 matches\n    - changed: wrapped\n" in report
    assert "`user.noop`: no change, 0 matches\n    - nothing to do: nothing to do\n" in report
    entries = list((tmp_path / "c" / "rewrite").glob("*/*/rewrite.json"))
    [record] = json.loads(entries[0].read_text())["rules"]
    assert record["rule"] == "user.scale" and record["options"] == {"factor": 1.0}
    assert record["sites"] == [{"status": "changed", "where": "", "message": "wrapped"}]


def test_a_rule_that_changes_the_result_fails_the_rewrite_stage(recipe, tmp_path: Path) -> None:
    path = recipe("  - {rule: rules.py:Scale, factor: 2.0}\n")
    with pytest.raises(StageFailed) as info:
        run_build(load_recipe(path), Cache(tmp_path / "c"), tmp_path / "b", print)
    assert info.value.stage == "rewrite" and info.value.exit_code == 2  # the user's rule
    assert "rules.py:Scale broke its contract: output 0 changes by" in info.value.message
    assert "(the first rule to run)" in info.value.message
    assert not list((tmp_path / "c").glob("rewrite/*/*"))


def test_bad_rule_options_are_located(recipe) -> None:
    path = recipe("  - {rule: rules.py:Scale, factr: 2}\n")
    [problem] = problems(path)
    line = path.read_text().splitlines().index("  - {rule: rules.py:Scale, factr: 2}") + 1
    assert f"{path}:{line}:28: rewrites[0].factr: unknown key 'factr'" in problem
    assert "did you mean 'factor'?" in problem


def test_not_a_rule_and_unknown_rules(recipe) -> None:
    path = recipe("  - rules.py:NotARule\n  - rules.py:Missing\n  - nope.rule\n")
    found = problems(path)
    assert "rewrites[0]: 'rules.py:NotARule' is not a Rule subclass" in found[0]
    assert "rewrites[1]: cannot load rule 'rules.py:Missing'" in found[1]
    assert "rewrites[2]: unknown rule 'nope.rule'" in found[2]


def test_rules_must_run_in_level_order(recipe) -> None:
    path = recipe("  - rules.py:Noop\n  - rules.py:Scale\n")
    [problem] = problems(path)
    assert "ast rule 'user.scale' after onnx rule 'user.noop'" in problem
