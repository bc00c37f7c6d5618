"""fx.replace_pattern: replace every match of a user's pattern function by a replacement.

Both functions are traced with symbolic_trace and matched literally
(torch.fx.subgraph_rewriter.replace_pattern): `torch.relu` matches torch.relu calls only, not
F.relu or nn.ReLU. To match a graph that came from torch.export, write the functions with the
aten ops that graph holds, e.g. `torch.ops.aten.relu.default(x)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.base import CODE_REF, FxRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.fixes import Fix
from edgeflow.rules.fx._graph import EXPORT, finish, to_graph_module
from edgeflow.schema.sections import user_error


def _import_path(text: str) -> str:
    module, sep, attr = text.rpartition(":")
    if not sep or not module or not attr.isidentifier():
        raise user_error(
            f"expected 'package.module:function' or 'file.py:function' (got {text})",
            "write e.g. 'patterns.py:relu_pattern'",
        )
    return text


class ReplacePattern(FxRule):
    """Each subgraph matching `pattern` is replaced by `replacement`'s graph."""

    name = "fx.replace_pattern"
    description = "Replace each match of a pattern function by a replacement function."
    fixes = (Fix.capture("unsupported"),)
    example = (
        "pattern: def p(x): return torch.relu(x) * 2",
        "replacement: def r(x): return torch.relu(x) + torch.relu(x)",
    )

    class Options(RuleOptions):
        """pattern, replacement: functions given as 'pkg.mod:fn' or 'file.py:fn' (relative to
        the recipe's folder), traced and matched with torch.fx.subgraph_rewriter; tolerance:
        the output change the replacement may cause, null when it changes numerics on purpose."""

        pattern: Annotated[str, CODE_REF]
        replacement: Annotated[str, CODE_REF]
        # The output change the replacement may cause; null when it changes numerics on purpose.
        tolerance: float | None = Field(1e-5, ge=0)

        @field_validator("pattern", "replacement")
        @classmethod
        def _is_import_path(cls, value: str) -> str:
            return _import_path(value)

    def tolerance(self, opts: Any) -> float | None:
        return opts.tolerance

    def apply(self, model: Any, opts: Any, ctx: RewriteContext) -> RuleResult[Any]:
        from torch.fx import subgraph_rewriter

        pattern = _load(opts.pattern, ctx.base_dir)
        replacement = _load(opts.replacement, ctx.base_dir)
        gm, how = to_graph_module(model, ctx)
        found = subgraph_rewriter.replace_pattern(gm, pattern, replacement)
        if not found:
            reason = f"no match of {opts.pattern}"
            if how.kind == EXPORT:
                reason += " (the graph holds aten ops: write the pattern with torch.ops.aten.*)"
            return finish(model, gm, how, [Site.not_applicable(reason)])
        replaced = f"match of {opts.pattern} replaced with {opts.replacement}"
        sites = [Site.changed(_anchor(match), replaced) for match in found]
        return finish(model, gm, how, sites)


def _anchor(match: Any) -> str:
    """The name of the graph node a match's output was (its pattern anchor's image)."""
    node = match.nodes_map.get(match.anchor, match.anchor)
    return str(getattr(node, "name", node))


def _load(text: str, base_dir: Path) -> Any:
    """The function an import path names; file paths are relative to the recipe's folder."""
    from edgeflow.core.refs import ImportRef

    try:
        ref = ImportRef.parse(text, base_dir)
    except ValueError as exc:
        raise EdgeflowError(str(exc), "write 'package.module:function'") from None
    function = ref.load()
    if not callable(function):
        raise EdgeflowError(f"{text} is not a function", "point it at a def")
    return function
