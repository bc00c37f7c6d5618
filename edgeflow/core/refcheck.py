"""What a recipe's code reference names, found from source before anything is imported.

A recipe reviewed in a pull request must not be able to call `shutil:rmtree` or `os:system`
with arguments of its choosing. A reference may name only code defined in the user's own files
or in an installed distribution: `definition` follows the name through the module's source
(imports, aliases, `from m import *`) with codehash's finder, which reads no module's code, and
refuses anything that lands in the standard library or builtins; `subclass_of` follows a
class's bases the same way (is it a torch.nn.Module? a Rule?). What source cannot show (an
extension module, a base computed at run time) is left to `check_loaded`, which looks at the
imported object before anything calls it.
"""

from __future__ import annotations

import ast
import builtins
import sys
import sysconfig
import types
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from edgeflow.core.codehash import resolve

# value: what an expression computes (a call may return a class); data: a literal, a display
Kind = Literal["class", "function", "module", "value", "data", "unknown"]
_DATA = (
    ast.Constant,
    ast.List,
    ast.Tuple,
    ast.Dict,
    ast.Set,
    ast.JoinedStr,
    ast.ListComp,
    ast.DictComp,
    ast.SetComp,
)

# Classes a recipe's slots require, by every dotted name they are imported under.
TORCH_MODULE = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module"})

_DEPTH = 12  # imports and aliases followed before a name counts as unknown


class StdlibRef(ValueError):
    """A reference that lands in the standard library or builtins."""

    hint = (
        "a recipe names code of your own files or of an installed package: write the function "
        "or class you need in a file of yours and name that"
    )


@dataclass(frozen=True)
class Found:
    """What a name is bound to: its kind, its dotted name where it is defined, and (for a
    class or function in a Python file) the module it sits in and its node."""

    kind: Kind
    name: str
    module: _Module | None = None
    node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef | None = None


@dataclass(frozen=True)
class _Module:
    name: str
    file: Path | None  # None: an extension module, a namespace package
    search: tuple[str, ...]  # where its absolute imports are looked for


def stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {paths[k] for k in ("stdlib", "platstdlib") if k in paths}
    return tuple(sorted(str(Path(d).resolve()) for d in found if d))


def is_stdlib_file(path: Path) -> bool:
    """Whether a file lies in the standard library's folders (and not in a site-packages)."""
    resolved = path.resolve()
    if {"site-packages", "dist-packages"} & set(resolved.parts):
        return False
    return any(resolved.is_relative_to(d) for d in stdlib_dirs())


