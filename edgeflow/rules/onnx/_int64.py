"""Which int64 tensors of a graph may become int32, and why the others may not.

Values bound to one type variable of a node (Add's T: both inputs and the output) must share
a type, so they form groups (union-find over the op schemas); a group converts as a whole.
Each use of a constant is its own member, so a constant can stay int64 for Reshape's shape and
get an int32 copy for Gather's indices. A group stays int64 when an op pins it (a
`tensor(int64)` parameter, a type variable without int32, no schema, a subgraph reads it, a
graph input/output under io: keep), or when a member's values cannot be proven to fit int32:
constants are checked, computed values bounded by interval arithmetic over the graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgeflow.core.onnxgraph import (
    constant_value,
    elem_type,
    opset_version,
    outer_references,
    subgraphs,
)

if TYPE_CHECKING:
    import onnx

INT64, INT32 = 7, 6
LO, HI = -(2**31), 2**31 - 1
Range = tuple[int, int]
Key = tuple[Any, ...]  # ("v", name) | ("u", name, node index, input slot) | ("t", node, var)
# Slice clamps starts/ends to the dims, so INT64_MAX there may become INT32_MAX.
CLAMPED_SLOTS = {("Slice", 1), ("Slice", 2)}
# Bounds of the smaller integer types (onnx.TensorProto enum -> range), for Cast to int64.
TYPE_RANGES: dict[int, Range] = {
    2: (0, 255),
    3: (-128, 127),
    4: (0, 65535),
    5: (-32768, 32767),
    6: (LO, HI),
    9: (0, 1),
}
# Ops whose schema allows int32 where onnxruntime 1.32's CPU kernels do not (probed: OneHot
# with int32 indices/depth/values and Unique on int32 fail with NOT_IMPLEMENTED).
NO_INT32_KERNEL = {"OneHot", "Unique"}
SAME_AS_FIRST = {
    "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Expand", "Tile",
    "Slice", "Gather", "GatherElements", "GatherND", "Split", "ReduceMax", "ReduceMin",
    "Compress", "ReverseSequence", "DepthToSpace", "SpaceToDepth", "TopK", "Unique",
}  # fmt: skip


@dataclass
class Plan:
    """What to convert: values, constant uses, Casts to insert; and what stays, with why."""

    values: set[str] = field(default_factory=set)
    constant_uses: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    casts: list[tuple[int, int]] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (tensors, why they stay)


class _Groups:
    """Union-find over element keys, with pins: reasons a group must stay int64."""

    def __init__(self) -> None:
        self.parent: dict[Key, Key] = {}
        self.hard: dict[Key, str] = {}
        self.consumer: dict[Key, list[tuple[int, int, str]]] = {}
        self.free: set[Key] = set()  # elements read through a type variable: a computation

    def find(self, key: Key) -> Key:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: Key, b: Key) -> None:
        self.parent[self.find(a)] = self.find(b)

    def pin(self, key: Key, reason: str) -> None:
        self.find(key)
        self.hard.setdefault(key, reason)


def plan(model: onnx.ModelProto, types: dict[str, Any], io: str, insert_casts: bool) -> Plan:
    """Decide the conversion of the main graph (types: value types from shape inference)."""
    graph = model.graph
    consts = int64_constants(model)
    groups = _Groups()

    def is64(name: str) -> bool:
        return name in consts or elem_type(types, name) == INT64

    opset = opset_version(model)
    for index, node in enumerate(graph.node):
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue
        _bind_node(groups, index, node, _schema(node, opset), consts, is64)
    _pin_interface(graph, groups, io, is64)
    ranges = _ranges(graph, consts, types, io)
    return _decide(groups, consts, ranges, insert_casts, graph)


def _bind_node(
    groups: _Groups, index: int, node: Any, schema: Any, consts: dict[str, Any], is64: Any
) -> None:
    """Add a node's int64 inputs/outputs to the groups, following its schema."""
    label = f"{node.op_type} '{node.name or node.output[0]}'"
    bound = _bindings(node, schema) if schema is not None else None
    slots = [(i, n, "in") for i, n in enumerate(node.input) if n]
    slots += [(i, n, "out") for i, n in enumerate(node.output) if n]
    for slot, name, kind in slots:
        if not is64(name):
            continue
        key: Key = ("u", name, index, slot) if kind == "in" and name in consts else ("v", name)
        if bound is None:
            groups.pin(key, f"{label} has no known schema or holds subgraphs")
            continue
        if node.op_type in NO_INT32_KERNEL:
            groups.pin(key, f"{label}: onnxruntime has no int32 kernel for it")
            continue
        tstr, formal, allowed = bound[(kind, slot)]
        if allowed is not None:  # a type variable: its members share one type
            anchor: Key = ("t", index, tstr)
            groups.union(key, anchor)
            if kind == "in":
                groups.free.add(key)
            if "tensor(int32)" not in allowed:
                groups.pin(anchor, f"{label} type {tstr} has no int32")
            elif kind == "out" and _typed_by_attribute(node, schema, tstr):
                groups.pin(anchor, f"{label} sets its output type by an attribute")
        elif kind == "in":
            groups.find(key)
            reason = f"{label} input '{formal}' must be int64"
            groups.consumer.setdefault(key, []).append((index, slot, reason))
        else:
            groups.pin(key, f"{label} output '{formal}' is always int64")


