"""Apply a recipe's rules in order, recording what each one changed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from edgeflow.errors import EdgeflowError
from edgeflow.rules.base import RewriteContext, RuleSpec


def apply_rules(
    model: Any, specs: list[RuleSpec], levels: tuple[str, ...], ctx: RewriteContext
) -> tuple[Any, list[dict[str, Any]], dict[str, str]]:
    """Apply the specs of the given levels in order: (model, per-rule records, sources)."""
    records: list[dict[str, Any]] = []
    sources: dict[str, str] = {}
    for spec in specs:
        if spec.rule.level not in levels:
            continue
        start = time.perf_counter()
        try:
            result = spec.rule().apply(model, spec.options, ctx)
        except EdgeflowError as exc:
            raise EdgeflowError(f"rule {spec.name}: {exc.message}", exc.hint) from exc
        except Exception as exc:
            raise EdgeflowError(
                f"rule {spec.name} failed: {type(exc).__name__}: {exc}",
                "this is a bug in the rule or a model it does not handle; "
                "remove the rule from the recipe to get past it",
            ) from exc
        model = result.model
        records.append(
            {
                "rule": spec.name,
                "level": spec.rule.level,
                "options": spec.options.model_dump(mode="json", by_alias=True),
                "seconds": round(time.perf_counter() - start, 4),
                **result.summary(),
            }
        )
        sources.update({f"{spec.name}.{name}": text for name, text in result.sources.items()})
    return model, records, sources


def rewritten_module(
    recipe: Any, base_dir: Path
) -> tuple[Any, list[dict[str, Any]], dict[str, str]]:
    """The recipe's PyTorch module with its ast.* and fx.* rules applied."""
    from edgeflow.source import build_module

    module = build_module(recipe.source)
    dynamic = recipe.source.dynamic_batch is not None
    ctx = RewriteContext(list(recipe.source.inputs), base_dir, dynamic)
    return apply_rules(module, list(recipe.rewrites), ("ast", "fx"), ctx)
