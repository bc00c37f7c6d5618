"""The package's layering: every import, module-level or inside a function, points down.

The floors, bottom to top (docs/engine.md draws them). A module may import modules of its own
floor or of floors below it; no two modules may import each other, directly or round a
cycle. A new module needs a floor here: the test names it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import edgeflow
from edgeflow.core.codehash import module_name

FLOORS: tuple[tuple[str, ...], ...] = (
    # the leaf: errors, YAML and validation, references and code hashes (core), and the
    # recipe's section models (schema)
    ("edgeflow", "edgeflow.core", "edgeflow.schema"),
    # the model side: samples, the user's PyTorch model, torch ops, output comparison
    # (edgeflow.speech: the keyword-spotting data behind edgeflow.datasets; edgeflow.checkpoint:
    # the model's weights files); the other frameworks' models (TensorFlow/Keras, tf2onnx, JAX)
    (
        "edgeflow.data",
        "edgeflow.datasets",
        "edgeflow.speech",
        "edgeflow.ops",
        "edgeflow.verify",
        "edgeflow.source",
        "edgeflow.checkpoint",
        "edgeflow.frameworks",
    ),
    ("edgeflow.rules",),
    # targets may use rules by name (a profile's rewrites); the host tail uses onnx.cut
    ("edgeflow.targets", "edgeflow.postprocess"),
    # the recipe composes rules and targets
    ("edgeflow.recipe",),
    ("edgeflow.report",),
    # the Stage declaration (stages.base) and the stages; the engine runs them
    # explain: why a module does not export (`edgeflow explain`, and `rewrites: auto`)
    ("edgeflow.stages", "edgeflow.explain"),
    ("edgeflow.engine",),
    ("edgeflow.hydra_app", "edgeflow.fix", "edgeflow.zoo", "edgeflow.scaffold"),
    ("edgeflow.cli", "edgeflow.__main__"),
)
PACKAGE = Path(edgeflow.__file__).resolve().parent


def floor(module: str) -> int:
    """The floor of a module: that of the longest prefix the table names."""
    best, found = -1, None
    for i, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and len(prefix) > best and (prefix != "edgeflow" or module == prefix):
                best, found = len(prefix), i
    if found is None:
        raise AssertionError(f"{module} has no floor: add it to FLOORS in {__file__}")
    return found


def _graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {
            found
            for wanted in _imported(path, package)
            if (found := _module(wanted, files)).startswith("edgeflow") and found != name
        }
    return graph


def _imported(path: Path, package: str) -> list[str]:
    """`import a.b` -> a.b; `from a import b` -> a.b (a module or a name in a); anywhere in
    the file, function bodies and `if TYPE_CHECKING:` included."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            found += [f"{base}.{alias.name}" for alias in node.names]
    return found


def _module(wanted: str, files: dict[str, Path]) -> str:
    """The module `wanted` names, or the module the name `wanted` is in."""
    while wanted and wanted not in files:
        wanted = wanted.rpartition(".")[0]
    return wanted


GRAPH = _graph()


def test_the_graph_is_seen() -> None:
    assert len(GRAPH) > 100
    assert "edgeflow.rules.base" in GRAPH["edgeflow.rules.onnx.casts"]
    # function-local imports count: targets/profile.py imports the rule registry in a method
    assert "edgeflow.rules" in GRAPH["edgeflow.targets.profile"]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down(module: str) -> None:
    up = sorted(t for t in GRAPH[module] if floor(t) > floor(module))
    assert not up, f"{module} (floor {floor(module)}) imports a higher floor: {up}"


def test_the_leaf_imports_only_itself() -> None:
    leaf = {
        m for m in GRAPH if m == "edgeflow" or m.startswith(("edgeflow.core", "edgeflow.schema"))
    }
    outside = {m: sorted(GRAPH[m] - leaf) for m in leaf if GRAPH[m] - leaf}
    assert not outside


def test_no_import_cycles() -> None:
    cycles = [c for c in _strongly_connected(GRAPH) if len(c) > 1]
    assert not cycles, f"modules that import each other: {cycles}"


def test_a_violation_is_caught() -> None:
    graph = {"edgeflow.core.x": {"edgeflow.rules.y"}, "edgeflow.rules.y": {"edgeflow.core.x"}}
    assert floor("edgeflow.rules.y") > floor("edgeflow.core.x")
    assert [sorted(c) for c in _strongly_connected(graph) if len(c) > 1] == [
        ["edgeflow.core.x", "edgeflow.rules.y"]
    ]


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                found.append(component)
    return found
