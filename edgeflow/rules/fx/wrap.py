"""fx.wrap_leaf: trace with symbolic_trace, keeping named helper functions as leaf calls.

A helper symbolic_trace cannot trace through (control flow on a tensor or its shape, len() of a
tensor, ...) becomes one call_function node that runs the helper as is. Calls are wrapped where
forward (or a submodule's forward) finds the helper as a global, and as an attribute of the
helper's own module (`helpers.fn(x)`). torch.fx skips globals whose name starts with "_".
Put this rule before the other fx.* rules: they then rewrite its graph.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Field, field_validator

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.base import (
    CODE_REF,
    FxRule,
    GraphOrigin,
    RewriteContext,
    RuleOptions,
    RuleResult,
    Site,
)
from edgeflow.rules.fixes import Fix
from edgeflow.rules.fx._graph import SYMBOLIC, first_line
from edgeflow.schema.sections import user_error


class WrapLeaf(FxRule):
    """symbolic_trace with the given functions as leaves (torch.fx autowrap_functions)."""

    name = "fx.wrap_leaf"
    runs_before: ClassVar[dict[str, str]] = {
        "fx.*": "it decides how the module is traced, which the other fx rules then rewrite"
    }
    description = "Keep helper functions as leaf calls so that symbolic_trace succeeds."
    fixes = (Fix.capture("unsupported"),)
    example = (
        "return pad_to_even(self.conv(x))  # pad_to_even branches on x.shape: TraceError",
        "conv = self.conv(x); pad_to_even = helpers_pad_to_even(conv)  # one leaf call",
    )

    class Options(RuleOptions):
        """functions: the functions to keep as single calls while tracing, as 'pkg.mod:fn',
        'file.py:fn' (relative to the recipe's folder) or 'pkg.mod.fn'."""

        functions: Annotated[list[str], CODE_REF] = Field(min_length=1)

        @field_validator("functions")
        @classmethod
        def _are_paths(cls, values: list[str]) -> list[str]:
            for text in values:
                module, _, attr = text.replace(":", ".").rpartition(".")
                if not module or not attr.isidentifier():
                    raise user_error(
                        f"expected 'package.module:function', 'file.py:function' or "
                        f"'package.module.function' (got {text})",
                        "name the function symbolic_trace cannot trace",
                    )
            return values

    def apply(self, model: Any, opts: Any, ctx: RewriteContext) -> RuleResult[Any]:
        import copy

        from torch import fx

        if isinstance(model, fx.GraphModule):
            first = Site.not_applicable("already a graph: put fx.wrap_leaf first")
            return RuleResult(model, sites=[first])
        functions = [_resolve(text, ctx.base_dir) for text in opts.functions]
        tracer = fx.Tracer(autowrap_functions=tuple(functions))
        # Also patch each helper where its own module holds it, for `helpers.fn(x)` calls.
        search = getattr(tracer, "_autowrap_search", None)
        if isinstance(search, list):
            search.extend(
                m for f in functions if (m := sys.modules.get(f.__module__)) and m not in search
            )
        root = copy.deepcopy(model)
        try:
            graph = tracer.trace(root)
        except Exception as exc:  # symbolic_trace raises whatever forward raises on a Proxy
            raise EdgeflowError(
                f"symbolic_trace still fails with {', '.join(opts.functions)} wrapped: "
                f"{first_line(exc)}",
                "wrap the function the error comes from too, or remove fx.wrap_leaf to let "
                "the fx rules use torch.export's graph",
            ) from exc
        gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
        wrapped = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in functions]
        if not wrapped:
            names = ", ".join(opts.functions)
            return RuleResult(model, sites=[Site.not_applicable(f"forward calls none of {names}")])
        sites = [
            Site.changed(n.name, f"a leaf call of {getattr(n.target, '__name__', n.target)}")
            for n in wrapped
        ]
        origin = GraphOrigin(SYMBOLIC)
        return RuleResult(gm, sites=sites, graph=origin, sources={"graph": gm.code})


def _resolve(text: str, base_dir: Path) -> Any:
    """The function named by 'pkg.mod:fn', 'file.py:fn' (relative to the recipe's folder) or
    'pkg.mod.fn'."""
    from edgeflow.core.refs import ImportRef

    written = text if ":" in text else ":".join(text.rpartition(".")[::2])
    try:
        ref = ImportRef.parse(written, base_dir)
    except ValueError as exc:
        raise EdgeflowError(str(exc), "write 'package.module:function'") from None
    function = ref.load()
    if not callable(function):
        raise EdgeflowError(f"{text} is not a function", "name a def")
    return function
