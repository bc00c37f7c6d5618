"""onnx.simplify: onnxscript's optimizer (constant folding, dead code, identity removal)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from edgeflow.rules.base import OnnxRule, RewriteContext, RuleOptions, RuleResult
from edgeflow.rules.onnx._graph import copy_model, same_graph
from edgeflow.rules.onnx.optimize import _diff, _removed

if TYPE_CHECKING:
    import onnx


class Simplify(OnnxRule):
    name = "onnx.simplify"
    description = "Fold constants, drop dead code and identities with onnxscript's optimizer."

    class Options(RuleOptions):
        """iterations: optimizer rounds; inline: inline local functions first."""

        iterations: int = Field(2, ge=1, le=10)
        inline: bool = True

    example: ClassVar[tuple[str, str] | None] = (
        "Shape(x) -> Gather(0) -> Concat([.., -1]) -> Reshape(x, .); Identity -> Relu",
        "Reshape(x, [1, -1]) (shape folded to a constant) -> Relu",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 1e-4  # folding reorders float arithmetic (e.g. BatchNorm into Conv)

    def apply(
        self, model: onnx.ModelProto, opts: Options, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        out = simplify(model, opts.iterations, opts.inline)
        if same_graph(out, model):
            return RuleResult(copy_model(model), False, 0, ["already simplified"])
        return RuleResult(out, True, _removed(model, out), [_diff(model, out)])


def simplify(model: onnx.ModelProto, iterations: int = 2, inline: bool = True) -> onnx.ModelProto:
    """A simplified copy of the model (the input is left as it was)."""
    import onnx_ir as ir
    import onnxscript.optimizer

    from edgeflow.errors import EdgeflowError

    ir_model = ir.serde.deserialize_model(copy_model(model))
    try:
        onnxscript.optimizer.optimize_ir(ir_model, num_iterations=iterations, inline=inline)
    except Exception as exc:  # the optimizer's errors are not typed
        raise EdgeflowError(
            f"onnxscript's optimizer failed: {type(exc).__name__}: {exc}",
            "run onnx.optimize with explicit passes instead",
        ) from exc
    out = ir.serde.serialize_model(ir_model)
    _drop_provenance(out)
    return out


def _drop_provenance(model: onnx.ModelProto) -> None:
    """Remove the optimizer's bookkeeping metadata ('pkg.onnxscript.*'), which a second run
    would rewrite: without it, simplifying twice gives the same model as simplifying once."""
    from edgeflow.rules.onnx._graph import all_graphs

    for graph in all_graphs(model.graph):
        items = [*graph.initializer, *graph.value_info, *graph.input, *graph.output, *graph.node]
        for item in items:
            kept = [p for p in item.metadata_props if not p.key.startswith("pkg.onnxscript.")]
            if len(kept) != len(item.metadata_props):
                del item.metadata_props[:]
                item.metadata_props.extend(kept)
