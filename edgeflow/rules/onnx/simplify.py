"""onnx.simplify: onnxscript's optimizer (constant folding, dead code, identity removal)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from edgeflow.core.onnxgraph import copy_model, same_graph
from edgeflow.rules.base import OnnxRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.onnx.optimize import _removed, graph_sites

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
            nothing = Site.not_applicable("already simplified")
            return RuleResult(copy_model(model), sites=[nothing])
        return RuleResult(out, matches=_removed(model, out), sites=graph_sites(model, out))


def simplify(model: onnx.ModelProto, iterations: int = 2, inline: bool = True) -> onnx.ModelProto:
    """A simplified copy of the model (the input is left as it was): onnxscript's optimizer
    (constant folding, its default rewrite rules, dead-code and duplicate removal), with its
    no-op rules made exact.

    onnxscript matches `x + 0`, `x - 0`, `x * 1` and `x / 1` with a tolerance (|c| <= 1e-8,
    or within 1e-5 of 1), so it deletes the `+ 1e-10` that keeps a Log or a division finite
    on silence (an audio model's float build then outputs NaN). Here those four rules match
    only the exact constants; the passes around them are optimize_ir's, in its order.

    onnxscript's MaterializeReshapeShape writes `Reshape(allowzero=1)` at any opset, and
    Reshape has `allowzero` from opset 14: below it the rule writes the Reshape without it
    and skips shapes with a 0 (copy the input's dim without allowzero, not a zero size)."""
    import onnx_ir as ir
    import onnx_ir.passes.common as common
    from onnxscript import rewriter
    from onnxscript.optimizer import _constant_folding

    from edgeflow.core.errors import EdgeflowError

    ir_model = ir.serde.deserialize_model(copy_model(model))
    loop = ir.passes.PassManager(
        [
            _constant_folding.FoldConstantsPass(
                shape_inference=True,
                input_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
                output_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
                should_fold=lambda node: None,
            ),
            rewriter.RewritePass(_rules(_default_opset(model))),
            common.RemoveUnusedNodesPass(),
            common.RemoveUnusedFunctionsPass(),
            common.RemoveUnusedOpsetsPass(),
        ],
        steps=iterations,
        early_stop=True,
    )
    passes = [
        *([common.InlinePass()] if inline else []),
        loop,
        common.RemoveUnusedNodesPass(),
        common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common.LiftSubgraphInitializersToMainGraphPass(),
        common.DeduplicateInitializersPass(),
        common.CommonSubexpressionEliminationPass(),
        common.OutputFixPass(),
        common.NameFixPass(),
    ]
    try:
        ir.passes.Sequential(*passes)(ir_model)
    except Exception as exc:  # the optimizer's errors are not typed
        raise EdgeflowError(
            f"onnxscript's optimizer failed: {type(exc).__name__}: {exc}",
            "run onnx.optimize with explicit passes instead",
        ) from exc
    out = ir.serde.serialize_model(ir_model)
    _drop_provenance(out)
    return out


ALLOWZERO_OPSET = 14  # Reshape's allowzero attribute exists from this opset on


def _default_opset(model: onnx.ModelProto) -> int:
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    return max(versions, default=ALLOWZERO_OPSET)


def _rules(opset: int) -> list[Any]:
    """onnxscript's default rewrite rules with its tolerant no-op rules swapped for exact ones,
    and below opset 14 its Reshape-shape materializer for one that writes no `allowzero`."""
    from onnxscript import rewriter
    from onnxscript.rewriter.rules.common import _materialize_reshape_shape, _no_op

    tolerant = set(_no_op.rules.rules)
    kept = [r for r in rewriter._DEFAULT_REWRITE_RULES if r not in tolerant]
    if opset < ALLOWZERO_OPSET:
        materialize = _materialize_reshape_shape.materialize_reshape_shape_rule
        kept = [_materialize_before_allowzero() if r is materialize else r for r in kept]
    return [*_exact_no_op_rules(), *kept]


def _materialize_before_allowzero() -> Any:
    """MaterializeReshapeShape for opsets before 14: the same constant shape, no `allowzero`,
    and no rewrite where a dim is 0 (it would copy the input's dim there)."""
    import onnx_ir as ir
    from onnxscript.rewriter.rules.common._materialize_reshape_shape import (
        MaterializeReshapeShape,
    )

    class MaterializeBeforeAllowzero(MaterializeReshapeShape):
        def check(self, context: Any, data: Any, shape: Any) -> Any:
            result = super().check(context, data, shape)
            if result and 0 in self._new_dims:
                return result.fail("a 0 dim needs Reshape's allowzero (opset 14)")
            return result

        def rewrite(self, op: Any, data: Any, shape: Any) -> Any:
            dims = ir.tensor(self._new_dims, dtype=ir.DataType.INT64)
            return op.Reshape(data, op.Constant(value=dims))

    return MaterializeBeforeAllowzero.rule()


def _exact_no_op_rules() -> list[Any]:
    from onnxscript.rewriter import RewriteRule

    def add(op: Any, x: Any, c: Any) -> Any:
        return op.Add(x, c)

    def sub(op: Any, x: Any, c: Any) -> Any:
        return op.Sub(x, c)

    def mul(op: Any, x: Any, c: Any) -> Any:
        return op.Mul(x, c)

    def div(op: Any, x: Any, c: Any) -> Any:
        return op.Div(x, c)

    def identity(op: Any, x: Any, **_: Any) -> Any:
        return op.Identity(x)

    def is_(value: float) -> Any:
        def check(context: Any, x: Any, c: Any, **_: Any) -> bool:
            const = c.const_value
            if const is None:
                return False
            array = const.numpy()
            return array.ndim == 0 and array.item() == value

        return check

    zero, one = is_(0.0), is_(1.0)
    return [
        *RewriteRule(add, identity, zero).commute(),
        RewriteRule(sub, identity, zero),
        *RewriteRule(mul, identity, one).commute(),
        RewriteRule(div, identity, one),
    ]


def _drop_provenance(model: onnx.ModelProto) -> None:
    """Remove the optimizer's bookkeeping metadata ('pkg.onnxscript.*'), which a second run
    would rewrite: without it, simplifying twice gives the same model as simplifying once."""
    from edgeflow.core.onnxgraph import all_graphs

    for graph in all_graphs(model.graph):
        items = [*graph.initializer, *graph.value_info, *graph.input, *graph.output, *graph.node]
        for item in items:
            kept = [p for p in item.metadata_props if not p.key.startswith("pkg.onnxscript.")]
            if len(kept) != len(item.metadata_props):
                del item.metadata_props[:]
                item.metadata_props.extend(kept)
