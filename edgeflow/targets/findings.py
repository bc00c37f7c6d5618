"""A precheck finding, and what the per-node checks know of a graph.

Shared by the precheck (edgeflow.targets.precheck) and the checks it runs over a graph
(edgeflow.targets.placement: an NPU compiler's placement): a Finding is one operator's (or a
model-level) problem with its nodes, severity and the rule that removes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from edgeflow.rules import rules_fixing
from edgeflow.rules.entries import options_for
from edgeflow.rules.fixes import FINDINGS, Fix

# An operator's input type without a kernel, by its onnx name, as a finding rules declare.
DTYPE_FINDINGS = {"double": "float64", "int64": "int64"}
# What a finding suggests when no rule removes it: a recipe setting.
SETTINGS = {"float16": "quantization.mode: none"}


@dataclass
class Finding:
    operator: str
    reason: str
    nodes: list[str] = field(default_factory=list)
    count: int = 0
    rule: str = ""
    options: dict[str, Any] = field(default_factory=dict)  # the suggested rule's, if it needs any
    # error: the target cannot take this; warning: it runs, but was measured inaccurate in
    # some graphs (verify will tell), so it does not fail the precheck
    severity: str = "error"
    # what a rule would have to declare to remove it, most specific first (not reported)
    fixes: list[Fix] = field(default_factory=list, repr=False, compare=False)
    # onnx rules that declare it but, applied to this model, leave it or add another error
    tried: list[str] = field(default_factory=list)
    # a warning whose suggested rule is tried on the model as an error's is (an operator an
    # NPU compiler leaves on the CPU: the rule must move it without leaving another there)
    confirm: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.count = self.count or len(self.nodes) or 1
        if not self.fixes and not self.operator.startswith("("):
            self.fixes = [Fix.op(self.operator)]
        if not self.rule:
            self.rule, self.options = suggestion(*self.fixes, given=self.options)


def model_finding(
    key: str, reason: str, nodes: list[str] | None = None, rule: str = "", **kw: Any
) -> Finding:
    """A finding about the model rather than one operator: "(float64)" for FINDINGS' float64,
    with the rule that declares it fixes it (or the recipe setting that avoids it)."""
    assert key in FINDINGS, key
    fixes = [Fix.finding(key)]
    if not rule and not suggest(*fixes, options=kw.get("options")):
        rule = SETTINGS.get(key, "")
    return Finding(f"({key})", reason, nodes or [], rule=rule, fixes=fixes, **kw)


def suggest(*fixes: Fix, options: dict[str, Any] | None = None) -> str:
    """The rule to suggest for a finding (see `suggestion`)."""
    return suggestion(*fixes, given=options)[0]


def suggestion(*fixes: Fix, given: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The rule to suggest for a finding, with the options its entry gives: for the first of
    `fixes` that a built-in rule declares, the first onnx rule in catalogue order that does
    (it applies to the very model checked), else the first of another level. A rule is passed
    over where its options are the user's to choose (edgeflow.rules.entries.options_for):
    every suggestion is an entry that works as printed. `given`: what the finding computed
    (the opset to convert to)."""
    for fix in fixes:
        found = [(r, options_for(r, fix, given)) for r in rules_fixing(fix)]
        rules = [(r, options) for r, options in found if options is not None]
        if rules:
            rule, options = next((p for p in rules if p[0].level == "onnx"), rules[0])
            return rule.name, options
    return "", {}


@dataclass
class GraphFacts:
    """What the per-node checks need to know of a shape-inferred graph (its nested graphs
    included): element types, ranks, static shapes, constant values, the tensors read."""

    nodes: list[tuple[str, Any]]  # named_nodes'
    types: dict[str, int]  # tensor -> ONNX element type, where known
    ranks: dict[str, int]
    shapes: dict[str, tuple[int, ...]]
    constants: dict[str, Any]  # initializers and Constant outputs -> numpy arrays
    read: frozenset[str]  # what a node or the graph's outputs read

    @classmethod
    def of(cls, model: Any) -> GraphFacts:
        from onnx import numpy_helper

        graph = model.graph
        types: dict[str, int] = {t.name: t.data_type for t in graph_initializers(graph)}
        ranks: dict[str, int] = {t.name: len(t.dims) for t in graph_initializers(graph)}
        shapes: dict[str, tuple[int, ...]] = {}
        for value in graph_values(graph):
            t = value.type.tensor_type
            if t.elem_type:
                types[value.name] = t.elem_type
            if t.HasField("shape"):
                ranks[value.name] = len(t.shape.dim)
                if all(d.HasField("dim_value") for d in t.shape.dim):
                    shapes[value.name] = tuple(d.dim_value for d in t.shape.dim)
        constants = {t.name: numpy_helper.to_array(t) for t in graph_initializers(graph)}
        shapes.update({name: value.shape for name, value in constants.items()})
        nodes = list(named_nodes(graph))
        read = frozenset({i for _, n in nodes for i in n.input} | {o.name for o in graph.output})
        for _, node in nodes:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        return cls(nodes, types, ranks, shapes, constants, read)

    def node(self, proto: Any) -> Any:
        """The node as edgeflow.targets.checkers' checkers take it."""
        from edgeflow.targets.checkers import Node

        return Node(proto, self.constants, self.ranks, self.shapes, self.read, self.types)


def named_nodes(graph: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(name, node) of every node of the graph and of the graphs nested in its If, Loop and
    Scan nodes (a branch's node as `If_0/then_branch/Conv_3`): a converter converts those
    bodies too, so the precheck judges them."""
    from edgeflow.core.onnxgraph import named_subgraphs

    for i, node in enumerate(graph.node):
        name = prefix + (node.name or f"#{i}")
        yield name, node
        for attr, sub in named_subgraphs(node):
            yield from named_nodes(sub, f"{name}/{attr}/")


def graph_values(graph: Any) -> Iterator[Any]:
    """Every value_info-like entry of the graph and its nested graphs."""
    from edgeflow.core.onnxgraph import all_graphs

    for g in all_graphs(graph):
        yield from (*g.input, *g.output, *g.value_info)


def graph_initializers(graph: Any) -> Iterator[Any]:
    from edgeflow.core.onnxgraph import all_graphs

    for g in all_graphs(graph):
        yield from g.initializer
