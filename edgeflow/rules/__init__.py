"""Rewrite rules: the registry behind the recipe's `rewrites:` list.

An entry is a rule name or a mapping `{rule: name, <option>: value, ...}`; a name is a built-in
rule (`ast.*`, `fx.*`, `onnx.*`, see `edgeflow rules`) or a user rule given by import path
(`mypkg.rules:MyRule`, `rules.py:MyRule`). Entries are resolved and their options validated
when the recipe loads; rules run in level order (ast, then fx, then onnx).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeflow.core.errors import Problem, RecipeError
from edgeflow.core.suggest import did_you_mean
from edgeflow.rules.fixes import Fix

# A `rewrites:` value or last entry that is not a rule: apply the rules the precheck proves
# remove its findings (edgeflow.targets.auto_rewrites), after the recipe's own.
AUTO = "auto"


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


def rules_fixing(fix: Fix) -> list[type[Any]]:
    """The built-in rules that declare `fix` (see edgeflow.rules.fixes), in catalogue order."""
    return [rule for rule in builtin_rules().values() if fix in rule.fixes]


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
    entries: list[Any], tree: Any, path: Path, located: dict[str, Any], user_code: bool = True
) -> tuple[list[Any], list[str]]:
    """RuleSpecs for a recipe's `rewrites:` entries, and the user rules checked from their
    source only (`user_code=False`: nothing of the user's is imported). Every malformed
    entry, unknown rule, bad option and misordered level is a located problem, all at once;
    entries from the command line are located there (`located`, from apply_overrides)."""
    from edgeflow.core.loader import plain, validate
    from edgeflow.rules.base import LEVEL_ORDER, Rule, RuleSpec
    from edgeflow.rules.entries import required, template
    from edgeflow.rules.order import misordered

    known = builtin_rules() if entries else {}  # importing every rule takes a tenth of a second
    base_dir = path.parent
    specs: list[RuleSpec] = []
    unchecked: list[str] = []
    problems: list[Problem] = []
    last: tuple[str, str] | None = None  # (level, name) of the previous rule
    placed: list[tuple[int, type[Any]]] = []  # (entry index, rule) of each resolved entry
    for i, raw in enumerate(entries):
        if raw == AUTO:  # not a rule: the recipe's loader records it (rewrites_auto)
            continue
        key = f"rewrites[{i}]"

        def problem(message: str, hint: str | None, key: str = key, i: int = i) -> None:
            problems.append(locate_item(tree, path, located, key, i, message, hint))

        try:
            entry = validate_entry(plain(raw))
        except RuleEntryError as exc:
            problem(str(exc), exc.hint)
            continue
        name = entry["rule"]
        rule, level, source = known.get(name), None, name
        if rule is None and ":" in name:
            if not user_code:
                level, message = _user_rule_from_source(name, base_dir)
                if message:
                    problem(message, "a user rule subclasses AstRule, FxRule or OnnxRule")
                    continue
                unchecked.append(name)
                if level is None:  # its level is not visible in its source: order unknown
                    continue
            else:
                rule, message, source = _user_rule(name, base_dir, Rule)
                if message:
                    problem(message, "a user rule subclasses AstRule, FxRule or OnnxRule")
                    continue
        if rule is None and not (":" in name and not user_code):
            hint = did_you_mean(name, known) if known else "no built-in rules are registered"
            problem(f"unknown rule '{name}'", hint)
            continue
        if rule is not None:
            options = {k: v for k, v in entry.items() if k != "rule"}
            needed = required(rule)
            if needed and not isinstance(raw, dict):  # a bare name cannot give them
                problem(
                    f"rule '{name}' needs {', '.join(needed)}",
                    f"write the entry as {template(rule)} (docs/rules.md)",
                )
                continue
            at = ("rewrites", i) if isinstance(raw, dict) else ()
            try:
                opts = validate(rule.Options, tree, path, at=at, data=options, overridden=located)
            except RecipeError as exc:
                problems.extend(exc.problems)
                continue
            code = _code_problems(opts, base_dir)
            for option, message, hint in code:
                problem(message, hint, key=f"{key}.{option}")
            if code:
                continue
            level, name = rule.level, rule.name
            specs.append(RuleSpec(rule, opts, source, base_dir))
            placed.append((i, rule))
        assert level is not None
        if last is not None and LEVEL_ORDER[level] < LEVEL_ORDER[last[0]]:
            problem(
                f"{level} rule '{name}' after {last[0]} rule '{last[1]}': rules run in level "
                "order ast, fx, onnx",
                "move it above the other level's rules",
            )
        last = (level, name)
    names = [rule.name for _, rule in placed]
    for wrong in misordered([rule for _, rule in placed]):
        i = placed[wrong.late][0]
        other = names[wrong.early]
        problems.append(
            locate_item(
                tree, path, located, f"rewrites[{i}]", i, wrong.message(names),
                f"move '{names[wrong.late]}' above '{other}'",
            )
        )  # fmt: skip
    if problems:
        raise RecipeError(problems)
    return specs, unchecked


def locate_item(
    tree: Any,
    path: Path,
    located: dict[str, Any],
    key: str,
    index: int,
    message: str,
    hint: str | None,
) -> Problem:
    """A problem at rewrites[index]: its place in the file, or the command line."""
    from edgeflow.core.loader import display_path, locate, positions

    if any(key == k or key.startswith(k + "[") or k == "rewrites" for k in located):
        return locate(tree, path, located, key, message, hint)
    position = positions(tree["rewrites"]).get(index)
    if position is None:
        return locate(tree, path, located, "rewrites", message, hint)
    return Problem(display_path(path), position[0] + 1, position[1] + 1, key, message, hint)


def _user_rule(ref_text: str, base_dir: Path, base: type) -> tuple[Any, str, str]:
    """(rule class, error message, absolute reference a worker process can import again)."""
    from edgeflow.core.errors import EdgeflowError
    from edgeflow.core.refs import ImportRef

    _, message = _user_rule_from_source(ref_text, base_dir)  # nothing imported before this
    if message:
        return None, message, ref_text
    try:
        ref = ImportRef.parse(ref_text, base_dir)
        rule = ref.load()
    except (ValueError, EdgeflowError) as exc:
        return None, f"cannot load rule '{ref_text}': {exc}", ref_text
    if not (isinstance(rule, type) and issubclass(rule, base) and hasattr(rule, "level")):
        return None, f"'{ref_text}' is not a Rule subclass", ref_text
    return rule, "", str(ref)


def _code_problems(options: Any, base_dir: Path) -> list[tuple[str, str, str]]:
    """(option key, message, hint) for each function an entry's options name that is not
    code of the user's or of an installed package (checked from source: nothing imported)."""
    from edgeflow.core.refs import ImportRef
    from edgeflow.rules.base import code_options

    found = []
    for key, text in code_options(options).items():
        try:
            ImportRef.parse(text, base_dir).check()
        except ValueError as exc:
            hint = getattr(exc, "hint", None) or "name a function: 'pkg.module:fn' or 'file.py:fn'"
            found.append((key, str(exc), hint))
    return found


# A user rule's level, from the base class its source leads to (edgeflow validate runs no code).
_BASES = {
    "edgeflow.rules.base.AstRule": "ast",
    "edgeflow.rules.base.FxRule": "fx",
    "edgeflow.rules.base.OnnxRule": "onnx",
    "edgeflow.rules.base.Rule": None,
}


def _user_rule_from_source(ref_text: str, base_dir: Path) -> tuple[str | None, str]:
    """(level if its source shows it, error message) for a user rule, without importing it:
    the module must define a class of that name whose bases lead to edgeflow's Rule (a base
    its source cannot follow is checked with issubclass when the rule is loaded to run)."""
    from edgeflow.core.refcheck import subclass_of
    from edgeflow.core.refs import ImportRef

    try:
        ref = ImportRef.parse(ref_text, base_dir)
        found = ref.check(code_only=False)
    except ValueError as exc:
        return None, f"cannot load rule '{ref_text}': {exc}"
    if found.kind not in ("class", "unknown", "value"):
        what = "a constant" if found.kind == "data" else f"a {found.kind}"
        return None, f"'{ref_text}' is not a Rule subclass (it is {what})"
    verdict = subclass_of(found, frozenset(_BASES))
    if verdict is False:
        return None, f"'{ref_text}' is not a Rule subclass ({found.name})"
    return (_BASES[verdict] if isinstance(verdict, str) else None), ""
