"""onnx.fold_if: replace an If whose condition is a constant by the branch it always takes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from edgeflow.core.onnxgraph import (
    Namer,
    all_graphs,
    constant_value,
    copy_model,
    node_reads,
    rename_values,
    subgraphs,
    tensor_types,
)
from edgeflow.rules.base import OnnxRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.fixes import Fix

if TYPE_CHECKING:
    import onnx

MAX_EVAL_NODES = 64  # a condition computed by more nodes than this is not evaluated
NON_DETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike"}


class FoldIf(OnnxRule):
    name = "onnx.fold_if"
    description = "Inline the taken branch of every If whose condition is a constant."
    fixes = (Fix.op("If"),)

    class Options(RuleOptions):
        """evaluate: also evaluate conditions computed from constants and static shapes
        (e.g. Equal(Gather(Shape(x), 0), 1) with x's shape fixed), not just constant ones."""

        evaluate: bool = True

    example: ClassVar[tuple[str, str] | None] = (
        "c = Equal(Shape(x)[0], 1); y = If(c, then: Reshape(x, [1, -1]), else: Flatten(x))",
        "y = Reshape(x, [1, -1])   (x has a fixed batch of 1)",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 0.0  # the taken branch computes exactly what the If did

    def apply(
        self, model: onnx.ModelProto, opts: Options, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        out = copy_model(model)
        sites: list[Site] = []
        while True:
            found = _find_constant_if(out, opts.evaluate, sites)
            if found is None:
                break
            graph, index, taken = found
            node = graph.node[index]
            where = node.name or node.output[0]
            sites.append(Site.changed(where, f"condition is {taken}, inlined"))
            _inline(out, graph, index, "then_branch" if taken else "else_branch")
        folded = RuleResult(out, sites=sites)
        if not folded.changed:
            nothing = Site.not_applicable("no If nodes")
            return RuleResult(copy_model(model), sites=sites or [nothing])
        removed = _remove_dead_code(out)
        if removed:
            sites.append(Site.changed("", f"removed {removed} nodes left unused (conditions)"))
        return RuleResult(out, matches=folded.matches, sites=sites)


def _find_constant_if(
    model: onnx.ModelProto, evaluate: bool, sites: list[Site]
) -> tuple[Any, int, bool] | None:
    """The first If with a constant condition as (graph, node index, value); others noted."""
    values = _constants(model)
    types: dict[str, Any] | None = None
    for position, graph in enumerate(all_graphs(model.graph)):
        for index, node in enumerate(graph.node):
            if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
                continue
            cond = node.input[0]
            value = values.get(cond)
            # Conditions inside subgraphs are folded only when plainly constant.
            if value is None and evaluate and position == 0:
                types = types if types is not None else tensor_types(model)
                value = evaluate_constant(model, cond, values, types)
            if value is None or value.size != 1:
                why = "is not constant" if value is None else f"has {value.size} elements"
                kept = Site.kept(node.name or node.output[0], f"condition '{cond}' {why}")
                if kept not in sites:
                    sites.append(kept)
                continue
            return graph, index, bool(value.reshape(()))
    return None


def _constants(model: onnx.ModelProto) -> dict[str, Any]:
    """Values known without running the model: initializers (not overridable) and Constants."""
    from onnx import numpy_helper

    inputs = {v.name for v in model.graph.input}
    values: dict[str, Any] = {}
    for graph in all_graphs(model.graph):
        for t in graph.initializer:
            if t.name not in inputs:
                values[t.name] = numpy_helper.to_array(t)
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                values[node.output[0]] = constant_value(node)
    return {k: v for k, v in values.items() if v is not None}


def evaluate_constant(model: onnx.ModelProto, name: str, values: dict[str, Any], types: Any) -> Any:
    """A main-graph value computed only from constants (`values`) and static shapes, or None
    (onnx's reference runtime evaluates the nodes it needs, at most MAX_EVAL_NODES)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    producers = {o: n for n in model.graph.node for o in n.output}
    needed: list[Any] = []
    feeds: dict[str, Any] = {}
    stack, seen = [name], set()
    while stack:
        current = stack.pop()
        if current in seen or current in values:
            continue
        seen.add(current)
        node = producers.get(current)
        if node is None or node.op_type in NON_DETERMINISTIC or any(subgraphs(node)):
            return None
        if node.op_type == "Shape" and node.domain in ("", "ai.onnx"):
            dims = _static_dims(types.get(node.input[0]))
            if dims is None or node.attribute:  # start/end attributes: leave to the evaluator
                return None
            feeds[current] = np.array(dims, np.int64)
            continue
        needed.append(node)
        if len(needed) > MAX_EVAL_NODES or node.domain not in ("", "ai.onnx"):
            return None
        stack.extend(n for n in node.input if n)
    order = {id_: i for i, id_ in enumerate(n.output[0] for n in model.graph.node)}
    needed.sort(key=lambda n: order[n.output[0]])
    used = {n for node in needed for n in node.input if n in values}
    initializers = [numpy_helper.from_array(np.asarray(values[n]), n) for n in sorted(used)]
    initializers += [numpy_helper.from_array(v, k) for k, v in feeds.items()]
    graph = helper.make_graph(
        needed,
        "cond",
        [],
        [helper.make_tensor_value_info(name, TensorProto.BOOL, None)],
        initializers,
    )
    probe = helper.make_model(graph, opset_imports=list(model.opset_import))
    try:
        results: Any = ReferenceEvaluator(probe).run(None, {})
    except Exception:  # the reference runtime lacks an op: the condition stays unknown
        return None
    return np.asarray(results[0])


def _static_dims(type_proto: Any) -> list[int] | None:
    if type_proto is None or type_proto.WhichOneof("value") != "tensor_type":
        return None
    t = type_proto.tensor_type
    if not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
        return None
    return [d.dim_value for d in t.shape.dim]


def _inline(model: onnx.ModelProto, graph: Any, index: int, branch_name: str) -> None:
    """Replace graph.node[index] (an If) by the nodes of one of its branches."""
    import onnx
    from onnx import helper

    node = graph.node[index]
    branch = onnx.GraphProto()
    branch.CopyFrom(next(a.g for a in node.attribute if a.name == branch_name))
    outputs = list(node.output)
    del graph.node[index]
    namer = Namer(model)  # names outside the branch, now that the If is gone
    defined = _defined_names(branch)
    clashes = sorted(n for n in defined if n in namer.taken)
    namer.taken |= defined
    rename_values(branch, {n: namer(n) for n in clashes})
    produced = {o for n in branch.node for o in n.output}
    renames: dict[str, str] = {}
    identities = []
    for formal, actual in zip(branch.output, outputs, strict=False):
        if not actual:
            continue
        if formal.name in produced and formal.name not in renames:
            renames[formal.name] = actual
        else:  # an outer value, a branch initializer, or a value returned twice
            source = renames.get(formal.name, formal.name)
            identities.append(helper.make_node("Identity", [source], [actual], namer(actual)))
    rename_values(branch, renames)
    nodes = [*graph.node[:index], *branch.node, *identities, *graph.node[index:]]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(branch.initializer)
    graph.value_info.extend(v for v in branch.value_info if v.name not in outputs)


def _defined_names(graph: Any) -> set[str]:
    """Names a graph and its subgraphs define (node outputs, initializers, subgraph inputs)."""
    names: set[str] = set()
    for depth, g in enumerate(all_graphs(graph)):
        names.update(t.name for t in g.initializer)
        names.update(o for n in g.node for o in n.output if o)
        if depth > 0:
            names.update(v.name for v in g.input)
    return names


def _remove_dead_code(model: onnx.ModelProto) -> int:
    """Drop nodes and initializers nothing reads any more, in every graph; how many nodes."""
    removed = 0
    graphs = list(enumerate(all_graphs(model.graph)))
    for position, graph in reversed(graphs):  # innermost first: rebuilding copies subgraphs
        while True:
            read = {v.name for v in graph.output}
            for node in graph.node:
                read.update(node_reads(node))
            keep = [n for n in graph.node if any(o in read for o in n.output if o)]
            if len(keep) == len(graph.node):
                break
            removed += len(graph.node) - len(keep)
            del graph.node[:]
            graph.node.extend(keep)
        if position > 0:
            continue  # subgraph initializers: left as they are
        used = read | {v.name for v in graph.input}
        kept_inits = [t for t in graph.initializer if t.name in used]
        if len(kept_inits) != len(graph.initializer):
            del graph.initializer[:]
            graph.initializer.extend(kept_inits)
    return removed