def _typed_by_attribute(node: Any, schema: Any, tstr: str) -> bool:
    """An output type variable no input carries (Cast's and ConstantOfShape's are rewritten)."""
    if node.op_type in ("Cast", "ConstantOfShape"):
        return False
    return not any(p.type_str == tstr for p in schema.inputs)


def _schema(node: Any, opset: int) -> Any:
    import onnx.defs

    if any(subgraphs(node)) or node.domain not in ("", "ai.onnx"):
        return None
    try:
        return onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


def _bindings(node: Any, schema: Any) -> dict[tuple[str, int], tuple[str, str, Any]] | None:
    """(kind, slot) -> (type string, parameter name, allowed types of its type variable)."""
    import onnx.defs

    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    out: dict[tuple[str, int], tuple[str, str, Any]] = {}
    sides = (("in", schema.inputs, node.input), ("out", schema.outputs, node.output))
    for kind, params, names in sides:
        for slot in range(len(names)):
            if slot < len(params):
                p = params[slot]
            elif params and params[-1].option == variadic:
                p = params[-1]
            else:
                return None
            if p.option == variadic and not p.is_homogeneous:
                return None
            out[(kind, slot)] = (p.type_str, p.name, allowed.get(p.type_str))
    return out


def _pin_interface(graph: Any, groups: _Groups, io: str, is64: Any) -> None:
    """Graph inputs/outputs (under io: keep) and values read inside subgraphs stay int64."""
    if io == "keep":
        for value in graph.input:
            if is64(value.name):
                groups.pin(("v", value.name), f"graph input '{value.name}' (io: keep)")
        for value in graph.output:
            if is64(value.name):
                groups.pin(("v", value.name), f"graph output '{value.name}' (io: keep)")
    for node in graph.node:
        for sub in subgraphs(node):
            for name in outer_references(sub):
                if is64(name):
                    groups.pin(("v", name), f"read inside a subgraph of {node.op_type}")


def int64_constants(model: onnx.ModelProto) -> dict[str, Any]:
    """int64 initializers (not overridable by an input) and Constant outputs of the main graph."""
    import numpy as np
    from onnx import numpy_helper

    graph = model.graph
    inputs = {v.name for v in graph.input}
    found = {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.name not in inputs}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            found[node.output[0]] = constant_value(node)
    return {k: v for k, v in found.items() if v is not None and v.dtype == np.int64}


def span(values: Any) -> Range:
    return (int(values.min()), int(values.max())) if values.size else (0, 0)


def _ranges(
    graph: Any, consts: dict[str, Any], types: dict[str, Any], io: str
) -> dict[str, Range | None]:
    """Bounds on the main graph's integer values (None: unknown), in node order."""
    from onnx import numpy_helper

    r: dict[str, Range | None] = {k: span(v) for k, v in consts.items()}
    for value in graph.input:
        t = elem_type(types, value.name)
        if value.name not in r:
            r[value.name] = (LO, HI) if t == INT64 and io == "int32" else TYPE_RANGES.get(t)
    for node in graph.node:
        if node.op_type == "Constant":
            continue
        ins = [r.get(n) if n else None for n in node.input]
        if node.op_type == "Cast" and ins and ins[0] is None:
            ins[0] = TYPE_RANGES.get(elem_type(types, node.input[0]))
        result = _transfer(node.op_type, ins)
        if node.op_type == "ConstantOfShape":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            result = span(numpy_helper.to_array(value)) if value is not None else (0, 0)
        for name in node.output:
            r[name] = result
    return r


