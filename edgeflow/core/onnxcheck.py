"""Whether a parsed ONNX model's graph is well formed, read from the protobuf alone (no external
data, no shape inference, nothing run): versions onnx and onnxruntime know, every node's op
known at its domain's imported opset (or a local function), single assignment, every input
produced, an order without cycles, outputs produced, no recursive local function; subgraphs
(If branches, Loop and Scan bodies) the same with the outer names in scope."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

# domains onnxruntime registers ops of beyond onnx's schemas: their ops are not judged here
RUNTIME_DOMAINS = frozenset(
    {"com.microsoft", "com.microsoft.nchwc", "com.ms.internal.nhwc", "com.microsoft.experimental"}
)
MAX_DEPTH = 100  # subgraph levels (protobuf's own recursion limit parses fewer)
MAX_SHOWN = 8  # problems listed in full, then a count


@dataclass(frozen=True)
class Scope:
    """One graph to check: where it sits, the opsets its nodes see, the names it inherits."""

    graph: onnx.GraphProto | onnx.FunctionProto
    where: str  # '' for the main graph, "node 'n' then_branch: " for a subgraph
    opsets: dict[str, int]
    outer: frozenset[str]
    depth: int


def graph_problems(model: onnx.ModelProto) -> list[str]:
    """What makes `model`'s graph malformed, one line per problem ([]: none)."""
    import onnx

    problems = _version_problems(model)
    if problems:
        return problems
    opsets = _opsets(model.opset_import)
    functions = {(f.domain, f.name): f for f in model.functions}
    problems += _recursive_functions(model)
    if not model.graph.output:
        problems.append("the graph has no outputs")
    todo = [Scope(model.graph, "", opsets, frozenset(), 0)]
    for f in model.functions:
        where = f"local function '{f.domain}:{f.name}': "
        todo.append(Scope(f, where, {**opsets, **_opsets(f.opset_import)}, frozenset(), 0))
    while todo:  # iterative: a subgraph nested hundreds deep is no Python recursion
        scope = todo.pop()
        if scope.depth > MAX_DEPTH:
            problems.append(f"{scope.where}subgraphs nest deeper than {MAX_DEPTH} levels")
            continue
        problems += _scope_problems(scope, functions)
        visible = scope.outer | _defined(scope.graph)
        for node_label, node in _labelled(scope.graph):
            for attr in node.attribute:
                graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else []
                if attr.type == onnx.AttributeProto.GRAPHS:
                    graphs = list(attr.graphs)
                for sub in graphs:
                    where = f"{scope.where}{node_label} {attr.name}: "
                    todo.append(Scope(sub, where, scope.opsets, visible, scope.depth + 1))
    if len(problems) > MAX_SHOWN:
        problems = [*problems[:MAX_SHOWN], f"and {len(problems) - MAX_SHOWN} more problems"]
    return problems


def _version_problems(model: onnx.ModelProto) -> list[str]:
    """The IR version and the imported opsets against what onnx (and onnxruntime) know."""
    import onnx

    problems = []
    if model.ir_version > onnx.IR_VERSION:
        problems.append(
            f"its IR version {model.ir_version} is newer than onnx {onnx.__version__} and "
            f"onnxruntime read (up to {onnx.IR_VERSION})"
        )
    if not model.opset_import:
        problems.append("it imports no opset (every ONNX model names the opsets its ops are from)")
    newest = {
        "": onnx.defs.onnx_opset_version(),
        "ai.onnx.ml": onnx.defs.onnx_ml_opset_version(),
    }
    for domain, version in _opsets(model.opset_import).items():
        if domain in newest and not 1 <= version <= newest[domain]:
            name = domain or "ai.onnx"
            problems.append(
                f"it imports opset {version} of '{name}'; onnx {onnx.__version__} knows "
                f"1..{newest[domain]}"
            )
    return problems


def _opsets(imports: Iterable[onnx.OperatorSetIdProto]) -> dict[str, int]:
    """Domain -> version, 'ai.onnx' spelled ''."""
    return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in imports}


