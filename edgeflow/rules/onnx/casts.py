"""onnx.cast_float64_to_float32 and onnx.int64_to_int32: narrow types edge runtimes lack."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from edgeflow.core.onnxgraph import Namer, all_graphs, copy_model
from edgeflow.rules.base import OnnxRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.fixes import Fix

if TYPE_CHECKING:
    import onnx

FLOAT, DOUBLE, INT64, INT32 = 1, 11, 7, 6  # onnx.TensorProto enum values
# Attributes that name an element type, on the standard ops that have them.
DTYPE_ATTRS = {
    "Cast": "to",
    "EyeLike": "dtype",
    "RandomNormal": "dtype",
    "RandomNormalLike": "dtype",
    "RandomUniform": "dtype",
    "RandomUniformLike": "dtype",
    "Bernoulli": "dtype",
    "Multinomial": "dtype",
}


def retype(type_proto: onnx.TypeProto, old: int, new: int) -> int:
    """Change element type `old` to `new` in a (possibly nested) type; how many changed."""
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        inner = getattr(type_proto, kind)
        if inner.elem_type == old:
            inner.elem_type = new
            return 1
        return 0
    if kind in ("sequence_type", "optional_type"):
        return retype(getattr(type_proto, kind).elem_type, old, new)
    if kind == "map_type":
        return retype(type_proto.map_type.value_type, old, new)
    return 0


def rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Make every node of a graph (and its subgraphs, unless they define `old`) read `new`."""
    from edgeflow.core.onnxgraph import subgraphs

    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for sub in subgraphs(node):
            defined = {v.name for v in sub.input} | {t.name for t in sub.initializer}
            defined |= {o for n in sub.node for o in n.output}
            if old not in defined:
                rename_uses(sub, old, new)
                for out in sub.output:
                    if out.name == old:
                        out.name = new


