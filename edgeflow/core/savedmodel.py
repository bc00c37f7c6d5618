"""A SavedModel is a program: its graph runs when TensorFlow loads it. This reads the graph
from saved_model.pb (every node, and every function of its library) without TensorFlow,
before anything runs, and finds the ops that reach outside the model (files, Python, the
network; edgeflow/core/graph_ops.yaml lists them, docs/recipe.md explains the list).

The file is parsed with a private, minimal copy of TensorFlow's protobuf schema: only the
fields the check reads, with TensorFlow's field numbers (a test compares them with
TensorFlow's own), so a recipe is checked without importing TensorFlow; other fields are
skipped unread.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeflow.core.errors import EdgeflowError

OPS_FILE = Path(__file__).with_name("graph_ops.yaml")

# message -> [(field, number, type, label, message type)]; T: a message type, else a scalar
_STRING, _BYTES, _MESSAGE = 9, 12, 11
_REPEATED = 3
_SCHEMA: dict[str, list[tuple[str, int, int, bool, str]]] = {
    "SavedModel": [("meta_graphs", 2, _MESSAGE, True, "MetaGraphDef")],
    "MetaGraphDef": [
        ("meta_info_def", 1, _MESSAGE, False, "MetaInfoDef"),
        ("graph_def", 2, _MESSAGE, False, "GraphDef"),
        ("saver_def", 3, _MESSAGE, False, "SaverDef"),
    ],
    "MetaInfoDef": [("tags", 4, _STRING, True, "")],
    "SaverDef": [
        ("filename_tensor_name", 1, _STRING, False, ""),
        ("save_tensor_name", 2, _STRING, False, ""),
        ("restore_op_name", 3, _STRING, False, ""),
    ],
    "GraphDef": [
        ("node", 1, _MESSAGE, True, "NodeDef"),
        ("library", 2, _MESSAGE, False, "FunctionDefLibrary"),
    ],
    "NodeDef": [
        ("name", 1, _STRING, False, ""),
        ("op", 2, _STRING, False, ""),
        ("input", 3, _STRING, True, ""),
        ("attr", 5, _MESSAGE, True, "AttrEntry"),
    ],
    "AttrEntry": [("key", 1, _STRING, False, ""), ("value", 2, _MESSAGE, False, "AttrValue")],
    "AttrValue": [
        ("list", 1, _MESSAGE, False, "ListValue"),
        ("s", 2, _BYTES, False, ""),
        ("func", 10, _MESSAGE, False, "NameAttrList"),
    ],
    "ListValue": [("func", 9, _MESSAGE, True, "NameAttrList")],
    "NameAttrList": [("name", 1, _STRING, False, ""), ("attr", 2, _MESSAGE, True, "AttrEntry")],
    "FunctionDefLibrary": [("function", 1, _MESSAGE, True, "FunctionDef")],
    "FunctionDef": [
        ("signature", 1, _MESSAGE, False, "OpDef"),
        ("node_def", 3, _MESSAGE, True, "NodeDef"),
    ],
    "OpDef": [("name", 1, _STRING, False, "")],
}
_PACKAGE = "edgeflow_savedmodel"


@functools.cache
def _saved_model_class() -> Any:
    """The SavedModel message class of the minimal schema, in a pool of its own (TensorFlow's
    real classes, when imported later, do not clash with it)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(
        name="edgeflow_savedmodel.proto", package=_PACKAGE, syntax="proto3"
    )
    for message, fields in _SCHEMA.items():
        described = file.message_type.add(name=message)
        for name, number, kind, repeated, type_name in fields:
            field = described.field.add(name=name, number=number, type=kind)
            field.label = _REPEATED if repeated else 1
            if type_name:
                field.type_name = f".{_PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.SavedModel"))


@dataclass(frozen=True)
class RefusedOps:
    """graph_ops.yaml: op -> why it is refused; ops refused unless an attribute is safe; the
    checkpoint ops the SavedModel's own saver may run."""

    always: dict[str, str]
    unless: dict[str, tuple[str, frozenset[str], str]]  # op -> (attribute, safe values, why)
    saver: frozenset[str]

    @property
    def names(self) -> list[str]:
        return sorted({*self.always, *self.unless})


@functools.cache
def refused_ops() -> RefusedOps:
    from ruamel.yaml import YAML

    data = YAML(typ="safe").load(OPS_FILE.read_text(encoding="utf-8"))
    always = {op: group["why"] for group in data["refused"].values() for op in group["ops"]}
    unless = {
        op: (rule["attr"], frozenset(rule["safe"]), rule["why"])
        for op, rule in data["refused_unless"].items()
    }
    return RefusedOps(always, unless, frozenset(data["saver"]))


@dataclass(frozen=True)
class GraphOp:
    """One refused node: its op, its name, the function it is in (None: the graph itself)."""

    op: str
    node: str
    function: str | None
    why: str

    def render(self) -> str:
        where = f"in function {self.function}" if self.function else "in the graph"
        return f"{self.op} (node '{self.node}' {where}): {self.why}"


