"""onnx.fix_shapes: pin the input shapes, infer the rest and fold shape arithmetic away."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import PositiveInt

from edgeflow.core.errors import EdgeflowError
from edgeflow.core.onnxgraph import copy_model, name_hint, same_graph
from edgeflow.rules.base import OnnxRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.fixes import Fix

if TYPE_CHECKING:
    import onnx


class FixShapes(OnnxRule):
    name = "onnx.fix_shapes"
    description = "Fix input shapes (default: the recipe's), infer all shapes, fold Shape ops."
    fixes = (Fix.finding("inputs"), Fix.finding("memory"))

    class Options(RuleOptions):
        """shapes: input name -> dims (default: the recipe's source.inputs shapes);
        fold: fold the now-constant shape computations with onnxscript's optimizer."""

        shapes: dict[str, list[PositiveInt]] | None = None
        fold: bool = True

    example: ClassVar[tuple[str, str] | None] = (
        "x[batch,3,8,8] -> Shape -> Gather(0) -> Concat -> Reshape(x, .) -> y[batch,144]",
        "x[1,3,8,8] -> Reshape(x, [1, 144]) -> y[1,144]",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 1e-4 if opts.fold else 0.0  # folding may fold BatchNorm-like arithmetic too

    def apply(
        self, model: onnx.ModelProto, opts: Options, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        import onnx

        from edgeflow.rules.onnx.optimize import op_sites
        from edgeflow.rules.onnx.simplify import simplify

        wanted = opts.shapes if opts.shapes is not None else {s.name: s.shape for s in ctx.inputs}
        if not wanted:
            nothing = Site.not_applicable("no input shapes given or declared")
            return RuleResult(copy_model(model), sites=[nothing])
        out = copy_model(model)
        sites = _pin_inputs(out, wanted)
        del out.graph.value_info[:]  # stale: inferred again below from the fixed inputs
        # the outputs' declared shapes too: an exporter may declare a wrong one (ddddocr's
        # CRNN: [1, seqlen] for a [steps, 1, classes] output), which inference cannot match
        declared = {}
        for value in out.graph.output:
            if value.type.tensor_type.HasField("shape"):
                declared[value.name] = _dims(value)
                value.type.tensor_type.ClearField("shape")
        if opts.fold:
            out = simplify(out)
        try:
            out = onnx.shape_inference.infer_shapes(out, strict_mode=True, data_prop=True)
        except onnx.shape_inference.InferenceError as exc:
            raise EdgeflowError(
                f"shape inference fails with the fixed input shapes: {exc}",
                "check the shapes against what the model accepts",
            ) from exc
        for value in out.graph.output:
            if value.name in declared and not value.type.tensor_type.HasField("shape"):
                _declare(value, declared[value.name])  # nothing inferred: kept as declared
            elif value.name in declared and not _agrees(_dims(value), declared[value.name]):
                sites.append(
                    Site.changed(
                        value.name,
                        f"declared [{', '.join(declared[value.name])}], computes "
                        f"[{', '.join(_dims(value))}]",
                    )
                )
        if same_graph(out, model):
            nothing = Site.not_applicable("shapes already fixed and folded")
            return RuleResult(copy_model(model), sites=[nothing])
        sites += op_sites(model, out)
        if not sites:  # the value types only: inferred again
            sites.append(Site.changed("", "value shapes inferred from the fixed inputs"))
        sites += [Site.kept(name, "dims still unknown") for name in _dynamic_values(out)]
        return RuleResult(out, matches=len(wanted), sites=sites)


def _agrees(inferred: list[str], declared: list[str]) -> bool:
    """Whether a declared shape allows the inferred one (a named or unknown dim allows any)."""
    return len(inferred) == len(declared) and all(
        d == i or not d.isdigit() for i, d in zip(inferred, declared, strict=True)
    )


def _declare(value: Any, dims: list[str]) -> None:
    shape = value.type.tensor_type.shape
    for d in dims:
        dim = shape.dim.add()
        if d.isdigit():
            dim.dim_value = int(d)
        elif d != "?":
            dim.dim_param = d


def _dims(value: Any) -> list[str]:
    shape = value.type.tensor_type.shape
    return [str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?" for d in shape.dim]


def _pin_inputs(model: onnx.ModelProto, wanted: dict[str, list[int]]) -> list[Site]:
    """Set the graph inputs' dims in place; an unknown name or a clashing dim is an error."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    inputs = {v.name: v for v in graph.input if v.name not in initializers}
    pinned = []
    for name, dims in wanted.items():
        if name not in inputs:
            raise EdgeflowError(
                f"the model has no input '{name}'", name_hint(name, inputs, "inputs", 20)
            )
        value = inputs[name]
        shape = value.type.tensor_type.shape
        before = _dims(value)
        if value.type.tensor_type.HasField("shape") and len(shape.dim) != len(dims):
            raise EdgeflowError(
                f"input '{name}' has rank {len(shape.dim)} ([{', '.join(before)}]), "
                f"got shape {dims}",
                "give one dim per axis",
            )
        for i, (dim, new) in enumerate(zip(shape.dim, dims, strict=False)):
            if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != new:
                raise EdgeflowError(
                    f"input '{name}' has fixed dim {i} = {dim.dim_value}, got {new}",
                    f"use {dim.dim_value} for axis {i}",
                )
        shape.ClearField("dim")
        for new in dims:
            shape.dim.add().dim_value = new
        if before != [str(d) for d in dims]:
            pinned.append(Site.changed(name, f"input shape [{', '.join(before)}] -> {dims}"))
    return pinned


def _dynamic_values(model: onnx.ModelProto) -> list[str]:
    g = model.graph
    return [
        v.name
        for v in (*g.value_info, *g.output)
        if v.type.WhichOneof("value") == "tensor_type"
        and (
            not v.type.tensor_type.HasField("shape")
            or any(not d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)
        )
    ]