class CastFloat64ToFloat32(OnnxRule):
    name = "onnx.cast_float64_to_float32"
    description = "Turn float64 weights, constants, casts and values into float32."
    fixes = (Fix.finding("float64"),)

    class Options(RuleOptions):
        """io: what happens to float64 graph inputs/outputs. auto: inputs the recipe declares
        float64 stay float64 with a Cast after them, everything else becomes float32;
        float32: all become float32; keep: all stay float64, with Casts at the boundary."""

        io: Literal["auto", "float32", "keep"] = "auto"

    example: ClassVar[tuple[str, str] | None] = (
        "x:f64 -> MatMul(W:f64) -> Cast(to=DOUBLE) -> y:f64",
        "x:f32 -> MatMul(W:f32) -> Cast(to=FLOAT) -> y:f32",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 1e-4  # float32 rounding of float64 math, for outputs of order 1

    def apply(
        self, model: onnx.ModelProto, opts: Options, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        import numpy as np
        from onnx import numpy_helper

        out = copy_model(model)
        counts = {"initializers": 0, "constants": 0, "type attributes": 0, "value types": 0}
        overflow: list[Site] = []

        def narrow(tensor: onnx.TensorProto, where: str) -> None:
            wide = numpy_helper.to_array(tensor)
            with np.errstate(over="ignore"):
                narrow_ = wide.astype(np.float32)
            lost = int(np.sum(np.isinf(narrow_) & np.isfinite(wide)))
            if lost:
                overflow.append(Site.changed(where, f"{lost} values overflow float32 (inf)"))
            tensor.CopyFrom(numpy_helper.from_array(narrow_, tensor.name))

        kept_outputs = {v.name for v in out.graph.output if _is_double(v.type)}
        kept_outputs = kept_outputs if opts.io == "keep" else set()

        def convert_nodes(nodes: Any) -> None:
            for node in nodes:
                if _casts_to(node, DOUBLE) & kept_outputs:
                    continue  # the Cast that keeps a float64 output float64
                for attr in node.attribute:
                    if attr.type == attr.TENSOR and attr.t.data_type == DOUBLE:
                        narrow(attr.t, node.name or node.output[0])
                        counts["constants"] += 1
                    elif attr.type == attr.TENSORS:
                        for t in attr.tensors:
                            if t.data_type == DOUBLE:
                                narrow(t, node.name or node.output[0])
                                counts["constants"] += 1
                    elif (
                        node.domain in ("", "ai.onnx")
                        and DTYPE_ATTRS.get(node.op_type) == attr.name
                        and attr.i == DOUBLE
                    ):
                        attr.i = FLOAT
                        counts["type attributes"] += 1

        for depth, graph in enumerate(all_graphs(out.graph)):
            for init in graph.initializer:
                if init.data_type == DOUBLE:
                    narrow(init, init.name)
                    counts["initializers"] += 1
            convert_nodes(graph.node)
            for value in graph.value_info:
                counts["value types"] += retype(value.type, DOUBLE, FLOAT)
            if depth > 0:  # the main graph's interface is handled by _interface
                for value in (*graph.input, *graph.output):
                    counts["value types"] += retype(value.type, DOUBLE, FLOAT)
        for function in out.functions:
            convert_nodes(function.node)
        kept = self._interface(out, opts, ctx, counts)
        done = [f"{n} {what}" for what, n in counts.items() if n]
        if not done:
            nothing = Site.not_applicable("no float64 tensors, casts or values")
            return RuleResult(copy_model(model), sites=[nothing])
        narrowed = Site.changed("", "float64 -> float32: " + ", ".join(done))
        sites = [narrowed, *kept, *overflow]
        return RuleResult(out, matches=sum(counts.values()), sites=sites)

    @staticmethod
    def _interface(
        model: onnx.ModelProto, opts: Any, ctx: RewriteContext, counts: dict[str, int]
    ) -> list[Site]:
        """Retype the main graph's inputs/outputs, or keep them float64 behind a Cast."""
        from onnx import helper

        graph = model.graph
        declared = {s.name for s in ctx.inputs if s.dtype == "float64"}
        initializers = {t.name for t in graph.initializer}
        namer = Namer(model)

        def fresh(base: str) -> str:
            return namer(f"{base}_f32")

        kept: list[Site] = []
        head, tail = [], []
        for value in graph.input:
            if not _is_double(value.type):
                continue
            keep = opts.io == "keep" or (opts.io == "auto" and value.name in declared)
            keep = keep and value.name not in initializers  # a weight exposed as an input
            if not keep:
                counts["value types"] += retype(value.type, DOUBLE, FLOAT)
                continue
            readers = [n for n in graph.node if value.name in n.input]
            if all(_casts_to(n, FLOAT) for n in readers):
                continue  # already behind a Cast
            inner = fresh(value.name)
            rename_uses(graph, value.name, inner)
            head.append(helper.make_node("Cast", [value.name], [inner], to=FLOAT, name=inner))
            counts["value types"] += 1
            why = f"input stays float64 (io: {opts.io}); Cast after it"
            kept.append(Site.kept(value.name, why))
        inputs = {v.name for v in graph.input}
        produced_by_cast = {o for n in graph.node for o in _casts_to(n, DOUBLE)}
        for value in graph.output:
            if not _is_double(value.type) or value.name in produced_by_cast:
                continue
            if opts.io != "keep" or value.name in inputs:
                counts["value types"] += retype(value.type, DOUBLE, FLOAT)
                continue
            inner = fresh(value.name)
            for node in graph.node:
                node.output[:] = [inner if o == value.name else o for o in node.output]
            rename_uses(graph, value.name, inner)
            for info in graph.value_info:
                if info.name == value.name:
                    info.name = inner
            tail.append(helper.make_node("Cast", [inner], [value.name], to=DOUBLE, name=inner))
            counts["value types"] += 1
            kept.append(Site.kept(value.name, "output stays float64 (io: keep); Cast before it"))
        if head or tail:
            nodes = [*head, *graph.node, *tail]
            del graph.node[:]
            graph.node.extend(nodes)
        return kept


def _casts_to(node: Any, dtype: int) -> set[str]:
    """The outputs of `node` when it is a Cast to `dtype`, else nothing."""
    if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
        return set()
    to = next((a.i for a in node.attribute if a.name == "to"), 0)
    return set(node.output) if to == dtype else set()


def _is_double(type_proto: Any) -> bool:
    kind = type_proto.WhichOneof("value")
    return kind == "tensor_type" and type_proto.tensor_type.elem_type == DOUBLE


class Int64ToInt32(OnnxRule):
    name = "onnx.int64_to_int32"
    description = "Narrow int64 tensors to int32 where the ops allow it and the values fit."
    fixes = (Fix.finding("int64"), Fix.check("Gather", "computed_int32_indices"))
    # token ids are the model's input: the Gather reads int32 ones only if the input narrows
    fix_options: ClassVar[dict[Fix, dict[str, Any]]] = {
        Fix.check("Gather", "computed_int32_indices"): {"io": "int32"}
    }

    class Options(RuleOptions):
        """io: int64 graph inputs/outputs stay int64 ('keep') or become int32 ('int32': the
        caller promises int32-range values); insert_casts: convert computations whose result
        an op needs as int64 (Reshape's shape...) and Cast back before that op."""

        io: Literal["keep", "int32"] = "keep"
        insert_casts: bool = False

    example: ClassVar[tuple[str, str] | None] = (
        "Gather(x, [0, 2]:int64); Reshape(x, [1, -1]:int64); Range(0:int64, 6, 1) -> Sub(5, .)",
        "Gather(x, [0, 2]:int32); Reshape(x, [1, -1]:int64) (kept: Reshape needs int64); "
        "Range(0:int32, 6, 1) -> Sub(5, .)",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 0.0  # only values proven to fit int32 change type

    def apply(
        self, model: onnx.ModelProto, opts: Options, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        from edgeflow.core.onnxgraph import tensor_types
        from edgeflow.rules.onnx._int64 import plan

        out = copy_model(model)
        decided = plan(out, tensor_types(out), opts.io, opts.insert_casts)
        kept = [Site.kept(where, why) for where, why in decided.kept]
        if not decided.values and not decided.constant_uses:
            nothing = Site.not_applicable("no int64 tensors")
            return RuleResult(copy_model(model), sites=kept or [nothing])
        uses = _narrow_constants(out, decided.constant_uses)
        _narrow_values(out, decided.values)
        casts = _insert_casts(out, decided.casts)
        narrowed = Site.changed(
            "",
            f"int64 -> int32: {len(decided.values)} values, {len(decided.constant_uses)} "
            f"constants ({uses} uses)",
        )
        sites = [narrowed, *casts, *kept]
        return RuleResult(out, matches=len(decided.values) + uses, sites=sites)


def _narrow_constants(model: onnx.ModelProto, converted: dict[str, list[tuple[int, int]]]) -> int:
    """int32 constants for the converted uses: in place when every use converts, else a copy."""
    import numpy as np
    from onnx import helper, numpy_helper

    from edgeflow.core.onnxgraph import Namer, outer_references, subgraphs
    from edgeflow.rules.onnx._int64 import HI, LO, int64_constants

    graph = model.graph
    consts = int64_constants(model)
    blocked = {v.name for v in graph.output}
    for node in graph.node:
        for sub in subgraphs(node):
            blocked |= outer_references(sub)
    namer = Namer(model)
    count = 0
    for name, slots in converted.items():
        data = np.clip(consts[name], LO, HI).astype(np.int32)
        total = sum(1 for node in graph.node for n in node.input if n == name)
        count += len(slots)
        if len(slots) == total and name not in blocked:
            for i, init in enumerate(graph.initializer):
                if init.name == name:
                    graph.initializer[i].CopyFrom(numpy_helper.from_array(data, name))
            for node in graph.node:
                if node.op_type == "Constant" and node.output[0] == name:
                    del node.attribute[:]
                    node.attribute.append(
                        helper.make_attribute("value", numpy_helper.from_array(data))
                    )
            for value in graph.value_info:  # exporters may declare initializers' types too
                if value.name == name:
                    retype(value.type, INT64, INT32)
            continue
        copy = namer(f"{name}_int32")
        graph.initializer.append(numpy_helper.from_array(data, copy))
        for node_index, slot in slots:
            graph.node[node_index].input[slot] = copy
    return count


def _narrow_values(model: onnx.ModelProto, values: set[str]) -> None:
    """Retype computed values; Casts and ConstantOfShape that make them now make int32."""
    from onnx import numpy_helper

    graph = model.graph
    for node in graph.node:
        if not set(node.output) & values:
            continue
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == INT64:
                attr.i = INT32
            elif node.op_type == "ConstantOfShape" and attr.name == "value":
                narrowed = numpy_helper.to_array(attr.t).astype("int32")
                attr.t.CopyFrom(numpy_helper.from_array(narrowed))
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.name in values:
            retype(value.type, INT64, INT32)


def _insert_casts(model: onnx.ModelProto, sites: list[tuple[int, int]]) -> list[Site]:
    """A Cast back to int64 before each op input that needs int64 (one per value)."""
    from onnx import helper

    from edgeflow.core.onnxgraph import Namer

    graph = model.graph
    namer = Namer(model)
    made: dict[str, str] = {}
    before: dict[int, list[Any]] = {}
    inserted = []
    for node_index, slot in sorted(sites):
        node = graph.node[node_index]
        source = node.input[slot]
        if source not in made:
            made[source] = namer(f"{source}_int64")
            cast = helper.make_node("Cast", [source], [made[source]], made[source], to=INT64)
            before.setdefault(node_index, []).append(cast)
        node.input[slot] = made[source]
        where = node.name or node.output[0]
        inserted.append(Site.changed(where, f"Cast to int64 before this {node.op_type}"))
    if before:
        nodes = [new for i, n in enumerate(graph.node) for new in (*before.get(i, []), n)]
        del graph.node[:]
        graph.node.extend(nodes)
    return inserted
