"""onnx.convert_opset: move a model to another opset with onnx's version converter."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, ClassVar

from pydantic import field_validator

from edgeflow.core.errors import EdgeflowError
from edgeflow.core.onnxgraph import copy_model, opset_version
from edgeflow.rules.base import OnnxRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.fixes import Fix

if TYPE_CHECKING:
    import onnx


class ConvertOpset(OnnxRule):
    name = "onnx.convert_opset"
    description = "Convert the model to another ONNX opset (onnx.version_converter)."
    fixes = (Fix.finding("opset"),)

    class Options(RuleOptions):
        """opset: the default-domain opset to convert to."""

        opset: int

        @field_validator("opset")
        @classmethod
        def _known(cls, opset: int) -> int:
            import onnx.defs

            from edgeflow.schema.sections import user_error

            newest = onnx.defs.onnx_opset_version()
            if not 7 <= opset <= newest:
                raise user_error(
                    f"opset must be between 7 and {newest} (got {opset})",
                    f"onnx {onnx.__version__} knows opsets up to {newest}",
                )
            return opset

    example: ClassVar[tuple[str, str] | None] = (
        "opset 18: ReduceMean(x, axes) with axes as an input",
        "opset 13: ReduceMean(x) with axes as an attribute",
    )

    def apply(
        self, model: onnx.ModelProto, opts: Options, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        import onnx

        current = opset_version(model)
        if current == opts.opset:
            nothing = Site.not_applicable(f"already at opset {current}")
            return RuleResult(copy_model(model), sites=[nothing])
        missing = _missing_ops(model, opts.opset)
        if missing:
            listed = ", ".join(f"{op} (since opset {v})" for op, v in sorted(missing.items()))
            raise EdgeflowError(
                f"cannot convert opset {current} -> {opts.opset}: {listed} "
                f"did not exist at opset {opts.opset}",
                "decompose them first (onnx.decompose) or choose an opset >= "
                f"{max(missing.values())}",
            )
        try:
            out = onnx.version_converter.convert_version(copy_model(model), opts.opset)
            onnx.checker.check_model(out)
        except (RuntimeError, ValueError, onnx.checker.ValidationError) as exc:
            detail = str(exc).splitlines()[0].split("failed: ")[-1]  # drop the C++ file:line
            raise EdgeflowError(
                f"cannot convert opset {current} -> {opts.opset}: {detail}",
                "onnx's version converter has no adapter for an op here; choose another "
                "opset, or decompose or replace the op first",
            ) from exc
        from edgeflow.rules.onnx.optimize import op_sites

        changed = sum(1 for a, b in zip(model.graph.node, out.graph.node, strict=False) if a != b)
        converted = Site.changed("", f"opset {current} -> {opts.opset}; {changed} nodes adapted")
        sites = [converted, *op_sites(model, out)]
        return RuleResult(out, matches=changed, sites=sites)


def _missing_ops(model: onnx.ModelProto, target: int) -> dict[str, int]:
    """Default-domain ops of the model that were introduced after `target`: op -> since."""
    from edgeflow.core.onnxgraph import all_nodes

    first = _first_versions()
    ops = {n.op_type for n in all_nodes(model) if n.domain in ("", "ai.onnx")}
    return {op: first[op] for op in ops if first.get(op, 0) > target}


@functools.cache
def _first_versions() -> dict[str, int]:
    """The opset each default-domain op first appeared in."""
    import onnx.defs

    first: dict[str, int] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain in ("", "ai.onnx"):
            first[schema.name] = min(first.get(schema.name, 10**6), schema.since_version)
    return first
