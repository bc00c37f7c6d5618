"""rewrite: apply the recipe's ast.* and fx.* rules to the PyTorch module, and check the result.

The rewritten module is not serialised (AST rewrites bind new code to live objects); the export
stage re-applies the same rules, which are deterministic. This stage records what each rule
changed, keeps the rewritten code for inspection, and checks that the rewritten module still
computes what the original does on the declared input shapes, within the rules' declared
tolerances (a rule that changes numerics on purpose, such as relu -> relu6, skips the check
and is named in rewrite.json; the verify stage still compares the artifact with the source).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.base import RuleSpec
from edgeflow.stages._rewritten import rewritten_module, specs_of
from edgeflow.stages.base import Stage, StageContext

if TYPE_CHECKING:
    from edgeflow.recipe.schema import Recipe

TOLERANCE = 1e-4  # float32 noise on top of what the rules declare they may change


def run(ctx: StageContext) -> None:
    import torch

    from edgeflow.source import build_module, example_inputs, flat_tensors

    recipe = ctx.recipe
    auto = auto_rules(recipe, ctx.loaded.path.parent) if recipe.rewrites_auto else None
    extra = specs_of(auto["chosen"]) if auto else ()
    module, records, sources = rewritten_module(recipe, ctx.loaded.path.parent, True, extra)
    ctx.write_json("rewrite", {"rules": records, "auto": auto})  # completed below
    sources_dir = ctx.output("sources")
    sources_dir.mkdir()
    for name, text in sources.items():
        (sources_dir / f"{name}.py").write_text(text, encoding="utf-8")
    args = example_inputs(recipe.source.inputs)
    with torch.inference_mode():
        expected_raw = build_module(recipe.source)(*args)
        actual_raw = module(*args)
    if recipe.evaluation.metric == "detections":
        _check_detections(ctx, records, expected_raw, actual_raw, auto)
        return
    expected, actual = flat_tensors(expected_raw), flat_tensors(actual_raw)
    same_shapes = len(expected) == len(actual) and all(
        e.shape == a.shape for e, a in zip(expected, actual, strict=False)
    )
    diffs = [(e.float() - a.float()).abs().max() for e, a in zip(expected, actual, strict=False)]
    diff = max((float(d) for d in diffs), default=0.0) if same_shapes else None
    specs = [*recipe.rewrites, *extra]
    tolerances = [spec.rule().tolerance(spec.options) for spec in specs]
    if any(t is None for t in tolerances):
        deliberate = [s.name for s, t in zip(specs, tolerances, strict=True) if t is None]
        ctx.write_json(
            "rewrite",
            {
                "rules": records,
                "max_abs_diff": diff,
                "numerics_changed_by": deliberate,
                "auto": auto,
            },
        )
        return
    allowed = TOLERANCE + sum(t for t in tolerances if t is not None)
    if diff is None or diff > allowed:
        what = "different outputs" if diff is None else f"max abs diff {diff:.3g}"
        raise EdgeflowError(
            f"the rewritten module computes something else: {what} "
            f"on the declared input shapes (rules: {', '.join(r['rule'] for r in records)})",
            "remove rules one at a time to find the one that changes the result",
        )
    ctx.write_json(
        "rewrite",
        {"rules": records, "max_abs_diff": diff, "numerics_changed_by": [], "auto": auto},
    )


def _check_detections(
    ctx: StageContext, records: list, expected: object, actual: object, auto: Any
) -> None:
    """A detector may change its output form (list of dicts -> padded tensors) on purpose:
    compare the detections themselves, with the recipe's detection tolerances."""
    from edgeflow.verify.detections import compare, padded

    checks = ctx.recipe.verify.detections
    limit = checks.max_detections
    try:
        result = compare(
            padded(expected, limit),
            padded(actual, limit),
            tuple(ctx.recipe.source.inputs[0].shape[-2:]),
            checks.box_atol,
            checks.box_units,
            checks.score_atol,
        )
    except ValueError as exc:
        raise EdgeflowError(f"the rewritten detector's outputs: {exc}") from exc
    summary = {k: v for k, v in result.items() if k != "per_image"}
    ctx.write_json(
        "rewrite",
        {"rules": records, "detections": summary, "numerics_changed_by": [], "auto": auto},
    )
    if result["match_rate"] < checks.min_match_rate or result["count_mismatch_images"]:
        raise EdgeflowError(
            f"the rewritten detector finds other detections than the source on the declared "
            f"input: {result['matched']} of {result['reference_detections']} matched, "
            f"{result['artifact_detections']} returned",
            "remove rules one at a time to find the one that changes the result",
        )


