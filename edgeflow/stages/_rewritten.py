"""The PyTorch module with the recipe's ast.* and fx.* rules applied: what the rewrite stage
checks and the export stage exports (each in the build's worker, from the same rules)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeflow.rules.base import LEVEL_ORDER, RuleSpec

if TYPE_CHECKING:
    from edgeflow.recipe.schema import Recipe


def rewritten_module(
    recipe: Recipe, base_dir: Path, check: bool = False, auto: tuple[RuleSpec, ...] = ()
) -> tuple[Any, list[dict[str, Any]], dict[str, str]]:
    """The recipe's PyTorch module with its ast.* and fx.* rules applied, and those
    `rewrites: auto` chose, each in its level's place (`check`: enforce each rule's
    contract, as the rewrite stage does; the export stage re-applies the same deterministic
    rules without checking them again)."""
    from edgeflow.rules.apply import apply_rules
    from edgeflow.rules.base import RewriteContext
    from edgeflow.schema.source import PyTorchSource
    from edgeflow.source import build_module

    assert isinstance(recipe.source, PyTorchSource)  # the pipeline of pytorch sources
    module = build_module(recipe.source)
    dynamic = recipe.source.dynamic_batch is not None
    # a detector's rules may change its output form: the stage compares detections as sets
    numerics = check and recipe.evaluation.metric != "detections"
    ctx = RewriteContext(list(recipe.source.inputs), base_dir, dynamic, numerics)
    specs = sorted([*recipe.rewrites, *auto], key=lambda s: LEVEL_ORDER[s.rule.level])
    return apply_rules(module, specs, ("ast", "fx"), ctx, check)


def specs_of(chosen: list[dict[str, Any]]) -> tuple[RuleSpec, ...]:
    """The RuleSpecs of `rewrites: auto`'s choice, as rewrite.json records it."""
    from edgeflow.rules import builtin_rules

    known = builtin_rules()
    return tuple(
        RuleSpec(known[c["rule"]], known[c["rule"]].Options.model_validate(c["options"]), c["rule"])
        for c in chosen
    )
