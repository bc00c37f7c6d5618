"""Rewrite rules: the registry behind the recipe's `rewrites:` list.

An entry is a rule name or a mapping `{rule: name, <option>: value, ...}`; a name is a built-in
rule (`ast.*`, `fx.*`, `onnx.*`, see `edgeflow rules`) or a user rule given by import path
(`mypkg.rules:MyRule`, `rules.py:MyRule`). Entries are resolved and their options validated
when the recipe loads; rules run in level order (ast, then fx, then onnx).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeflow.errors import Problem, RecipeError
from edgeflow.recipe.suggest import did_you_mean


class RuleEntryError(ValueError):
    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def builtin_rules() -> dict[str, type[Any]]:
    """Every built-in rule by name, in catalogue order (ast, fx, onnx)."""
    from edgeflow.rules.ast import RULES as AST_RULES
    from edgeflow.rules.fx import RULES as FX_RULES
    from edgeflow.rules.onnx import RULES as ONNX_RULES

    return {rule.name: rule for rule in (*AST_RULES, *FX_RULES, *ONNX_RULES)}


def validate_entry(entry: Any) -> dict[str, Any]:
    """Check an entry's shape and normalise it to {'rule': name, **options}."""
    if isinstance(entry, str):
        entry = {"rule": entry}
    if not isinstance(entry, dict) or not isinstance(entry.get("rule"), str):
        raise RuleEntryError(
            "a rewrite is a rule name or a mapping with a 'rule' key",
            "write '- fx.fuse_conv_bn' or '- {rule: fx.replace_activation, from: relu, to: relu6}'",
        )
    return dict(entry)


def resolve_rewrites(
    entries: list[dict[str, Any]], tree: Any, path: Path, base_dir: Path
) -> list[Any]:
    """RuleSpecs for validated entries; every unknown rule or bad option is a located problem."""
    from edgeflow.recipe.loader import display_path, validate
    from edgeflow.rules.base import LEVEL_ORDER, Rule, RuleSpec

    known = builtin_rules()
    specs: list[RuleSpec] = []
    problems: list[Problem] = []
    for i, entry in enumerate(entries):
        name = entry["rule"]
        node = tree["rewrites"][i]
        line, col = tree["rewrites"].lc.item(i)
        where = (display_path(path), line + 1, col + 1, f"rewrites[{i}]")
        rule, source = known.get(name), name
        if rule is None and ":" in name:
            rule, message, source = _user_rule(name, base_dir, Rule)
            if message:
                problems.append(
                    Problem(*where, message, "a user rule subclasses AstRule, FxRule or OnnxRule")
                )
                continue
        if rule is None:
            hint = did_you_mean(name, known) if known else "no built-in rules are registered"
            problems.append(Problem(*where, f"unknown rule '{name}'", hint))
            continue
        options = {k: v for k, v in entry.items() if k != "rule"}
        at = ("rewrites", i) if isinstance(node, dict) else ()
        try:
            opts = validate(rule.Options, tree, path, at=at, data=options)
        except RecipeError as exc:
            problems.extend(exc.problems)
            continue
        if specs and LEVEL_ORDER[rule.level] < LEVEL_ORDER[specs[-1].rule.level]:
            problems.append(
                Problem(
                    *where,
                    f"{rule.level} rule '{rule.name}' after {specs[-1].rule.level} rule "
                    f"'{specs[-1].name}': rules run in level order ast, fx, onnx",
                    "move it above the other level's rules",
                )
            )
        specs.append(RuleSpec(rule, opts, source))
    if problems:
        raise RecipeError(problems)
    return specs


def _user_rule(ref_text: str, base_dir: Path, base: type) -> tuple[Any, str, str]:
    """(rule class, error message, absolute reference a worker process can import again)."""
    from edgeflow.errors import EdgeflowError
    from edgeflow.recipe.refs import ImportRef

    try:
        ref = ImportRef.parse(ref_text, base_dir)
        ref.check()
        rule = ref.load()
    except (ValueError, EdgeflowError) as exc:
        return None, f"cannot load rule '{ref_text}': {exc}", ref_text
    if not (isinstance(rule, type) and issubclass(rule, base) and hasattr(rule, "level")):
        return None, f"'{ref_text}' is not a Rule subclass", ref_text
    return rule, "", str(ref)