STAGE = Stage(
    name="rewrite",
    description="Apply ast.* and fx.* rules; record their changes; check numerical equality.",
    run=run,
    produces={"rewrite": "rewrite.json", "sources": "rewritten"},
    # export: the exporter `rewrites: auto` tries the rules with
    reads=(
        "source",
        "rewrites",
        "rewrites_auto",
        "export",
        "evaluation.metric",
        "verify.detections",
    ),
    tools=("torch",),
    rule_levels=("ast", "fx"),
    isolated=True,
)


MAX_ROUNDS = 8  # rules tried in turn on one export failure after another


def auto_rules(recipe: Recipe, base_dir: Path) -> dict[str, Any]:
    """`rewrites: auto` on a PyTorch source: export the module (after the recipe's rules) with
    the recipe's exporter, as `edgeflow explain` does; while it fails, or exports an operator
    no edge target runs statically (NonZero, If, Loop, ...), try each ast/fx rule explain
    names for the failure (those that need no options), and keep the one after which the
    failure is gone, preferring one after which the export succeeds. An export stops at its
    first failure, so the failure after it is revealed, not added. What was chosen, what was
    left and what was tried are recorded in rewrite.json."""
    from pydantic import ValidationError

    from edgeflow.core.errors import first_line
    from edgeflow.explain import EXPORTERS, explain
    from edgeflow.rules import builtin_rules

    method = EXPORTERS[recipe.export.exporter]
    known = builtin_rules()
    own = {spec.name for spec in recipe.rewrites}

    def failures(chosen: tuple[RuleSpec, ...]) -> dict[str, list[str]] | None:
        """The export's failures with these rules; None where the last changes nothing (it
        cannot have removed anything)."""
        module, records, _ = rewritten_module(recipe, base_dir, False, chosen)
        tried = [r for r in records if chosen and r["rule"] == chosen[-1].name]
        if tried and not tried[-1]["changed"]:
            return None
        found = explain(recipe, module, (method,))
        return {_failure(a): a.rules for a in found if not a.ok}

    chosen: tuple[RuleSpec, ...] = ()
    left, rejected = failures(chosen) or {}, dict[str, str]()
    for _ in range(MAX_ROUNDS):
        best: tuple[tuple[bool, int], RuleSpec, dict[str, list[str]]] | None = None
        names = dict.fromkeys(name for rules in left.values() for name in rules)
        for name in names:
            rule = known.get(name)
            if rule is None or rule.level not in ("ast", "fx") or name in own | rejected.keys():
                continue
            try:
                spec = RuleSpec(rule, rule.Options.model_validate({}), name)
            except ValidationError:
                rejected[name] = "needs options"
                continue
            try:
                after = failures((*chosen, spec))
            except EdgeflowError as exc:  # the rule cannot rewrite this module (a bug in a
                rejected[name] = first_line(exc)  # rule is an InternalError, and goes on up)
                continue
            if after is None:
                rejected[name] = "changes nothing in this module"
                continue
            if not set(left) - set(after):
                rejected[name] = "leaves the failure"
                continue
            score = (not after, -len(after))
            if best is None or score > best[0]:
                best = (score, spec, after)
        if best is None:
            break
        _, spec, left = best
        chosen = (*chosen, spec)
        own.add(spec.name)
    return {
        "chosen": [{"rule": s.name, "options": {}} for s in chosen],
        "left": sorted(left),
        "rejected": rejected,
    }


def _failure(attempt: Any) -> str:
    """A failure as the search compares it: its cause and place, without the numbers torch.fx
    gives its generated code anew each time (`<eval_with_key>.108:13`)."""
    place = re.sub(r"<eval_with_key>\.\d+", "<eval_with_key>", attempt.location or attempt.error)
    return f"{attempt.cause} ({place})"