def read(folder: Path) -> Any:
    """The folder's SavedModel message, as TensorFlow picks it (saved_model.pb, else
    saved_model.pbtxt); an unreadable or malformed file is the user's EdgeflowError."""
    from google.protobuf import message, text_format

    saved = _saved_model_class()()
    binary = folder / "saved_model.pb"
    path = binary if binary.is_file() else folder / "saved_model.pbtxt"
    try:
        data = path.read_bytes()
        if path is binary:
            saved.ParseFromString(data)
        else:
            text_format.Parse(
                data.decode("utf-8"), saved, allow_unknown_field=True, allow_unknown_extension=True
            )
    except (OSError, UnicodeDecodeError, message.DecodeError, text_format.ParseError) as exc:
        raise EdgeflowError(
            f"{path.name} in {folder} does not parse as a SavedModel "
            f"({type(exc).__name__}: {str(exc)[:200]})",
            "save the model again with tf.saved_model.save or model.export",
        ) from None
    return saved


def find_refused(folder: Path, allowed: Iterable[str] = ()) -> list[GraphOp]:
    """Every node of the SavedModel's graphs and functions whose op reaches outside the
    model, except the ops in `allowed` and the checkpoint ops of its own saver."""
    table, allow = refused_ops(), set(allowed)
    found: list[GraphOp] = []
    for meta in read(folder).meta_graphs:
        library = {f.signature.name: f for f in meta.graph_def.library.function}
        scope, saver_only = _saver(meta, library)
        for node in meta.graph_def.node:
            found += _refused(node, None, node.name in scope, table, allow)
        for name, function in library.items():
            for node in function.node_def:
                found += _refused(node, name, name in saver_only, table, allow)
    return list(dict.fromkeys(found))  # a graph in two meta graphs: once


def check(folder: Path, allowed: Iterable[str] = ()) -> None:
    """Raise GraphOpsRefused if the SavedModel holds ops edgeflow refuses (find_refused)."""
    found = find_refused(folder, allowed)
    if found:
        raise GraphOpsRefused(folder, found)


class GraphOpsRefused(EdgeflowError):
    """A SavedModel whose graph reads or writes files, calls Python or the network."""

    SHOWN = 8

    def __init__(self, folder: Path, found: list[GraphOp]) -> None:
        self.folder, self.found = folder, found
        ops = list(dict.fromkeys(g.op for g in found))
        lines = [g.render() for g in found[: self.SHOWN]]
        if len(found) > self.SHOWN:
            lines.append(f"and {len(found) - self.SHOWN} more")
        super().__init__(
            f"the SavedModel {folder} runs ops that reach outside the model (refused before "
            "TensorFlow loads it):" + "".join(f"\n    {line}" for line in lines),
            f"export the model without them, or, if it must run them, allow them by name: "
            f"source.allow_graph_ops: [{', '.join(ops)}]",
        )


def _refused(
    node: Any, function: str | None, in_saver: bool, table: RefusedOps, allow: set[str]
) -> Iterator[GraphOp]:
    op = node.op
    if op in allow or (in_saver and op in table.saver):
        return
    if op in table.always:
        yield GraphOp(op, node.name, function, table.always[op])
    elif op in table.unless:
        attr, safe, why = table.unless[op]
        values = {e.value.s.decode("utf-8", "replace") for e in node.attr if e.key == attr}
        if values - safe:
            yield GraphOp(op, node.name, function, f"{why}: {attr} {sorted(values - safe)[0]!r}")


def _saver(meta: Any, library: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The graph nodes the saver_def's save tensor and restore op depend on, and the
    functions that only they call (directly or not): where checkpoint ops belong."""
    nodes = {n.name: n for n in meta.graph_def.node}
    roots = [meta.saver_def.save_tensor_name, meta.saver_def.restore_op_name]
    scope: set[str] = set()
    todo = [_node_name(r) for r in roots if r]
    while todo:
        name = todo.pop()
        if name in nodes and name not in scope:
            scope.add(name)
            todo += [_node_name(i) for i in nodes[name].input]
    saver = _closure((c for n in scope for c in _calls(nodes[n], library)), library)
    others = [c for name, n in nodes.items() if name not in scope for c in _calls(n, library)]
    others += [name for name in library if name not in saver]
    return scope, saver - _closure(others, library)


def _closure(roots: Iterable[str], library: dict[str, Any]) -> set[str]:
    """The functions these call, directly or through others (themselves included)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in library and name not in seen:
            seen.add(name)
            todo += [c for n in library[name].node_def for c in _calls(n, library)]
    return seen


def _calls(node: Any, library: dict[str, Any]) -> Iterator[str]:
    """The library functions a node calls: its op, and every function in its attributes
    (f of a call, the branches of If/Case, the body of While, nested in lists and attrs)."""
    if node.op in library:
        yield node.op
    yield from _attr_functions(node.attr)


def _attr_functions(entries: Iterable[Any]) -> Iterator[str]:
    for entry in entries:
        value = entry.value
        functions = [value.func] if value.HasField("func") else []
        functions += list(value.list.func)
        for function in functions:
            yield function.name
            yield from _attr_functions(function.attr)


def _node_name(tensor: str) -> str:
    """'^name' (a control input) and 'name:0' (an output) -> 'name'."""
    return tensor.lstrip("^").split(":")[0]
