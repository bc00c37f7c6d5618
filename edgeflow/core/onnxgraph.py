"""Small helpers shared by the onnx.* rules: copying, walking graphs, naming, comparing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy, so a rule never mutates the model it was given."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def opset_version(model: onnx.ModelProto, domain: str = "") -> int:
    """The model's opset for a domain ('' and 'ai.onnx' are the same), 0 when absent."""
    domains = {"", "ai.onnx"} if domain in ("", "ai.onnx") else {domain}
    return next((o.version for o in model.opset_import if o.domain in domains), 0)


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs held in a node's attributes (If branches, Loop/Scan bodies)."""
    for _, graph in named_subgraphs(node):
        yield graph


def named_subgraphs(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    """(attribute name, graph) of each graph a node holds: `then_branch`, `body`, `g[1]`."""
    import onnx

    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.name, attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for k, graph in enumerate(attr.graphs):
                yield f"{attr.name}[{k}]", graph


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every graph nested in it, outermost first."""
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from all_graphs(sub)


def all_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Every node of the model: main graph, nested subgraphs and local functions."""
    for graph in all_graphs(model.graph):
        yield from graph.node
    for function in model.functions:
        yield from function.node


def op_counts(model: onnx.ModelProto) -> Counter[str]:
    """How many nodes of each op type the model holds, subgraphs included."""
    return Counter(node.op_type for node in all_nodes(model))


def graph_names(graph: onnx.GraphProto) -> set[str]:
    """Every value and node name used in a graph and its subgraphs."""
    names: set[str] = set()
    for g in all_graphs(graph):
        names.update(v.name for v in (*g.input, *g.output, *g.value_info))
        names.update(t.name for t in g.initializer)
        for node in g.node:
            names.update(node.input)
            names.update(node.output)
            names.add(node.name)
    names.discard("")
    return names


class Namer:
    """Fresh names that clash with nothing in the model: `base`, `base_1`, `base_2`, ..."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.taken = graph_names(model.graph)
        for function in model.functions:
            for node in function.node:
                self.taken.update((*node.input, *node.output, node.name))

    def __call__(self, base: str) -> str:
        name, i = base, 0
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name


def value_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name of a graph and its subgraphs (node names excluded)."""
    names: set[str] = set()
    for g in all_graphs(graph):
        names.update(v.name for v in (*g.input, *g.output, *g.value_info))
        names.update(t.name for t in g.initializer)
        for node in g.node:
            names.update((*node.input, *node.output))
    names.discard("")
    return names


def rename_values(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    """Rename tensors everywhere in a graph and its subgraphs: producers, consumers, inputs,
    outputs, initializers, value_info (names there are unique, so one map serves every scope)."""
    if not mapping:
        return
    for g in all_graphs(graph):
        for node in g.node:
            node.input[:] = [mapping.get(n, n) for n in node.input]
            node.output[:] = [mapping.get(n, n) for n in node.output]
        for item in (*g.input, *g.output, *g.value_info, *g.initializer):
            item.name = mapping.get(item.name, item.name)


def name_outputs(model: onnx.ModelProto, names: list[str]) -> dict[str, str]:
    """Name the graph's outputs `names`, in order. A tensor that already holds one of them
    (an exporter's internal name, in any subgraph) takes a fresh name first: the output gets
    the name, never the internal tensor. Returns those internal renames, old -> new."""
    import onnx

    graph = model.graph
    if len(graph.output) != len(names):
        raise ValueError(f"{len(graph.output)} graph outputs, {len(names)} names")
    namer, taken = Namer(model), value_names(graph)
    initializers = {t.name for t in graph.initializer}
    fed = {v.name for v in graph.input if v.name not in initializers}
    kept = {new for value, new in zip(graph.output, names, strict=True) if value.name == new}
    clashes = {name: namer(name) for name in names if name in taken and name not in kept}
    if fed & set(clashes):  # the recipe's checks refuse an output named as an input
        raise ValueError(f"outputs {sorted(fed & set(clashes))} are named as graph inputs")
    rename_values(graph, clashes)
    for value, new in zip(graph.output, names, strict=True):
        old = value.name
        if old == new:
            continue
        shared = old in fed or old in initializers or [v.name for v in graph.output].count(old) > 1
        if shared:  # the output is an input, a weight or another output too: a copy takes the name
            graph.node.append(onnx.helper.make_node("Identity", [old], [new], name=namer(new)))
            value.name = new
        else:
            rename_values(graph, {old: new})
    return clashes


def outer_references(graph: onnx.GraphProto) -> set[str]:
    """Names a (sub)graph reads but does not define: its outer-scope references."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(n for n in node.input if n and n not in defined)
        for sub in subgraphs(node):
            used.update(n for n in outer_references(sub) if n not in defined)
        defined.update(node.output)
    used.update(v.name for v in graph.output if v.name not in defined)
    return used


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Everything a node reads: its inputs and its subgraphs' outer-scope references."""
    names = [n for n in node.input if n]
    for sub in subgraphs(node):
        names.extend(outer_references(sub))
    return names


def same_graph(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    """Whether two models have byte-identical graphs, functions and opsets."""
    return graph_bytes(a) == graph_bytes(b)


def graph_bytes(model: onnx.ModelProto) -> bytes:
    parts = [model.graph.SerializeToString(deterministic=True)]
    parts += [f.SerializeToString(deterministic=True) for f in model.functions]
    parts += [o.SerializeToString(deterministic=True) for o in model.opset_import]
    return b"\0".join(parts)


def name_hint(name: str, choices: Iterable[str], what: str = "tensors", show: int = 12) -> str:
    """'did you mean ...?' plus a few of the valid names (graphs can have thousands)."""
    from edgeflow.core.suggest import closest

    options = sorted(set(choices))
    guess = closest(name, options)
    listed = ", ".join(options[:show]) + (
        f", ... ({len(options)} in all)" if len(options) > show else ""
    )
    prefix = f"did you mean '{guess}'? " if guess else ""
    return f"{prefix}({what}: {listed})"


def tensor_types(model: onnx.ModelProto) -> dict[str, Any]:
    """Type protos of every value (subgraphs included), from the model and shape inference."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except onnx.shape_inference.InferenceError:  # advisory: use what the model declares
        inferred = model
    types: dict[str, Any] = {}
    for source in (inferred, model):
        for g in all_graphs(source.graph):
            for value in (*g.value_info, *g.input, *g.output):
                if value.type.WhichOneof("value") is not None:
                    types[value.name] = value.type
    for g in all_graphs(model.graph):
        for init in g.initializer:
            types[init.name] = onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims))
    return types


def elem_type(model_types: dict[str, Any], name: str) -> int:
    """A value's tensor element type (onnx.TensorProto enum), 0 when unknown."""
    t = model_types.get(name)
    if t is None or t.WhichOneof("value") != "tensor_type":
        return 0
    return int(t.tensor_type.elem_type)


def constant_value(node: Any) -> Any:
    """The value of a Constant node as a numpy array (None for sparse values)."""
    import numpy as np
    from onnx import helper, numpy_helper

    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        if attr.name == "value":
            return numpy_helper.to_array(value)
        if attr.name in ("value_int", "value_ints"):
            return np.array(value, np.int64)
        if attr.name in ("value_float", "value_floats"):
            return np.array(value, np.float32)
    return None


def constants_to_initializers(graph: onnx.GraphProto, share: bool = False) -> int:
    """Replace the graph's Constant nodes (not its subgraphs') by initializers of the same
    names; with `share`, one initializer per distinct value (initializers included), the
    readers of the others renamed to it. Returns how many Constant nodes went."""
    from onnx import numpy_helper

    keep_names = {o.name for o in graph.output}
    values = [(t.name, numpy_helper.to_array(t)) for t in graph.initializer] if share else []
    kept, hoisted = [], 0
    for node in graph.node:
        value = constant_value(node) if node.op_type == "Constant" else None
        if value is None:
            kept.append(node)
        else:
            values.append((node.output[0], value))
            hoisted += 1
    if share:
        del graph.initializer[:]
    first: dict[tuple[str, tuple[int, ...], bytes], str] = {}
    alias: dict[str, str] = {}
    for name, value in values:
        key = (value.dtype.str, value.shape, value.tobytes())
        if share and key in first and name not in keep_names:
            alias[name] = first[key]
            continue
        first.setdefault(key, name)
        graph.initializer.append(numpy_helper.from_array(value, name))
    for node in kept:
        for i, name in enumerate(node.input):
            node.input[i] = alias.get(name, name)
    del graph.node[:]
    graph.node.extend(kept)
    return hoisted


def graph_inputs(path: Any, overridable: bool = False) -> dict[str, tuple[str, list[int | str]]]:
    """The graph inputs of an .onnx file: name -> (dtype, dims), a dim as its size or its
    symbol ('?' where unknown); weights are not read. Inputs that are also initializers
    (every IR-3 file lists its weights so) are left out, or `overridable`: only those."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    found: dict[str, tuple[str, list[int | str]]] = {}
    for value in model.graph.input:
        if (value.name in initializers) != overridable:
            continue
        tensor = value.type.tensor_type
        dtype = (
            onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else "?"
        )
        dims: list[int | str] = [
            d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in tensor.shape.dim
        ]
        found[value.name] = (dtype, dims)
    return found


# Ops that only move or repeat their first input's values (a zero stays zero through them).
SHAPE_ONLY = frozenset({"Expand", "Reshape", "Unsqueeze", "Squeeze", "Tile", "Cast", "Identity"})


def is_zero(name: str, constants: dict[str, Any], producers: dict[str, Any]) -> bool:
    """Whether a tensor is all zeros by construction: a constant of zeros, a ConstantOfShape
    of 0, or either through ops that only move or repeat values (torch exports an LSTM's zero
    initial state as an Expand of a 0 to a shape taken from the input)."""
    from onnx import numpy_helper

    for _ in range(8):
        if name in constants:
            return not constants[name].any()
        node = producers.get(name)
        if node is None:
            return False
        if node.op_type == "ConstantOfShape":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            return value is None or not numpy_helper.to_array(value).any()
        if node.op_type not in SHAPE_ONLY:
            return False
        name = node.input[0]
    return False