def _hull(ranges: list[Range | None]) -> Range | None:
    known = [x for x in ranges if x is not None]
    if not known or len(known) != len(ranges):
        return None
    return (min(x[0] for x in known), max(x[1] for x in known))


def _transfer(op: str, ins: list[Range | None]) -> Range | None:
    """A bound on a node's integer outputs from bounds on its inputs (None: unknown)."""
    first = ins[0] if ins else None
    if op in SAME_AS_FIRST or op == "Cast":
        return first
    if op in ("Concat", "Max", "Min"):
        return _hull(ins)
    if op == "Where":
        return _hull(ins[1:3])
    if op in ("ScatterElements", "ScatterND"):
        return _hull([first, ins[2] if len(ins) > 2 else None])
    if op in ("Pad", "Trilu"):
        return _hull([first, ins[2] if op == "Pad" and len(ins) > 2 else (0, 0)])
    if op == "Range":
        return _hull(ins[:2])
    if op == "Clip" and len(ins) == 3 and ins[1] is not None and ins[2] is not None:
        return (ins[1][0], ins[2][1])
    if first is None or any(x is None for x in ins):
        return None
    a = first
    if op == "Neg":
        return (-a[1], -a[0])
    if op == "Abs":
        low = 0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1]))
        return (low, max(abs(a[0]), abs(a[1])))
    if len(ins) != 2 or ins[1] is None:
        return None
    b = ins[1]
    if op == "Add":
        return (a[0] + b[0], a[1] + b[1])
    if op == "Sub":
        return (a[0] - b[1], a[1] - b[0])
    if op == "Mul":
        products = [x * y for x in a for y in b]
        return (min(products), max(products))
    if op in ("Div", "Mod"):  # |x / y| and |x mod y| never exceed |x| for integers
        m = max(abs(a[0]), abs(a[1]))
        return (-m, m)
    return None


def _decide(
    groups: _Groups,
    consts: dict[str, Any],
    ranges: dict[str, Range | None],
    insert_casts: bool,
    graph: Any,
) -> Plan:
    members: dict[Key, list[Key]] = {}
    for k in list(groups.parent):
        members.setdefault(groups.find(k), []).append(k)
    result = Plan()
    for keys in members.values():
        elements = [k for k in keys if k[0] != "t"]
        if not elements:
            continue
        pins = [groups.hard[k] for k in keys if k in groups.hard]
        pins += _unfit(elements, consts, ranges, graph)
        consumers = [c for k in keys for c in groups.consumer.get(k, [])]
        names = sorted({k[1] for k in elements})
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        computes = bool(groups.free & set(elements)) and any(k[0] == "v" for k in elements)
        if not pins and consumers and not (insert_casts and computes):
            pins = [consumers[0][2]]
        if pins:
            result.kept.append((shown, f"stays int64: {pins[0]}"))
            continue
        result.casts.extend((i, s) for i, s, _ in consumers)
        for k in elements:
            if k[0] == "v":
                result.values.add(k[1])
            else:
                result.constant_uses.setdefault(k[1], []).append((k[2], k[3]))
    return result


def _unfit(
    elements: list[Key], consts: dict[str, Any], ranges: dict[str, Range | None], graph: Any
) -> list[str]:
    """Why some member's values may not fit int32 (empty when all provably fit)."""
    why = []
    for k in elements:
        if k[0] == "u":
            lo, hi = span(consts[k[1]])
            clamped = (graph.node[k[2]].op_type, k[3]) in CLAMPED_SLOTS
            if not clamped and (lo < LO or hi > HI):
                why.append(f"'{k[1]}' holds values outside int32 ({lo}..{hi})")
            continue
        bound = ranges.get(k[1])
        if bound is None:
            why.append(f"cannot bound the values of '{k[1]}'")
        elif bound[0] < LO or bound[1] > HI:
            why.append(f"'{k[1]}' may reach {bound[0]}..{bound[1]}")
    return why
