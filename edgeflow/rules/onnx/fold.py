"""onnx.fold_constants: compute the nodes whose inputs are all constants, and keep their
values instead (ConstantOfShape included, which onnxscript's optimizer leaves)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from edgeflow.core.onnxgraph import copy_model
from edgeflow.rules.base import OnnxRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.fixes import Fix

if TYPE_CHECKING:
    import onnx

# Never folded: ops whose value is not a function of their inputs, and quantization ops,
# whose scales on a constant weight are what a converter reads (a QAT model's Q/DQ pairs).
KEPT = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli"}
)
KEPT |= {"Multinomial", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}


class FoldConstants(OnnxRule):
    """Exact: each node is computed once by onnx's reference evaluator, on the same constant
    inputs the runtime would read. TorchScript's export of `F.pad` on a 2-D tensor (an audio
    front end: reflect padding before a Conv1d STFT) computes the pads with ConstantOfShape,
    Concat, Reshape, Slice, Transpose and Cast on int64 constants, which onnxscript's
    optimizer does not fold: the Pad's output, and every shape after it, stays unknown, and
    onnx2tf 1.28.8 then takes the Conv1d's NCW input for NWC (Conv2D input [1, 1, 1, 640]:
    "Depth of output (258) is not a multiple of the number of groups (640)" in
    tf.nn.convolution). Folded, the pads are a constant, every shape is static and the
    Conv1d converts (float32 relative error 1.2e-7 in LiteRT). Nodes with subgraphs, random
    and quantization ops (QuantizeLinear, DequantizeLinear), other domains and outputs above
    `max_elements` stay. A default rewrite of tflite,
    tflite_micro and armnn."""

    name = "onnx.fold_constants"
    description = "Compute the nodes whose inputs are all constants and keep their values."
    fixes = (Fix.op("ConstantOfShape"), Fix.finding("int64"))

    class Options(RuleOptions):
        """max_elements: the largest output (in elements) stored as a constant."""

        max_elements: int = Field(1 << 18, ge=1)  # onnxscript's output limit

    example: ClassVar[tuple[str, str] | None] = (
        "p = Cast(Reshape(Transpose(Slice(Reshape(Concat(c, ConstantOfShape(n)))))));"
        " y = Pad(x, p, mode=reflect)",
        "y = Pad(x, [0, 0, 0, 64], mode=reflect)",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 0.0

    def apply(
        self, model: onnx.ModelProto, opts: Options, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        out = copy_model(model)
        sites = fold(out, opts.max_elements)
        if not any(s.status.value == "changed" for s in sites):
            return RuleResult(copy_model(model), sites=sites or [Site.not_applicable("")])
        return RuleResult(out, sites=sites)


def fold(model: onnx.ModelProto, max_elements: int) -> list[Site]:
    """Fold the main graph's constant nodes in place; a site per folded (or kept) node."""
    import numpy as np
    from onnx import numpy_helper

    from edgeflow.core.onnxgraph import constant_value, node_reads

    graph = model.graph
    inputs = {i.name for i in graph.input}
    values: dict[str, np.ndarray] = {
        t.name: numpy_helper.to_array(t) for t in graph.initializer if t.name not in inputs
    }
    outputs = {o.name for o in graph.output}
    opsets = {o.domain or "": o.version for o in model.opset_import}
    sites: list[Site] = []
    kept_nodes, folded = [], []
    for i, node in enumerate(graph.node):
        name = node.name or node.output[0] or f"#{i}"
        if node.op_type == "Constant":
            value = constant_value(node)
            if value is not None:
                values[node.output[0]] = value
            kept_nodes.append(node)
            continue
        foldable = (
            node.domain in ("", "ai.onnx")
            and node.op_type not in KEPT
            and not any(a.g.node or a.graphs for a in node.attribute)
            and all(n in values for n in node.input if n)
            and not any(o in outputs for o in node.output)
        )
        if not foldable:
            kept_nodes.append(node)
            continue
        results = _evaluate(node, values, opsets.get("", 0))
        if results is None:  # SequenceEmpty, SequenceConstruct, Optional: no tensor to store
            sites.append(Site.kept(name, f"{node.op_type} makes a sequence or optional"))
            kept_nodes.append(node)
            continue
        too_big = [r.size for r in results if r.size > max_elements]
        if too_big:
            sites.append(Site.kept(name, f"{max(too_big)} elements (max_elements {max_elements})"))
            kept_nodes.append(node)
            continue
        named = [o for o in node.output if o]
        values.update(zip(named, results, strict=True))
        folded.append(node)
        shapes = ", ".join(str(list(r.shape)) for r in results)
        sites.append(Site.changed(name, f"{node.op_type} folded to a constant {shapes}"))
    if not folded:
        return sites
    read = {n for node in kept_nodes for n in node_reads(node)} | outputs
    produced = {o for node in folded for o in node.output}
    nodes = [n for n in kept_nodes if n.op_type != "Constant" or n.output[0] in read]
    del graph.node[:]
    graph.node.extend(nodes)
    initial = [t for t in graph.initializer if t.name in read or t.name in inputs]
    del graph.initializer[:]
    graph.initializer.extend(initial)
    for name in sorted(produced & read):
        graph.initializer.append(numpy_helper.from_array(values[name], name))
    stale = [v for v in graph.value_info if v.name not in produced]
    del graph.value_info[:]
    graph.value_info.extend(stale)
    return sites


def _evaluate(node: Any, values: dict[str, Any], opset: int) -> list[Any] | None:
    """The node's outputs on its constant inputs, by onnx's reference evaluator; None where
    one is not a tensor (a sequence: an initializer cannot hold it)."""
    import numpy as np
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    feeds = {n: values[n] for n in node.input if n}
    graph = helper.make_graph(
        [node],
        "fold",
        [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for n, v in feeds.items()
        ],
        [helper.make_empty_tensor_value_info(o) for o in node.output if o],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    results = ReferenceEvaluator(model).run(None, feeds)
    if not all(isinstance(r, np.ndarray | np.generic) for r in results):
        return None
    return [np.asarray(r) for r in results]


def fold_shapes(model: onnx.ModelProto) -> list[Site]:
    """Make the Shape (and Size) of each main-graph tensor whose shape shape inference knows
    in full a constant, in place: what onnxscript's optimizer does, ahead of `fold`, so that
    what is computed from static shapes folds too. A site per folded node."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    graph = model.graph
    outputs = {o.name for o in graph.output}
    wanted = [
        i
        for i, n in enumerate(graph.node)
        if n.op_type in ("Shape", "Size") and n.domain in ("", "ai.onnx")
        if n.output[0] not in outputs
    ]
    if not wanted:
        return []
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # onnx's inference errors are not one type: nothing is known then
        return []
    shapes: dict[str, list[int]] = {}
    for value in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [d.dim_value for d in dims]
    for t in graph.initializer:
        shapes[t.name] = list(t.dims)
    sites: list[Site] = []
    folded = set()
    for i in wanted:
        node = graph.node[i]
        dims = shapes.get(node.input[0])
        if dims is None:
            continue
        if node.op_type == "Size":
            value = np.array(int(np.prod(dims)), np.int64)
        else:
            attrs = {a.name: a.i for a in node.attribute}
            start, end = attrs.get("start", 0), attrs.get("end", len(dims))
            value = np.array(dims[slice(start, end)], np.int64)
        graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        folded.add(i)
        sites.append(Site.changed(node.name or node.output[0], f"{node.op_type} of a static shape"))
    kept = [n for i, n in enumerate(graph.node) if i not in folded]
    del graph.node[:]
    graph.node.extend(kept)
    return sites