def is_stdlib_module(name: str, origin: Path | None = None) -> bool:
    """Whether a dotted module name is the standard library's: by its top-level name, or by
    where its file lies."""
    top = name.partition(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return True
    return origin is not None and is_stdlib_file(origin)


def definition(module: str, file: Path, attr: str, search: list[str]) -> Found:
    """What `attr` of the module `module` (its source `file`) is, followed through imports and
    aliases; StdlibRef where it lands in the standard library or builtins."""
    if is_stdlib_module(module, file):
        raise StdlibRef(f"'{module}' is a standard-library module ({file})")
    return _lookup(_Module(module, file, tuple(search)), attr, 0)


def subclass_of(found: Found, targets: frozenset[str], depth: int = 0) -> str | bool | None:
    """The name in `targets` that a class's bases lead to; False when its bases are all known
    and none leads there (or it is no class); None when source cannot tell."""
    if found.name in targets:
        return found.name
    if found.kind == "unknown" or found.kind == "value":
        return None
    if found.kind != "class" or not isinstance(found.node, ast.ClassDef):
        return False
    if depth > _DEPTH or found.module is None:
        return None
    undecided = False
    for base in found.node.bases:
        try:
            parent = _expr(found.module, base, depth + 1)
        except StdlibRef:
            continue  # object, abc.ABC, typing.Generic[...]: no way to the targets through it
        verdict = subclass_of(parent, targets, depth + 1)
        if isinstance(verdict, str):
            return verdict
        undecided = undecided or verdict is None
    return None if undecided else False


def check_loaded(obj: Any, what: str) -> None:
    """Refuse a callable that the standard library or builtins define (the last line of
    defence after `definition`: a name whose origin its source could not show)."""
    if not callable(obj):
        return  # nothing to call: each slot refuses what is not a class or function
    plain = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
    module = getattr(obj, "__module__", None) if isinstance(obj, plain) else type(obj).__module__
    if not isinstance(module, str):
        raise StdlibRef(f"{what}: cannot tell which module defines it ({type(obj).__name__})")
    loaded = sys.modules.get(module)
    file = getattr(loaded, "__file__", None)
    if is_stdlib_module(module, Path(file) if file else None):
        kind = "a" if isinstance(obj, plain) else "an instance of a"
        raise StdlibRef(f"{what} is {kind} standard-library object (defined in {module})")


@lru_cache(maxsize=512)
def _parsed(file: Path, mtime_ns: int) -> tuple[dict[str, ast.stmt], tuple[ast.ImportFrom, ...]]:
    """A module's top-level bindings (the last one of each name; if/try/with bodies
    included) and its star imports."""
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except (SyntaxError, ValueError):
        return {}, ()
    bindings: dict[str, ast.stmt] = {}
    stars: list[ast.ImportFrom] = []

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                bindings[node.name] = node
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    if alias.name == "*" and isinstance(node, ast.ImportFrom):
                        stars.append(node)
                    else:
                        bindings[alias.asname or alias.name.split(".")[0]] = node
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        bindings[target.id] = node
            elif isinstance(node, ast.If | ast.Try | ast.With):
                for part in ("body", "orelse", "finalbody"):
                    walk(getattr(node, part, []))
                for handler in getattr(node, "handlers", []):
                    walk(handler.body)

    walk(tree.body)
    return bindings, tuple(stars)


def _bindings(module: _Module) -> tuple[dict[str, ast.stmt], tuple[ast.ImportFrom, ...]]:
    if module.file is None or module.file.suffix != ".py" or not module.file.is_file():
        return {}, ()
    return _parsed(module.file, module.file.stat().st_mtime_ns)


def _lookup(module: _Module, name: str, depth: int) -> Found:
    """What `name` is bound to at the top level of `module`."""
    full = f"{module.name}.{name}"
    if depth > _DEPTH or module.file is None or module.file.suffix != ".py":
        return Found("unknown", full)
    bindings, stars = _bindings(module)
    node = bindings.get(name)
    if isinstance(node, ast.ClassDef):
        return Found("class", full, module, node)
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return Found("function", full, module, node)
    if isinstance(node, ast.Import):
        for alias in node.names:
            bound = alias.asname or alias.name.split(".")[0]
            if bound == name:
                target = alias.name if alias.asname else alias.name.split(".")[0]
                return _module_found(target)
    if isinstance(node, ast.ImportFrom):
        source = _absolute(module, node)
        for alias in node.names:
            if (alias.asname or alias.name) == name and source is not None:
                return _member(source, alias.name, module.search, depth + 1)
        return Found("unknown", full)
    if isinstance(node, ast.Assign | ast.AnnAssign):
        if node.value is None:
            return Found("unknown", full)
        if isinstance(node.value, ast.Name | ast.Attribute | ast.Subscript):
            return _expr(module, node.value, depth + 1)
        if isinstance(node.value, ast.Lambda):
            return Found("function", full, module)
        return Found("data" if isinstance(node.value, _DATA) else "value", full, module)
    for star in reversed(stars):  # a name no statement binds may come from `import *`
        source = _absolute(module, star)
        if source is None:
            continue
        try:
            found = _member(source, name, module.search, depth + 1)
        except StdlibRef:
            raise StdlibRef(f"'{name}' may come from 'from {source} import *'") from None
        if found.kind != "unknown":
            return found
    if name in vars(builtins):
        raise StdlibRef(f"'{name}' is a builtin")
    return Found("unknown", full)


def _expr(module: _Module, expr: ast.expr, depth: int) -> Found:
    """What a name, attribute chain or subscript (`Rule[Any]`) in `module` refers to."""
    if isinstance(expr, ast.Subscript):
        return _expr(module, expr.value, depth)
    if isinstance(expr, ast.Name):
        return _lookup(module, expr.id, depth)
    if isinstance(expr, ast.Attribute):
        owner = _expr(module, expr.value, depth)
        if owner.kind == "module":
            return _member(owner.name, expr.attr, module.search, depth + 1)
        return Found("unknown", f"{owner.name}.{expr.attr}")
    return Found("value", f"{module.name}.<expression>", module)


def _module_found(name: str) -> Found:
    if is_stdlib_module(name):
        raise StdlibRef(f"'{name}' is a standard-library module")
    return Found("module", name)


def _member(source: str, attr: str, search: tuple[str, ...], depth: int) -> Found:
    """`attr` of the module `source`: a submodule, or what that module binds to the name."""
    if is_stdlib_module(source):
        raise StdlibRef(f"{source}.{attr} is in the standard library")
    found = dict(resolve(f"{source}.{attr}", list(search)))
    if f"{source}.{attr}" in found:
        return Found("module", f"{source}.{attr}")
    spec = found.get(source)
    if spec is None:
        return Found("unknown", f"{source}.{attr}")  # not installed: the import fails at run
    origin = Path(spec.origin) if spec.origin else None
    if origin is not None and is_stdlib_file(origin):
        raise StdlibRef(f"{source}.{attr} is in the standard library ({origin})")
    return _lookup(_Module(source, origin, search), attr, depth)


def _absolute(module: _Module, node: ast.ImportFrom) -> str | None:
    """The absolute module name of a `from ... import`, relative ones against `module`."""
    if node.level == 0:
        return node.module
    package = module.name
    is_package = module.file is not None and module.file.name == "__init__.py"
    parts = package.split(".") if is_package else package.split(".")[:-1]
    if node.level - 1 > len(parts) or (node.level - 1 == len(parts) and not node.module):
        return None
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])]) or None
