"""Node-by-node rewriting of a model's main graph, for rules that replace one construct with
an equivalent formulation a runtime takes (onnx.maxpool_edge_pad, onnx.lower_matmul, ...).

Such a rule subclasses NodeRule: it names the op types it visits and writes
`replace(edit, node, opts) -> str | None`, which either emits replacement nodes through `edit`
(ending with the node's outputs) and returns None, or returns why it keeps the node ('' for a
node that is not the construct at all: nothing to report). `rewrite_nodes` runs it over the
graph and makes the RuleResult, a Site per replaced or kept node.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from edgeflow.core.onnxgraph import constant_value, copy_model
from edgeflow.rules.base import OnnxRule, RewriteContext, RuleResult, Site
from edgeflow.rules.onnx._build import Builder

if TYPE_CHECKING:
    import numpy as np
    import onnx


class Edit(Builder):
    """What a replacement may read (static shapes, constants, consumers) besides what it
    emits (a Builder's nodes and initializers)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        import onnx
        from onnx import numpy_helper

        super().__init__(model)
        self.model = model
        self._types: dict[str, Any] | None = None  # tensor_types(model), for `folded`
        self.removed: set[str] = set()  # node outputs whose nodes a replacement took over
        graph = model.graph
        self.constants: dict[str, np.ndarray] = {
            t.name: numpy_helper.to_array(t) for t in graph.initializer
        }
        for node in graph.node:
            if node.op_type == "Constant":
                value = constant_value(node)
                if value is not None:
                    self.constants[node.output[0]] = value
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except onnx.shape_inference.InferenceError:  # advisory: rules then skip the node
            inferred = model
        self.shapes: dict[str, list[int] | None] = {}
        self.ranks: dict[str, int] = {}  # also where some dims are unknown
        self.dtypes: dict[str, int] = {}
        for value in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
            t = value.type.tensor_type
            self.dtypes[value.name] = t.elem_type
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
            static = t.HasField("shape") and all(d >= 0 for d in dims)
            self.shapes[value.name] = dims if static else None
            if t.HasField("shape"):
                self.ranks[value.name] = len(dims)
        for name, array in self.constants.items():
            self.shapes[name] = list(array.shape)
            self.ranks[name] = array.ndim
        for node in graph.node:  # a Reshape to a computed shape of static length k: rank k
            target = self.shapes.get(node.input[1]) if node.op_type == "Reshape" else None
            if target is not None and len(target) == 1 and node.output[0] not in self.ranks:
                self.ranks[node.output[0]] = target[0]
        self.producers = {name: node for node in graph.node for name in node.output}
        self.consumers: dict[str, list[Any]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.graph_outputs = {v.name for v in graph.output}

    def folded(self, name: str) -> np.ndarray | None:
        """A tensor's value where it is a constant or computed from constants only (an
        exporter's weight preparation: Slice, Concat, Unsqueeze of initializers, which
        constant folding leaves when the weights are large or read twice), else None."""
        if name not in self.constants:
            from edgeflow.core.onnxgraph import tensor_types
            from edgeflow.rules.onnx.fold_if import evaluate_constant

            if self._types is None:  # shape inference once per edit, on the first call
                self._types = tensor_types(self.model)
            value = evaluate_constant(self.model, name, self.constants, self._types)
            if value is None:
                return None
            self.constants[name] = value
            self.shapes[name] = list(value.shape)
        return self.constants[name]

    def shape(self, name: str) -> list[int] | None:
        """The tensor's static shape, None when shape inference does not know every dim."""
        return self.shapes.get(name)

    def rank(self, name: str) -> int | None:
        """The tensor's rank where shape inference knows it, static or not."""
        return self.ranks.get(name)

    def only_consumer(self, name: str) -> Any | None:
        """The single node reading a tensor that is not a graph output, else None."""
        readers = self.consumers.get(name, [])
        if len(readers) != 1 or name in self.graph_outputs:
            return None
        return readers[0]

    def scalar(self, value: float, like: str) -> str:
        """A scalar of the element type of tensor `like`."""
        import numpy as np
        from onnx import helper

        np_type = helper.tensor_dtype_to_np_dtype(self.dtypes.get(like) or 1)
        return self.array(np.array(value, np_type), "scalar")


class NodeRule(OnnxRule):
    """An onnx rule that offers every main-graph node of `op_types` to `replace`."""

    op_types: ClassVar[frozenset[str]]  # default-domain op types the rule visits
    what: ClassVar[str]  # a match, as its outcomes name it ('padded MaxPool')

    @abstractmethod
    def replace(self, edit: Edit, node: Any, opts: Any) -> str | None:
        """Emit the node's replacement through `edit` and return None, or say why it is kept
        ('' when the node is not the construct at all)."""

    def apply(
        self, model: onnx.ModelProto, opts: Any, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        def replace(node: Any, edit: Edit) -> str | None:
            return self.replace(edit, node, opts)

        return rewrite_nodes(model, set(self.op_types), replace, self.what)


Replace = Callable[[Any, Edit], "str | None"]


def rewrite_nodes(
    model: onnx.ModelProto, op_types: set[str], replace: Replace, what: str
) -> RuleResult[onnx.ModelProto]:
    """Offer every main-graph node of `op_types` (default domain) to `replace`; a replaced
    node's nodes go where it was. `what` names a match in the sites' messages."""
    out = copy_model(model)
    edit = Edit(out)
    nodes: list[Any] = []
    sites: list[Site] = []
    for node in out.graph.node:
        if node.output and node.output[0] in edit.removed:
            continue
        if node.op_type not in op_types or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        edit.nodes, edit.prefix = [], node.name or node.output[0]
        why = replace(node, edit)
        if why is not None:  # kept; '' when the node is not the construct at all
            if why:
                sites.append(Site.kept(edit.prefix, why))
            nodes.append(node)
            continue
        sites.append(Site.changed(edit.prefix, f"{what} rewritten"))
        nodes.extend(edit.nodes)
    result = RuleResult(out, sites=sites)
    if not result.changed:
        return RuleResult(copy_model(model), sites=sites or [Site.not_applicable(f"no {what}")])
    # original nodes a replacement took over that came before it (a Reshape feeding it)
    originals = {id(n) for n in out.graph.node}
    nodes = [
        n
        for n in nodes
        if id(n) not in originals or not (n.output and all(o in edit.removed for o in n.output))
    ]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(edit.initializers)
    _drop_unread_initializers(out, set().union(*(_reads(n) for n in nodes)))
    _drop_stale_value_info(out)
    return result


def _reads(node: Any) -> set[str]:
    from edgeflow.core.onnxgraph import node_reads

    return set(node_reads(node))


def _drop_unread_initializers(model: onnx.ModelProto, read: set[str]) -> None:
    """Forget the weights of replaced nodes (the replacement made its own copies)."""
    keep = read | {v.name for v in (*model.graph.output, *model.graph.input)}
    kept = [t for t in model.graph.initializer if t.name in keep]
    if len(kept) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)


def _drop_stale_value_info(model: onnx.ModelProto) -> None:
    """Forget value_info of tensors no node produces any more (a later shape inference
    recomputes the rest)."""
    produced = {name for node in model.graph.node for name in node.output}
    kept = [v for v in model.graph.value_info if v.name in produced]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
