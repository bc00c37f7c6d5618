"""Declared rule order: a rule names the rules it must run before (`runs_before`) or after
(`runs_after`), each with why; a name, or `fx.*` for every other rule of a level. The recipe
loader checks its `rewrites:` list against them (edgeflow.rules.resolve_rewrites); a recipe's
onnx rule that one of the target's defaults must precede runs again after that default
(`after_the_targets`, the rewrite_target stage), since the defaults run after the recipe's
rules; a test holds every target's defaults to them. Levels keep their own order (ast, then
fx, then onnx) on top of this."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Misorder:
    """Two rules in the wrong order: `late` runs after `early` but must not."""

    early: int  # positions in the sequence checked
    late: int
    why: str  # the declaration's reason
    declared_by: str  # the rule that declares it

    def message(self, names: Sequence[str]) -> str:
        early, late = names[self.early], names[self.late]
        return (
            f"'{late}' runs after '{early}', but {self.declared_by} must run "
            + (f"before '{early}'" if self.declared_by == late else f"after '{late}'")
            + f" ({self.why})"
        )


def covers(pattern: str, name: str) -> bool:
    """Whether a declared name ('onnx.lower_matmul', or 'fx.*') names the rule `name`."""
    if pattern.endswith(".*"):
        return name.startswith(pattern[:-1])
    return name == pattern


def misordered(rules: Sequence[type[Any]]) -> list[Misorder]:
    """Each pair of rules, in the order they run, that one of them declares must run the
    other way round."""
    found = []
    for late, second in enumerate(rules):
        for early, first in enumerate(rules[:late]):
            if first.name == second.name:
                continue
            for pattern, why in getattr(second, "runs_before", {}).items():
                if covers(pattern, first.name):
                    found.append(Misorder(early, late, why, second.name))
            for pattern, why in getattr(first, "runs_after", {}).items():
                if covers(pattern, second.name):
                    found.append(Misorder(early, late, why, first.name))
    return found


def after_the_targets(own: Sequence[Any], theirs: Sequence[Any]) -> list[Any]:
    """The rule specs the rewrite_target stage runs, in order: the target's defaults that the
    recipe does not list (`theirs`, as the profile orders them), and each of the recipe's
    own onnx rules (`own`) that one of those defaults must precede again right after the
    last such default, with the recipe's options. A rule leaves a model it already
    rewrote as it is (tests/rules/onnx/test_all_rules.py), so running it again changes only
    what the default wrote: armnn's onnx.ids_as_float writes a MatMul that a recipe's own
    onnx.lower_matmul, run before it, would otherwise leave."""
    listed = {spec.name for spec in own}
    run = [spec for spec in theirs if spec.name not in listed]
    for spec in own:
        if spec.rule.level != "onnx":
            continue
        last = max(
            (i for i, default in enumerate(run) if misordered([spec.rule, default.rule])),
            default=None,
        )
        if last is not None:
            run.insert(last + 1, spec)
    return run
