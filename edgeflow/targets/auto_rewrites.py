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
from edgeflow.targets.findings import Finding
from edgeflow.targets.precheck import _applied, _check, entry
from edgeflow.targets.profile import TargetProfile

MAX_ROUNDS = 32  # each round removes at least one error: a model has far fewer kinds


@dataclass
class Step:
    """One rule the search applied: what it removed, and how many errors were left."""

    rule: str
    options: dict[str, Any]
    removed: list[str]
    errors_left: int
    added: list[str] = field(default_factory=list)  # the first of a pair: what the second removes

    @property
    def entry(self) -> str:
        """As a `rewrites:` entry (what the summary line, metrics.json and fix print)."""
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
                    "added": s.added,
                    "errors_left": s.errors_left,
                }
                for s in self.steps
            ],
            "errors_before": self.errors_before,
            "errors_left": self.errors_left,
            "rejected": self.rejected,
        }


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
        chosen = _best(model, errors, profile, quantization, skip, result.rejected)
        if not chosen:
            break
        for spec in chosen:
            model = apply(spec, model)
            after = _errors(_check(model, profile, quantization))
            removed, added = sorted(set(errors) - set(after)), sorted(set(after) - set(errors))
            result.steps.append(Step(spec.name, _options(spec), removed, len(after), added))
            errors = after
    result.errors_left = sorted(errors)
    return model, result


def _best(
    model: Any,
    errors: dict[str, Finding],
    profile: TargetProfile,
    quantization: str,
    skip: frozenset[str],
    rejected: dict[str, str],
) -> list[RuleSpec]:
    """The rules to apply next: of those after which the precheck has fewer errors and none
    new, the one that removes the most (ties: the first in catalogue order). Where none does,
    a rule that removes an error but adds others, with the rules that then remove what it
    added (at most MAX_REPAIRS, each removing one and adding none: onnx.decompose writes
    LayerNormalization with a Sqrt and 1-D operands, which onnx.sqrt_newton and
    onnx.explicit_broadcast remove on armnn), judged as one step. `rejected` gets each
    candidate not taken, with why."""

    def judged(rewritten: Any) -> tuple[dict[str, Finding], set[str], set[str]]:
        after = _errors(_check(rewritten, profile, quantization))
        return after, set(errors) - set(after), set(after) - set(errors)

    best: tuple[tuple[int, int], list[RuleSpec]] | None = None
    partial: list[tuple[RuleSpec, Any, dict[str, Finding], set[str]]] = []
    for spec in _candidates(errors.values(), profile, quantization, skip):
        label = entry(spec.name, _options(spec))
        rewritten = _applied(spec.rule, model, _options(spec))
        if rewritten is None:
            rejected[label] = "could not be applied to this model"
            continue
        after, removed, added = judged(rewritten)
        if not removed:
            rejected[label] = "removes no error"
            continue
        if added:
            rejected[label] = f"adds {sorted(added)[0]}"
            partial.append((spec, rewritten, after, added))
            continue
        score = (len(removed), sum(errors[k].count for k in removed))
        if best is None or score > best[0]:
            best = (score, [spec])
    if best is None:
        for first, rewritten, after, added in partial:
            chain = _repair(rewritten, after, added, profile, quantization, skip, {first.name})
            if chain is None:
                continue
            specs, removed = [first, *chain[0]], set(errors) - chain[1]
            score = (len(removed), sum(errors[k].count for k in removed))
            if removed and not chain[1] - set(errors) and (best is None or score > best[0]):
                best = (score, specs)
    if best is None:
        return []
    for spec in best[1]:  # taken now: no longer "rejected"
        rejected.pop(entry(spec.name, _options(spec)), None)
    return best[1]


MAX_REPAIRS = 3  # rules after one that adds errors, to remove what it added


def _repair(
    model: Any,
    errors: dict[str, Finding],
    added: set[str],
    profile: TargetProfile,
    quantization: str,
    skip: frozenset[str],
    used: set[str],
) -> tuple[list[RuleSpec], set[str]] | None:
    """Rules that remove, one after the other, the errors a rule added (each removing one
    and adding none), and the errors left after them; None where they cannot all go.
    `errors`: the model's, which include `added`."""
    chain: list[RuleSpec] = []
    for _ in range(MAX_REPAIRS):
        if not added & set(errors):
            return chain, set(errors)
        fixing = [errors[k] for k in sorted(added & set(errors))]
        for spec in _candidates(fixing, profile, quantization, skip):
            if spec.name in used:
                continue
            rewritten = _applied(spec.rule, model, _options(spec))
            after = None if rewritten is None else _errors(_check(rewritten, profile, quantization))
            if after is not None and set(after) < set(errors):
                model, errors = rewritten, after
                chain.append(spec)
                used = used | {spec.name}
                break
        else:
            return None
    return (chain, set(errors)) if not added & set(errors) else None


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
