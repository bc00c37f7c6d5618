"""Float islands: the operators of a transformer an int8 build keeps float (quantization.
keep_float), found in the ONNX graph by what they compute, never by name.

An island is known by the tensors entering it and those it writes. Those names survive the
target's rewrites (a rule that decomposes an Erf keeps the Erf's input and output names), so
the islands are found once, before the target's rewrites (rewrite_target.json), and each
backend finds what lies between those tensors in the graph it quantizes: the ONNX nodes
onnxruntime's quantizer excludes (`region`), or, matched by value, the .tflite operators
TensorFlow's quantizer denylists (edgeflow.targets._tflite_islands).

Kinds:
- softmax: Softmax;
- layernorm: LayerNormalization;
- gelu: Gelu, or 0.5 x (1 + erf(x / sqrt 2)) as exporters write it (Div or Mul, Erf, Add,
  Mul, Mul in any order of the last two);
- attention_scores: a MatMul of two computed tensors (the query-key scores and the
  probabilities times the values; a layer's MatMul reads a constant weight);
- embeddings: a Gather from a constant table (the token and position embeddings).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

IslandKind = Literal["softmax", "layernorm", "gelu", "attention_scores", "embeddings"]
KINDS: tuple[IslandKind, ...] = ("softmax", "layernorm", "gelu", "attention_scores", "embeddings")
SINGLE: dict[str, IslandKind] = {
    "Softmax": "softmax",
    "LayerNormalization": "layernorm",
    "Gelu": "gelu",
}
GELU_STEPS = ("Add", "Mul")  # after the Erf: + 1, times x, times 0.5 (or x times 0.5 first)


@dataclass(frozen=True)
class Island:
    kind: IslandKind
    entries: tuple[str, ...]  # the tensors it reads from the rest of the graph
    exits: tuple[str, ...]  # the tensors it writes for the rest of the graph

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "entries": list(self.entries), "exits": list(self.exits)}

    @classmethod
    def of(cls, data: dict[str, Any]) -> Island:
        return cls(data["kind"], tuple(data["entries"]), tuple(data["exits"]))


def find(model: Any) -> list[Island]:
    """Every island of the main graph of an ONNX ModelProto, in graph order."""
    graph = model.graph
    constants = {t.name for t in graph.initializer} | {
        o for n in graph.node if n.op_type == "Constant" for o in n.output
    }
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    found = []
    for node in graph.node:
        if node.op_type in SINGLE and node.input and node.output:
            found.append(Island(SINGLE[node.op_type], (node.input[0],), (node.output[0],)))
        elif node.op_type == "Erf":
            gelu = _erf_gelu(node, producer, readers, constants)
            if gelu is not None:
                found.append(gelu)
        elif node.op_type == "MatMul" and len(node.input) == 2:
            if not any(_constant(i, producer, constants) for i in node.input):
                found.append(Island("attention_scores", tuple(node.input), (node.output[0],)))
        elif node.op_type == "Gather" and node.input[0] in constants:
            found.append(Island("embeddings", (node.input[1],), (node.output[0],)))
    return found


def _constant(name: str, producer: dict[str, Any], constants: set[str]) -> bool:
    """A constant, or a constant moved (a Transpose or Reshape of a weight)."""
    seen = 0
    while name not in constants:
        node = producer.get(name)
        if node is None or node.op_type not in ("Transpose", "Reshape", "Cast") or seen > 4:
            return False
        name, seen = node.input[0], seen + 1
    return True


def _erf_gelu(
    erf: Any, producer: dict[str, Any], readers: dict[str, list[Any]], constants: set[str]
) -> Island | None:
    """0.5 x (1 + erf(x / sqrt 2)) around this Erf: its entry x and its exit, or None."""
    scaled = producer.get(erf.input[0])
    if scaled is None or scaled.op_type not in ("Div", "Mul") or scaled.input[1] not in constants:
        return None
    x = scaled.input[0]
    at, steps = erf.output[0], 0
    while steps < 3:
        after = readers.get(at, [])
        if len(after) != 1 or after[0].op_type not in GELU_STEPS:
            break
        other = [i for i in after[0].input if i != at]
        if not all(i in constants or i == x or _half_of(i, x, producer) for i in other):
            break
        at, steps = after[0].output[0], steps + 1
    if steps < 2:  # at least + 1 and times x
        return None
    return Island("gelu", (x,), (at,))


def _half_of(name: str, x: str, producer: dict[str, Any]) -> bool:
    node = producer.get(name)
    return node is not None and node.op_type == "Mul" and x in node.input


def region(
    nodes: Sequence[tuple[str, Sequence[str], Sequence[str]]],
    island: Island,
    graph_inputs: Iterable[str],
) -> list[str] | None:
    """The names of the nodes (name, inputs, outputs; of any graph, in its order) that
    compute the island's exits from its entries: back from each exit to the entries, a
    tensor no node writes being a constant. None when the walk leaves the island (an exit or
    entry this graph lacks, or a path around the entries to one of `graph_inputs`): that
    graph no longer holds it as it was found."""
    producer = {o: (k, inputs) for k, (_, inputs, outputs) in enumerate(nodes) for o in outputs}
    entries, outside = set(island.entries), set(graph_inputs)
    if not all(e in producer for e in island.exits):
        return None
    inside: set[int] = set()
    seen: set[str] = set()
    todo = list(island.exits)
    while todo:
        tensor = todo.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        if tensor in entries:
            continue
        if tensor not in producer:
            if tensor in outside:
                return None  # a graph input reached around the entries
            continue  # a constant
        k, inputs = producer[tensor]
        inside.add(k)
        todo.extend(i for i in inputs if i)
        if len(inside) > MAX_NODES:
            return None
    if not seen & entries:
        return None
    return [nodes[k][0] for k in sorted(inside)]


MAX_NODES = 256  # an island of more nodes is not one (a wrong entry would take the graph)


def onnx_nodes(model: Any) -> tuple[list[tuple[str, list[str], list[str]]], set[str]]:
    """The main graph's nodes as `region` reads them (an unnamed node named by its output),
    and its inputs (initializers left out)."""
    graph = model.graph
    nodes = [(n.name or n.output[0], list(n.input), list(n.output)) for n in graph.node]
    weights = {t.name for t in graph.initializer}
    return nodes, {i.name for i in graph.input if i.name not in weights}


def kept_nodes(
    islands: Iterable[Island],
    kinds: Iterable[str],
    nodes: Sequence[tuple[str, Sequence[str], Sequence[str]]],
    graph_inputs: Iterable[str],
) -> tuple[dict[str, list[list[str]]], list[Island]]:
    """({kind: [the nodes of each island]} for the islands of `kinds` this graph holds, the
    islands it no longer holds)."""
    wanted, inputs = set(kinds), set(graph_inputs)
    kept: dict[str, list[list[str]]] = {}
    lost = []
    for island in islands:
        if island.kind not in wanted:
            continue
        inside = region(nodes, island, inputs)
        if inside is None:
            lost.append(island)
        else:
            kept.setdefault(island.kind, []).append(inside)
    return kept, lost


def recorded(path: Path | None) -> list[Island]:
    """The islands rewrite_target.json records (none where the pipeline has no such stage)."""
    if path is None or not path.is_file():
        return []
    return [Island.of(i) for i in json.loads(path.read_text()).get("islands", [])]


def record(
    kept: dict[str, list[list[str]]], lost: Sequence[Island], asked: Sequence[str]
) -> dict[str, Any]:
    """What an int8 build says of its islands: the kinds asked for, the nodes kept float per
    kind, and the islands its graph no longer held (a rewrite made them into something
    else)."""
    return {
        "asked": list(asked),
        "kept": kept,
        "summary": summary(kept),
        "lost": [i.record() for i in lost],
    }


def summary(kept: dict[str, list[list[str]]]) -> str:
    """'gelu (2 islands, 58 operators), softmax (2, 2)' of {kind: [operators per island]}."""
    parts = []
    for kind, islands in kept.items():
        ops = sum(len(i) for i in islands)
        parts.append(f"{kind} ({len(islands)} islands, {ops} operators)")
    return ", ".join(parts)
