"""onnx.cut: keep the graph up to chosen tensors, which become its outputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from edgeflow.core.errors import EdgeflowError
from edgeflow.core.onnxgraph import copy_model, name_hint, node_reads, tensor_types
from edgeflow.rules.base import OnnxRule, RewriteContext, RuleOptions, RuleResult, Site

if TYPE_CHECKING:
    import onnx


class Cut(OnnxRule):
    name = "onnx.cut"
    description = "Cut the graph at named tensors: they become the outputs, later nodes go."

    class Options(RuleOptions):
        """outputs: tensor names that become the graph's outputs, in order;
        prune_inputs: also drop graph inputs the kept nodes do not read (the recipe's
        source.inputs must then name only the remaining ones)."""

        outputs: list[str] = Field(min_length=1)
        prune_inputs: bool = False

    example: ClassVar[tuple[str, str] | None] = (
        "x -> Conv -> Relu(feat) -> Flatten -> Gemm -> Softmax -> y; outputs: [feat]",
        "x -> Conv -> Relu -> feat",
    )

    def tolerance(self, opts: Any) -> float | None:
        return None  # the outputs themselves change: compare against a model cut the same way

    def apply(
        self, model: onnx.ModelProto, opts: Options, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        graph = model.graph
        already = Site.not_applicable("the outputs are already these")
        if [v.name for v in graph.output] == opts.outputs and not opts.prune_inputs:
            return RuleResult(copy_model(model), sites=[already])
        initializers = {t.name for t in graph.initializer}
        available = [v.name for v in graph.input if v.name not in initializers]
        available += [o for n in graph.node for o in n.output if o]
        for name in opts.outputs:
            if name not in available:
                raise EdgeflowError(
                    f"the model has no tensor '{name}'", name_hint(name, available, "tensors", 16)
                )
        keep = needed_nodes(graph, opts.outputs)
        out = copy_model(model)
        g = out.graph
        types = tensor_types(model)
        outputs = [_output_info(name, types) for name in opts.outputs]
        nodes = [n for i, n in enumerate(g.node) if i in keep]
        read = {r for n in nodes for r in node_reads(n)} | set(opts.outputs)
        del g.node[:]
        g.node.extend(nodes)
        del g.output[:]
        g.output.extend(outputs)
        kept_inits = [t for t in g.initializer if t.name in read]
        del g.initializer[:]
        g.initializer.extend(kept_inits)
        defined = read | {o for n in nodes for o in n.output}
        kept_info = [v for v in g.value_info if v.name in defined and v.name not in opts.outputs]
        del g.value_info[:]
        g.value_info.extend(kept_info)
        cut = f"outputs {[v.name for v in graph.output]} -> {opts.outputs}"
        sites = [Site.changed("", f"{cut}; nodes {len(graph.node)} -> {len(nodes)}")]
        if opts.prune_inputs:
            dropped = [v.name for v in g.input if v.name not in read]
            kept_inputs = [v for v in g.input if v.name in read]
            del g.input[:]
            g.input.extend(kept_inputs)
            sites += [Site.changed(name, "input dropped: no node reads it") for name in dropped]
        from edgeflow.core.onnxgraph import same_graph

        if same_graph(out, model):
            return RuleResult(copy_model(model), sites=[already])
        return RuleResult(out, matches=len(graph.node) - len(nodes), sites=sites)


def needed_nodes(
    graph: onnx.GraphProto, outputs: list[str], stop: frozenset[str] = frozenset()
) -> set[int]:
    """Indices of the nodes the outputs depend on (subgraph outer references included),
    not looking past the tensors in `stop`."""
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    keep: set[int] = set()
    stack = list(outputs)
    while stack:
        name = stack.pop()
        if name in stop:
            continue
        index = producer.get(name)
        if index is None or index in keep:
            continue
        keep.add(index)
        stack.extend(node_reads(graph.node[index]))
    return keep


def _output_info(name: str, types: dict[str, Any]) -> onnx.ValueInfoProto:
    """A graph output with the tensor's inferred type; its rank must be known."""
    import onnx

    type_proto: Any = types.get(name)
    known = type_proto is not None and type_proto.WhichOneof("value") == "tensor_type"
    if not known or not type_proto.tensor_type.HasField("shape"):
        raise EdgeflowError(
            f"cannot infer the type and rank of tensor '{name}', which an output needs",
            "run onnx.fix_shapes before onnx.cut so shape inference reaches it",
        )
    info = onnx.ValueInfoProto(name=name)
    info.type.CopyFrom(type_proto)
    return info