def _labelled(
    graph: onnx.GraphProto | onnx.FunctionProto,
) -> Iterator[tuple[str, onnx.NodeProto]]:
    for i, node in enumerate(graph.node):
        yield _label(node, i), node


def _label(node: onnx.NodeProto, index: int) -> str:
    """How a message names a node: its name, else its index, op and first output."""
    if node.name:
        return f"node '{node.name}' ({node.op_type})"
    first = next((o for o in node.output if o), "")
    return f"node {index} ({node.op_type} -> '{first}')"


def _defined(graph: onnx.GraphProto | onnx.FunctionProto) -> frozenset[str]:
    """Every name a graph (or function body) defines: inputs, initializers, node outputs."""
    names = set(_sources(graph))
    names.update(o for node in graph.node for o in node.output if o)
    return frozenset(names)


def _sources(graph: onnx.GraphProto | onnx.FunctionProto) -> list[str]:
    """The names a graph starts from: its inputs and initializers (a function's inputs)."""
    import onnx

    if isinstance(graph, onnx.FunctionProto):
        return [name for name in graph.input if name]
    return (
        [v.name for v in graph.input]
        + [t.name for t in graph.initializer]
        + [t.values.name for t in graph.sparse_initializer]
    )


def _scope_problems(
    scope: Scope, functions: dict[tuple[str, str], onnx.FunctionProto]
) -> list[str]:
    """One graph's ops, single assignment, producers, order and outputs."""
    import onnx

    graph, where = scope.graph, scope.where
    problems = []
    sources = set(_sources(graph))
    known = set(scope.outer) | sources
    producer: dict[str, int] = {}
    types = _source_types(graph)
    for i, (label, node) in enumerate(_labelled(graph)):
        op = _op_problem(node, scope.opsets, functions)
        if op:
            problems.append(f"{where}{label}: {op}")
        elif (node.domain, node.op_type) not in functions:
            problems += [f"{where}{label}: {p}" for p in _type_problems(node, scope.opsets, types)]
        for name in node.output:
            if not name:
                continue
            if name in producer:
                other = _label(graph.node[producer[name]], producer[name])
                problems.append(f"{where}{label}: writes '{name}', which {other} writes too")
            elif name in sources:
                problems.append(f"{where}{label}: writes '{name}', a graph input or initializer")
            else:
                producer[name] = i
    for label, node in _labelled(graph):
        for name in node.input:
            if name and name not in known and name not in producer:
                problems.append(f"{where}nothing produces '{name}' ({label})")
    problems += _cycle(scope, known, producer)
    outputs = (
        graph.output if isinstance(graph, onnx.FunctionProto) else [v.name for v in graph.output]
    )
    for name in outputs:
        if name and name not in known and name not in producer:
            problems.append(f"{where}nothing produces the graph output '{name}'")
    return problems


def _source_types(graph: onnx.GraphProto | onnx.FunctionProto) -> dict[str, str]:
    """The tensor types ('tensor(float)') of a graph's inputs and initializers, where known."""
    import onnx

    if isinstance(graph, onnx.FunctionProto):
        return {}
    name = onnx.TensorProto.DataType.Name
    types = {
        v.name: f"tensor({name(v.type.tensor_type.elem_type).lower()})"
        for v in graph.input
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type
    }
    types.update(
        {t.name: f"tensor({name(t.data_type).lower()})" for t in graph.initializer if t.data_type}
    )
    return types


