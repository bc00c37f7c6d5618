"""`rewrites: auto`: the onnx.* rules the precheck proves useful, applied before its verdict.

The precheck already knows, for each finding, the rules that declare they remove it
(edgeflow.rules.fixes). The search applies them for the user: each round, every candidate
rule (with the options its finding gives, else the target's default rules' options) is
applied to a copy of the model and the precheck is run again; of those that remove at least
one error and add none, the one that removes the most is applied for real (its contract
checked, as for a rule the recipe lists) and the next round starts from its result. It stops
when the precheck passes or no candidate helps. Each round's choice depends only on the
model, the profile and the quantization mode, so the stage that runs it is cached and
reproduced like any other: the chosen rules are in rewrite_auto.json and the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgeflow.rules import rules_fixing
from edgeflow.rules.base import RuleSpec
from edgeflow.rules.entries import options_for
from edgeflow.targets.precheck import Finding, _applied, _check, entry
from edgeflow.targets.profile import TargetProfile

MAX_ROUNDS = 32  # each round removes at least one error: a model has far fewer kinds


@dataclass
class Step:
    """One rule the search applied: what it removed, and how many errors were left."""

    rule: str
    options: dict[str, Any]
    removed: list[str]
    errors_left: int

    @property
    def entry(self) -> str:
        return entry(self.rule, self.options)


@dataclass
class Search:
    steps: list[Step] = field(default_factory=list)
    # candidates that could not be applied, or that left their finding or added an error
    rejected: dict[str, str] = field(default_factory=dict)
    errors_before: int = 0
    errors_left: list[str] = field(default_factory=list)  # what no rule removes

    def record(self) -> dict[str, Any]:
        return {
            "chosen": [
                {
                    "rule": s.rule,
                    "options": s.options,
                    "removed": s.removed,
                    "errors_left": s.errors_left,
                }
                for s in self.steps
            ],
            "errors_before": self.errors_before,
            "errors_left": self.errors_left,
            "rejected": self.rejected,
        }


def summary(chosen: list[dict[str, Any]]) -> str:
    """`onnx.convert_opset{opset: 13}, onnx.decompose`: the rules chosen, as the summary line
    and the report name them."""
    return ", ".join(c["rule"] + _braced(c["options"]) for c in chosen)


def _braced(options: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in options.items()) + "}" if options else ""


def search(
    model: Any,
    profile: TargetProfile,
    quantization: str,
    apply: Callable[[RuleSpec, Any], Any],
    skip: frozenset[str] = frozenset(),
) -> tuple[Any, Search]:
    """The model with the helpful rules applied, and what was chosen. `apply(spec, model)`
    applies one rule for real (the contract checked); `skip`: rules the recipe lists
    itself (its own options win, as for the target's default rules)."""
    result = Search()
    errors = _errors(_check(model, profile, quantization))
    result.errors_before = len(errors)
    for _ in range(MAX_ROUNDS):
        if not errors:
            break
        best: tuple[tuple[int, int], RuleSpec, set[str]] | None = None
        for spec in _candidates(errors.values(), profile, quantization, skip):
            label = entry(spec.name, _options(spec))
            if label in result.rejected:
                continue
            rewritten = _applied(spec.rule, model, _options(spec))
            if rewritten is None:
                result.rejected[label] = "could not be applied to this model"
                continue
            after = _errors(_check(rewritten, profile, quantization))
            removed, added = set(errors) - set(after), set(after) - set(errors)
            if added or not removed:
                why = f"adds {sorted(added)[0]}" if added else "removes no error"
                result.rejected[label] = why
                continue
            nodes = sum(errors[k].count for k in removed)
            score = (len(removed), nodes)  # ties: the first in catalogue order
            if best is None or score > best[0]:
                best = (score, spec, removed)
        if best is None:
            break
        _, spec, removed = best
        model = apply(spec, model)
        errors = _errors(_check(model, profile, quantization))
        result.steps.append(Step(spec.name, _options(spec), sorted(removed), len(errors)))
    result.errors_left = sorted(errors)
    return model, result


def _errors(findings: list[Finding]) -> dict[str, Finding]:
    """The failing findings by what they say ("Erf: not supported by tflite")."""
    return {f"{f.operator}: {f.reason}": f for f in findings if f.severity == "error"}


def _options(spec: RuleSpec) -> dict[str, Any]:
    return spec.options.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _candidates(
    errors: Any, profile: TargetProfile, quantization: str, skip: frozenset[str]
) -> list[RuleSpec]:
    """The onnx rules that declare they remove one of the errors, each with the options the
    finding gives it (convert_opset's opset: the nearest the target accepts) or the rule
    declares for it (`fix_options`), else those of the target's default entry of that rule,
    else its defaults; a rule whose output breaks a build in this mode, or whose options only
    the user knows, is not a candidate."""
    from pydantic import ValidationError

    defaults = {s.name: _options(s) for s in profile.rewrite_specs()}
    found: dict[str, RuleSpec] = {}
    for finding in errors:
        for fix in finding.fixes:
            for rule in rules_fixing(fix):
                if rule.level != "onnx" or quantization in rule.breaks or rule.name in skip:
                    continue
                given = finding.options if rule.name == finding.rule else None
                options = options_for(rule, fix, given)
                if options is None:  # the user's to choose (a function to keep whole)
                    continue
                if not options:
                    options = defaults.get(rule.name, {})
                try:
                    validated = rule.Options.model_validate(options)
                except ValidationError:
                    continue
                spec = RuleSpec(rule, validated, rule.name)
                found.setdefault(entry(rule.name, _options(spec)), spec)
    return list(found.values())
