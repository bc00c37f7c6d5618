"""Apply a recipe's rules in order, recording what each one changed and checking its contract.

Each rule, as it runs in a build: its input model is left as it was, its output passes the
ONNX checker (onnx rules), and its output computes what its input did on the declared inputs
within the rule's tolerance (edgeflow.rules.contract). A built-in rule that breaks this is a
bug in edgeflow (InternalError); a user rule that does is the user's to fix. Either way the
message names the rule and the rules that ran before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgeflow.core.errors import EdgeflowError, InternalError
from edgeflow.core.refs import user_frame
from edgeflow.rules import contract
from edgeflow.rules.base import RewriteContext, RuleSpec


@dataclass
class _Checked:
    """The model a rule gets, with what the contract needs to judge the rule's result."""

    model: Any
    onnx: bool
    digest: str
    outputs: contract.Outputs


def apply_rules(
    model: Any,
    specs: list[RuleSpec],
    levels: tuple[str, ...],
    ctx: RewriteContext,
    check: bool = True,
) -> tuple[Any, list[dict[str, Any]], dict[str, str]]:
    """Apply the specs of the given levels in order: (model, per-rule records, sources).
    With `check`, each rule's contract is enforced and recorded."""
    records: list[dict[str, Any]] = []
    sources: dict[str, str] = {}
    ran: list[str] = []
    if not any(spec.rule.level in levels for spec in specs):
        return model, records, sources  # nothing to apply, nothing to check it against
    feeds = contract.probes(ctx.inputs) if check else []
    current = _snapshot(model, feeds, ctx) if check else None
    for spec in specs:
        if spec.rule.level not in levels:
            continue
        before = op_counts(model) if spec.rule.level != "ast" else None
        result = _apply(spec, model, ctx, ran)
        record = {
            "rule": spec.name,
            "level": spec.rule.level,
            "options": spec.options.model_dump(mode="json", by_alias=True),
            **result.record(),
        }
        if before is not None:  # what the rule changed, as the report shows it
            kind, counts = before
            record["ops"] = {"kind": kind, "before": counts, "after": op_counts(result.model)[1]}
        if current is not None:
            current, record["contract"] = _enforce(spec, current, result.model, feeds, ctx, ran)
        model = result.model
        records.append(record)
        ran.append(spec.name)
        sources.update({f"{spec.name}.{name}": text for name, text in result.sources.items()})
    return model, records, sources


def op_counts(model: Any) -> tuple[str, dict[str, int]]:
    """("operators", how many of each operator an ONNX model's graph has), or ("layers", how
    many of each layer type, leaf module, a PyTorch module has)."""
    from collections import Counter

    if _is_onnx(model):
        found = Counter(node.op_type for node in model.graph.node)
        return "operators", dict(sorted(found.items()))
    leaves = Counter(type(m).__name__ for m in model.modules() if next(m.children(), None) is None)
    return "layers", dict(sorted(leaves.items()))


def _apply(spec: RuleSpec, model: Any, ctx: RewriteContext, ran: list[str]) -> Any:
    try:
        return spec.rule().apply(model, spec.options, ctx)
    except EdgeflowError as exc:
        raise EdgeflowError(f"rule {spec.name}: {exc.message}", exc.hint) from exc
    except Exception as exc:
        cause = f"{type(exc).__name__}: {exc}{_after(ran)}"
        if not spec.is_user_rule:
            raise InternalError(f"rule '{spec.name}'", cause) from exc
        raise EdgeflowError(
            f"your rule {spec.source} raised {cause} ({user_frame(exc)})",
            "fix the rule, or remove it from the recipe's rewrites:",
        ) from exc


def _snapshot(model: Any, feeds: list[dict[str, Any]], ctx: RewriteContext) -> _Checked:
    if _is_onnx(model):
        return _Checked(model, True, *contract.onnx_snapshot(model, feeds))
    outputs = contract.torch_outputs(model, feeds, ctx.inputs) if ctx.check_numerics else None
    return _Checked(model, False, contract.torch_state(model), outputs or contract.Outputs(None))


def _enforce(
    spec: RuleSpec,
    before: _Checked,
    after_model: Any,
    feeds: list[dict[str, Any]],
    ctx: RewriteContext,
    ran: list[str],
) -> tuple[_Checked, list[str]]:
    """Check one rule's result against its input; returns the result's snapshot (the next
    rule's input) and what was checked, for the record."""
    unchanged = (
        contract.onnx_digest(before.model) if before.onnx else contract.torch_state(before.model)
    )
    in_place = "it changed its input model in place (a rule must return a new one)"
    if unchanged != before.digest:
        _broken(spec, in_place, ran)
    if not before.onnx and before.outputs.per_probe is not None:  # e.g. a forward rebound
        again = contract.torch_outputs(before.model, feeds, ctx.inputs)
        if contract.difference(before.outputs, again, 0.0):
            _broken(spec, in_place, ran)
    checked = ["input left unchanged"]
    after = _snapshot(after_model, feeds, ctx)
    if after.onnx:
        import onnx

        try:
            onnx.checker.check_model(after_model)
        except onnx.checker.ValidationError as exc:
            _broken(spec, f"its output fails the ONNX checker: {str(exc).splitlines()[0]}", ran)
        checked.append("ONNX checker")
    tolerance = spec.rule().tolerance(spec.options)
    if tolerance is None:
        checked.append("numerics not compared (the rule changes them on purpose)")
    elif before.outputs.per_probe is None:
        why = before.outputs.error or "numerics checked by the stage as a whole"
        checked.append(f"numerics not compared: {why}")
    else:
        problem = contract.difference(before.outputs, after.outputs, tolerance)
        if problem:
            _broken(spec, problem, ran)
        checked.append(f"outputs within tolerance {tolerance:g} on random and all-zero inputs")
    return after, checked


def _broken(spec: RuleSpec, problem: str, ran: list[str]) -> None:
    cause = f"{problem}{_after(ran)}"
    if spec.is_user_rule:
        raise EdgeflowError(
            f"rule {spec.source} broke its contract: {cause}",
            "fix the rule (a rule returns a new model that computes what its input did within "
            "its tolerance()), or remove it from the recipe's rewrites:",
        )
    raise InternalError(f"rule '{spec.name}'", f"it broke its contract: {cause}")


def _after(ran: list[str]) -> str:
    return f" (rules before it: {', '.join(ran)})" if ran else " (the first rule to run)"


def _is_onnx(model: Any) -> bool:
    return type(model).__name__ == "ModelProto"