def _type_problems(
    node: onnx.NodeProto, opsets: dict[str, int], types: dict[str, str]
) -> list[str]:
    """Inputs fed straight from a graph input or initializer of a type the op's schema does
    not take (nothing is inferred: only the types the file states)."""
    import onnx

    domain = "" if node.domain == "ai.onnx" else node.domain
    if domain not in _schema_domains() or not any(n in types for n in node.input):
        return []
    schema = _schema(node.op_type, opsets[domain], domain)
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    formals = list(schema.inputs)
    variadic = (
        bool(formals) and formals[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
    )
    problems = []
    for i, name in enumerate(node.input):
        if name not in types or (i >= len(formals) and not variadic):
            continue
        formal = formals[min(i, len(formals) - 1)]
        takes = allowed.get(formal.type_str, {formal.type_str})
        if types[name] not in takes:
            problems.append(
                f"its input '{name}' is {types[name]}; {node.op_type}'s {formal.name} takes "
                f"{', '.join(sorted(takes))}"
            )
    return problems


def _cycle(scope: Scope, known: set[str], producer: dict[str, int]) -> list[str]:
    """Kahn's order over the nodes (absent names counted as there: reported apart): the nodes
    left over wait on each other."""
    nodes = scope.graph.node
    waits = [
        {producer[n] for n in node.input if n and n not in known and n in producer}
        for node in nodes
    ]
    users: dict[int, list[int]] = {}
    for i, deps in enumerate(waits):
        for d in deps:
            users.setdefault(d, []).append(i)
    ready = [i for i, deps in enumerate(waits) if not deps]
    left = [len(deps) for deps in waits]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for u in users.get(i, []):
            left[u] -= 1
            if not left[u]:
                ready.append(u)
    if done == len(nodes):
        return []
    stuck = [_label(nodes[i], i) for i, n in enumerate(left) if n]
    shown = ", ".join(stuck[:4]) + (f" and {len(stuck) - 4} more" if len(stuck) > 4 else "")
    return [f"{scope.where}the graph has a cycle: no order runs {shown} (each waits on another)"]


def _op_problem(
    node: onnx.NodeProto,
    opsets: dict[str, int],
    functions: dict[tuple[str, str], onnx.FunctionProto],
) -> str:
    """Why a node's op cannot be found ('' when it can, or when onnxruntime's own)."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    name = f"{domain or 'ai.onnx'}:{node.op_type}"
    if domain not in opsets:
        return f"its domain '{domain or 'ai.onnx'}' has no opset import ({name})"
    if (node.domain, node.op_type) in functions or domain in RUNTIME_DOMAINS:
        return ""
    if domain not in _schema_domains():
        return f"{name} is no ONNX op, no onnxruntime op and no local function of the model"
    if not _has(node.op_type, opsets[domain], domain):
        return f"{name} is no op of opset {opsets[domain]} of '{domain or 'ai.onnx'}'"
    return ""


@cache
def _schema_domains() -> frozenset[str]:
    import onnx

    return frozenset(s.domain for s in onnx.defs.get_all_schemas_with_history())


@cache
def _schema(op: str, version: int, domain: str) -> onnx.defs.OpSchema:
    import onnx

    return onnx.defs.get_schema(op, version, domain)


@cache
def _has(op: str, version: int, domain: str) -> bool:
    import onnx

    return bool(onnx.defs.has(op, version, domain))


def _recursive_functions(model: onnx.ModelProto) -> list[str]:
    """Local functions that call themselves, directly or through others."""

    local = {(f.domain, f.name) for f in model.functions}
    calls: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for f in model.functions:
        found: set[tuple[str, str]] = set()
        stack: list[onnx.GraphProto | onnx.FunctionProto] = [f]
        while stack:  # the body and its subgraphs
            graph = stack.pop()
            for node in graph.node:
                if (node.domain, node.op_type) in local:
                    found.add((node.domain, node.op_type))
                for attr in node.attribute:
                    stack.extend([attr.g] if attr.HasField("g") else list(attr.graphs))
        calls[(f.domain, f.name)] = found
    problems = []
    for start in calls:  # does `start` reach itself?
        seen: set[tuple[str, str]] = set()
        stack2 = list(calls[start])
        while stack2:
            key = stack2.pop()
            if key == start:
                problems.append(
                    f"local function '{start[0]}:{start[1]}' calls itself (recursion, which "
                    "ONNX does not allow)"
                )
                break
            if key not in seen:
                seen.add(key)
                stack2.extend(calls.get(key, ()))
    return problems
