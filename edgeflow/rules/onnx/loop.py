"""onnx.unroll_loop: a Loop with a constant trip count as one copy of its body per iteration.

For `for i in range(M)` loops (M a constant; the condition absent, or a constant true that
the body passes through or sets to constant true): copy k of the body reads the iteration
number k as a constant and the loop-carried values copy k-1 produced, and the Loop's outputs
are the last copy's carried values and each scan output's values stacked on a new axis 0
(Concat, Reshape). Exact: the same nodes on the same values. Loops nested in the body are
unrolled in turn, once their copies are in the graph; the sequences the copies build by
appending (TorchScript's `states.append(h)` then `torch.stack(states)`: SequenceEmpty,
SequenceInsert per iteration, ConcatFromSequence) are read as their tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from edgeflow.core.onnxgraph import (
    Namer,
    all_graphs,
    copy_model,
    node_reads,
    opset_version,
    rename_values,
)
from edgeflow.rules.base import OnnxRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.fixes import Fix
from edgeflow.rules.onnx.fold_if import _constants, _defined_names, _remove_dead_code

if TYPE_CHECKING:
    import onnx


class UnrollLoop(OnnxRule):
    """Exact (the body's own nodes, once per iteration: error 0 in onnxruntime). onnx2tf
    1.28.8 has no Loop converter ("No module named 'onnx2tf.ops.Loop'") and the TFLite-family
    profiles list no Loop: a default rewrite of tflite, tflite_micro and armnn, first of their
    rules. The iteration number is a constant in each copy, and what the copy computes from it
    alone (Cast(i), i + 1, a nested Loop's trip count) is folded; scan outputs are stacked as
    Reshape(Concat(values, axis 0), [M, *shape]); a list the copies append to (TorchScript's
    export of `states.append(h)`) becomes a Concat (+ Reshape) of its tensors, SequenceAt of
    a constant index that tensor. Measured end to end: a 5-step tanh recurrence within 2.8e-7
    of onnxruntime on tflite, tflite_micro and armnn; a torchscripted one over a list, 1.8e-7
    on tflite_micro. A main-graph trip count computed from constants and static shapes
    (`range(x.size(1))`) is evaluated (evaluate: true). Keeps (with the reason) a Loop whose
    trip count is not a constant, whose condition input is not a constant true, whose body
    computes its next condition from data (a while loop), or of more than max_iterations
    iterations (the graph grows by a body per iteration)."""

    name = "onnx.unroll_loop"
    description = "Unroll every Loop with a constant trip count into one body copy per iteration."
    fixes = (Fix.op("Loop"),)

    class Options(RuleOptions):
        """max_iterations: the most iterations a Loop may have to be unrolled; evaluate: also
        compute main-graph trip counts from constants and static shapes (x.size(0) with x's
        shape fixed), as onnx.fold_if does for conditions."""

        max_iterations: int = Field(256, ge=1)
        evaluate: bool = True

    example: ClassVar[tuple[str, str] | None] = (
        "s, ys = Loop(5, true, s0, body: s' = s + x; y = s')",
        "s1 = s0 + x; ...; s5 = s4 + x; ys = Reshape(Concat(s1, ..., s5), [5, *shape of s])",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 0.0  # the same nodes compute the same values

    def apply(
        self, model: onnx.ModelProto, opts: Options, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        out = copy_model(model)
        sites: list[Site] = []
        while True:
            found = _find_static_loop(out, opts, sites)
            if found is None:
                break
            graph, index, trips = found
            node = graph.node[index]
            sites.append(Site.changed(node.name or node.output[0], f"{trips} iterations unrolled"))
            _unroll(out, graph, index, trips)
        unrolled = RuleResult(out, sites=sites)
        if not unrolled.changed:
            nothing = Site.not_applicable("no Loop nodes")
            return RuleResult(copy_model(model), sites=sites or [nothing])
        sites += _sequences_to_tensors(out)
        removed = _remove_dead_code(out)
        if removed:
            sites.append(Site.changed("", f"removed {removed} nodes left unused"))
        return RuleResult(out, matches=unrolled.matches, sites=sites)


def _find_static_loop(
    model: onnx.ModelProto, opts: Any, sites: list[Site]
) -> tuple[Any, int, int] | None:
    """The first Loop that can be unrolled as (graph, node index, trip count); the Loops
    that cannot are noted in `sites` (once each)."""
    from edgeflow.core.onnxgraph import tensor_types
    from edgeflow.rules.onnx.fold_if import evaluate_constant

    values = _constants(model)
    types: dict[str, Any] | None = None
    for position, graph in enumerate(all_graphs(model.graph)):
        for node in graph.node if position == 0 and opts.evaluate else ():
            count = node.input[0] if node.op_type == "Loop" and node.input else ""
            if count and count not in values:  # computed: from static shapes, perhaps
                types = types if types is not None else tensor_types(model)
                value = evaluate_constant(model, count, values, types)
                if value is not None:
                    values[count] = value
        for index, node in enumerate(graph.node):
            if node.op_type != "Loop" or node.domain not in ("", "ai.onnx"):
                continue
            trips, why = _trip_count(node, values, opts.max_iterations)
            if why:
                kept = Site.kept(node.name or node.output[0], why)
                if kept not in sites:
                    sites.append(kept)
                continue
            return graph, index, trips
    return None


def _trip_count(node: Any, values: dict[str, Any], max_iterations: int) -> tuple[int, str]:
    """The Loop's iteration count, or why it is not a static count ('' when it is)."""
    m = node.input[0] if node.input else ""
    if not m:
        return 0, "no trip count (a while loop)"
    value = values.get(m)
    if value is None or value.size != 1:
        return 0, f"trip count '{m}' is not a constant"
    trips = int(value.reshape(()))
    cond = node.input[1] if len(node.input) > 1 else ""
    if cond:
        flag = values.get(cond)
        if flag is None or flag.size != 1:
            return 0, f"condition '{cond}' is not a constant"
        if not bool(flag.reshape(())):
            return 0, "condition is false: the body never runs"
    # with no condition input the spec ignores the body's condition; runtimes need not
    if not _stays_true(_body(node), values):
        return 0, "the body computes its next condition from data (a while loop)"
    if trips <= 0:
        return 0, f"trip count is {trips}: the body never runs"
    if trips > max_iterations:
        return 0, f"{trips} iterations, more than max_iterations ({max_iterations})"
    return trips, ""


def _body(node: Any) -> Any:
    return next(a.g for a in node.attribute if a.name == "body")


def _stays_true(body: Any, values: dict[str, Any]) -> bool:
    """Whether the body's condition output is its condition input (passed through, or through
    Identity nodes) or a constant true: with a true start, every iteration runs."""
    cond_in, name = body.input[1].name, body.output[0].name
    producers = {o: n for n in body.node for o in n.output}
    local = {t.name: t for t in body.initializer}
    while True:
        if name == cond_in:
            return True
        node = producers.get(name)
        if node is not None and node.op_type == "Identity":
            name = node.input[0]
            continue
        value = _local_constant(node, local.get(name)) if name not in values else values[name]
        return value is not None and value.size == 1 and bool(value.reshape(()))


def _local_constant(node: Any, initializer: Any) -> Any:
    from onnx import numpy_helper

    from edgeflow.core.onnxgraph import constant_value

    if initializer is not None:
        return numpy_helper.to_array(initializer)
    if node is not None and node.op_type == "Constant":
        return constant_value(node)
    return None


def _unroll(model: onnx.ModelProto, graph: Any, index: int, trips: int) -> None:
    """Replace graph.node[index] (a Loop of `trips` iterations) by copies of its body."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    node = graph.node[index]
    body = _body(node)
    carried_count = len(node.input) - 2
    outputs = list(node.output)
    del graph.node[index]
    namer = Namer(model)  # names outside the body, now that the Loop is gone
    prefix = node.name or node.output[0]
    constants: list[Any] = []
    # the body's initializers: one copy shared by every iteration
    shared = {t.name: namer(f"{prefix}/{t.name}") for t in body.initializer}
    for t in body.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(t)
        copy.name = shared[t.name]
        constants.append(copy)
    iter_in, cond_in = body.input[0].name, body.input[1].name
    true = namer(f"{prefix}/true")
    constants.append(numpy_helper.from_array(np.array(True), true))
    carried = list(node.input[2:])
    iterations = {true}  # the constants the copies read for the body's iteration and cond
    scans: list[list[str]] = [[] for _ in range(len(body.output) - 1 - carried_count)]
    nodes: list[Any] = []
    iter_type = helper.tensor_dtype_to_np_dtype(body.input[0].type.tensor_type.elem_type or 7)
    for k in range(trips):
        step = onnx.GraphProto()
        step.CopyFrom(body)
        mapping: dict[str, str] = {}
        for name in _defined_names(body) - set(shared) - {v.name for v in body.input}:
            mapping[name] = namer(f"{name}_{k}")
        mapping.update(shared)
        mapping[cond_in] = true
        iteration = namer(f"{prefix}/iteration_{k}")
        constants.append(numpy_helper.from_array(np.array(k, iter_type), iteration))
        mapping[iter_in] = iteration
        iterations.add(iteration)
        for formal, actual in zip(body.input[2:], carried, strict=True):
            mapping[formal.name] = actual
        rename_values(step, mapping)
        for n in step.node:
            n.name = namer(f"{n.name or n.op_type}_{k}")
        nodes.extend(step.node)
        results = [v.name for v in step.output[1:]]
        carried = results[:carried_count]
        for j, value in enumerate(results[carried_count:]):
            scans[j].append(value)
    nodes, folded = _fold_iteration_numbers(model, nodes, constants, iterations)
    constants.extend(folded)
    # the Loop's outputs: the last carried values, then each scan output stacked on axis 0
    produced = {o for n in nodes for o in n.output}
    finals: dict[str, str] = {}  # the value -> the Loop output it becomes
    tail: list[Any] = []
    for value, target in zip(carried, outputs[:carried_count], strict=False):
        if not target:
            continue
        if value in produced and value not in finals:
            finals[value] = target
        else:  # an input passed through, a constant, or a value returned twice
            tail.append(helper.make_node("Identity", [value], [target], namer(f"{target}/Id")))
    scan_types = [v.type.tensor_type for v in body.output[1 + carried_count :]]
    for values, target, t in zip(scans, outputs[carried_count:], scan_types, strict=False):
        if target:
            tail.extend(_stack(values, target, t, namer, constants, opset_version(model)))
    step = onnx.GraphProto()
    step.node.extend([*nodes, *tail])
    rename_values(step, finals)
    new = [*graph.node[:index], *step.node, *graph.node[index:]]
    del graph.node[:]
    graph.node.extend(new)
    read = {name for n in step.node for name in node_reads(n)}
    graph.initializer.extend(t for t in constants if t.name in read)


def _stack(
    values: list[str], target: str, t: Any, namer: Namer, constants: list[Any], opset: int
) -> list[Any]:
    """Nodes stacking the iterations' values of a scan output into `target` on a new axis 0.

    Of a known rank: Concat on axis 0, then Reshape to [iterations, *shape] (the shape a
    constant when the body declares it, else Shape of the first value): onnx2tf 1.28.8 gave
    Unsqueeze + Concat of [1, 8] values the shape (1, 5, 8) for (5, 1, 8), the Reshape it
    converts right. Scalars (or an unknown rank): Unsqueeze each, then Concat."""
    import numpy as np
    from onnx import helper, numpy_helper

    def const(value: Any, base: str) -> str:
        name = namer(f"{target}/{base}")
        constants.append(numpy_helper.from_array(np.asarray(value, np.int64), name))
        return name

    nodes = []
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
    if t.HasField("shape") and dims:
        flat = namer(f"{target}/flat")
        nodes.append(helper.make_node("Concat", values, [flat], namer(f"{flat}/Concat"), axis=0))
        if all(d > 0 for d in dims):
            shape = const([len(values), *dims], "shape")
        else:
            first, shape = namer(f"{target}/item_shape"), namer(f"{target}/shape")
            nodes.append(helper.make_node("Shape", [values[0]], [first], namer(first)))
            count = const([len(values)], "count")
            nodes.append(helper.make_node("Concat", [count, first], [shape], namer(shape), axis=0))
        reshape = helper.make_node("Reshape", [flat, shape], [target], namer(f"{target}/Reshape"))
        nodes.append(reshape)
        return nodes
    axes = const([0], "axes")
    pieces = []
    for value in values:
        piece = namer(f"{value}/unsqueezed")
        pieces.append(piece)
        if opset >= 13:
            nodes.append(helper.make_node("Unsqueeze", [value, axes], [piece], namer(piece)))
        else:
            nodes.append(helper.make_node("Unsqueeze", [value], [piece], namer(piece), axes=[0]))
    nodes.append(helper.make_node("Concat", pieces, [target], namer(f"{target}/Concat"), axis=0))
    return nodes


SEQUENCE_READERS = ("ConcatFromSequence", "SequenceAt", "SequenceLength")


def _sequences_to_tensors(model: onnx.ModelProto) -> list[Site]:
    """Read the main graph's sequences that the unrolled copies built (torch's `outs.append(h)`
    in a loop: SequenceEmpty, then a SequenceInsert per iteration) as their tensors:
    ConcatFromSequence becomes a Concat (stacking, new_axis=1: Concat + Reshape where the
    items' shape is static, as in `_stack`), SequenceAt of a constant index the item,
    SequenceLength a constant. Only sequences built by appending (no position input)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    values = _constants(model)
    shapes: dict[str, list[int]] = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # advisory: stacking then goes through Unsqueeze
        inferred = model
    for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        if t.HasField("shape") and all(d > 0 for d in dims):
            shapes[v.name] = dims
    namer = Namer(model)
    constants: list[Any] = []
    sites: list[Site] = []
    new_nodes: list[Any] = []
    for node in graph.node:
        items = _appended_items(node, producers) if node.op_type in SEQUENCE_READERS else None
        if items is None or node.domain not in ("", "ai.onnx"):
            new_nodes.append(node)
            continue
        out, where = node.output[0], node.name or node.output[0]
        if node.op_type == "SequenceLength":
            name = namer(f"{out}/length")
            constants.append(numpy_helper.from_array(np.array(len(items), np.int64), name))
            replacement = [helper.make_node("Identity", [name], [out], namer(where))]
        elif node.op_type == "SequenceAt":
            index = values.get(node.input[1])
            if index is None or index.size != 1 or not -len(items) <= int(index) < len(items):
                new_nodes.append(node)
                continue
            item = items[int(index.reshape(()))]
            replacement = [helper.make_node("Identity", [item], [out], namer(where))]
        else:
            if not items:
                new_nodes.append(node)
                continue
            replacement = _concat_items(node, items, shapes.get(items[0]), namer, constants)
        sites.append(Site.changed(where, f"a sequence of {len(items)} tensors, read directly"))
        new_nodes.extend(replacement)
    if sites:
        del graph.node[:]
        graph.node.extend(new_nodes)
        graph.initializer.extend(constants)
    return sites


def _appended_items(node: Any, producers: dict[str, Any]) -> list[str] | None:
    """The tensors of the sequence a node reads, when SequenceEmpty or SequenceConstruct
    started it and SequenceInserts without a position appended to it; else None."""
    items: list[str] = []
    current = producers.get(node.input[0])
    while current is not None and current.op_type == "SequenceInsert":
        if len(current.input) > 2 and current.input[2]:
            return None
        items.append(current.input[1])
        current = producers.get(current.input[0])
    if current is None or current.op_type not in ("SequenceEmpty", "SequenceConstruct"):
        return None
    return [*current.input, *reversed(items)]


def _concat_items(
    node: Any, items: list[str], shape: list[int] | None, namer: Namer, constants: list[Any]
) -> list[Any]:
    """ConcatFromSequence of `items` as Concat (new_axis=0), or stacked on a new axis: Concat
    along it then Reshape where the items' shape is static (onnx2tf converts that right),
    else Unsqueeze each, then Concat."""
    import numpy as np
    from onnx import helper, numpy_helper

    from edgeflow.rules.onnx._build import attr

    out, where = node.output[0], node.name or node.output[0]
    axis, new_axis = int(attr(node, "axis", 0)), int(attr(node, "new_axis", 0))
    if not new_axis:
        return [helper.make_node("Concat", items, [out], namer(where), axis=axis)]
    if shape is not None:
        rank = len(shape)
        a = axis + rank + 1 if axis < 0 else axis
        if a < rank:
            flat, target = namer(f"{out}/flat"), namer(f"{out}/shape")
            full = [*shape[:a], len(items), *shape[a:]]
            constants.append(numpy_helper.from_array(np.array(full, np.int64), target))
            return [
                helper.make_node("Concat", items, [flat], namer(where), axis=a),
                helper.make_node("Reshape", [flat, target], [out], namer(f"{where}/Reshape")),
            ]
    axes = namer(f"{out}/axes")
    constants.append(numpy_helper.from_array(np.array([axis], np.int64), axes))
    pieces = [namer(f"{item}/unsqueezed") for item in items]
    nodes = [
        helper.make_node("Unsqueeze", [item, axes], [piece], namer(piece))
        for item, piece in zip(items, pieces, strict=True)
    ]
    return [*nodes, helper.make_node("Concat", pieces, [out], namer(where), axis=axis)]


def _fold_iteration_numbers(
    model: onnx.ModelProto, nodes: list[Any], constants: list[Any], seeds: set[str]
) -> tuple[list[Any], list[Any]]:
    """Compute the copies' nodes that read only constants, at least one of them derived from
    an iteration number or the condition (Cast(i), i + 1, a nested Loop's trip count), as
    initializers: so no int64 arithmetic is left for targets without int64 kernels, and a
    nested Loop's count becomes a constant. Outputs above MAX_FOLDED elements stay nodes."""
    import numpy as np
    from onnx import numpy_helper

    from edgeflow.rules.onnx.fold_if import NON_DETERMINISTIC

    known = {t.name: numpy_helper.to_array(t) for t in constants} | _constants(model)
    derived = set(seeds)
    kept, folded = [], []
    for node in nodes:
        inputs = [n for n in node.input if n]
        foldable = (
            inputs
            and node.domain in ("", "ai.onnx")
            and node.op_type not in NON_DETERMINISTIC
            and not any(a.type in (5, 10) for a in node.attribute)  # GRAPH, GRAPHS
            and all(n in known for n in inputs)
            and any(n in derived for n in inputs)
        )
        results = _evaluate(model, node, known) if foldable else None
        if results is None or any(np.asarray(r).size > MAX_FOLDED for r in results):
            kept.append(node)
            continue
        for name, value in zip(node.output, results, strict=True):
            if name:
                known[name] = np.asarray(value)
                derived.add(name)
                folded.append(numpy_helper.from_array(np.asarray(value), name))
    return kept, folded


MAX_FOLDED = 1024  # elements: larger values computed from iteration numbers stay nodes


def _evaluate(model: onnx.ModelProto, node: Any, known: dict[str, Any]) -> list[Any] | None:
    """One node's outputs from constant inputs (onnx's reference runtime), or None."""
    import numpy as np
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    inputs = [n for n in node.input if n]
    inits = [numpy_helper.from_array(np.asarray(known[n]), n) for n in dict.fromkeys(inputs)]
    outs = [helper.make_tensor_value_info(o, 0, None) for o in node.output if o]
    graph = helper.make_graph([node], "fold", [], outs, inits)
    probe = helper.make_model(graph, opset_imports=list(model.opset_import))
    try:
        results: Any = ReferenceEvaluator(probe).run(None, {})
    except Exception:  # the reference runtime lacks the op: the node stays
        return None
    return [np.asarray(r) for r in results]
