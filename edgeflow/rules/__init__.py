"""Rewrite rules: the registry behind the recipe's `rewrites:` list.

Each entry is a rule name or a mapping `{rule: name, <option>: value, ...}`. Rules arrive with
the rule system (ast.*, fx.*, onnx.* families); until a rule is registered here, naming it in
a recipe is an error at load time rather than something silently skipped.
"""

from __future__ import annotations

from typing import Any

from edgeflow.recipe.suggest import did_you_mean

REGISTRY: dict[str, Any] = {}


class RuleEntryError(ValueError):
    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def validate_entry(entry: Any) -> dict[str, Any]:
    """Normalise a `rewrites:` entry to {'rule': name, **options} or raise RuleEntryError."""
    if isinstance(entry, str):
        entry = {"rule": entry}
    if not isinstance(entry, dict) or not isinstance(entry.get("rule"), str):
        raise RuleEntryError(
            "a rewrite is a rule name or a mapping with a 'rule' key",
            "write '- fx.fuse_conv_bn' or '- {rule: fx.replace_activation, from: relu, to: relu6}'",
        )
    name = entry["rule"]
    if name not in REGISTRY:
        hint = did_you_mean(name, sorted(REGISTRY)) if REGISTRY else None
        raise RuleEntryError(
            f"unknown rule '{name}'",
            hint or "no rewrite rules are available in this version of edgeflow; remove the entry",
        )
    return dict(entry)
