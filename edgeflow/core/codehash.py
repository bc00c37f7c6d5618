"""Source hashes of Python code and of every module it imports, found without running it.

A cache key that hashes only the file a recipe names goes stale when that file imports a
helper the user then edits. `closure` follows imports statically (`import a.b`, `from .m import
x`, `from pkg import sub`, `importlib.import_module("literal")`, also inside functions) and
hashes each module file it reaches that `follow` accepts: by default the user's own code, i.e.
everything but the standard library and installed distributions (those enter keys by their
versions). Modules are found with importlib's path finder, which reads no module's code.
A module imported under a name computed at run time cannot be seen; docs/engine.md says so.

This module imports nothing of edgeflow.
"""

from __future__ import annotations

import ast
import hashlib
import json
import site
import sys
import sysconfig
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

Follow = Callable[[str, Path], bool]


_RECORDINGS: list[dict[str, str]] = []  # open `recording()`s, innermost last


@contextmanager
def recording() -> Iterator[dict[str, str]]:
    """Every file and folder hashed while this is open: its resolved path (a folder's ending
    in "/") -> the hash. `edgeflow run` keeps them in its up-to-date stamp
    (edgeflow/engine/uptodate.py): whatever a stage key hashed, the stamp checks again."""
    found: dict[str, str] = {}
    _RECORDINGS.append(found)
    try:
        yield found
    finally:
        _RECORDINGS.remove(found)


def _record(key: str, digest: str) -> str:
    for found in _RECORDINGS:
        found[key] = digest
    return digest


def file_sha256(path: Path) -> str:
    """Content hash of a file, memoised per (path, size, mtime) within the process."""
    st = path.stat()
    resolved = str(path.resolve())
    return _record(resolved, _sha256(resolved, st.st_size, st.st_mtime_ns))


def tree_sha256(folder: Path) -> str:
    """Content hash of a folder (a SavedModel): every file's path inside it and its hash."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f"{path.relative_to(folder).as_posix()}\0{file_sha256(path)}\n".encode())
    return _record(str(folder.resolve()) + "/", h.hexdigest())


def files_sha256(root: Path, pattern: str = "*") -> dict[str, str]:
    """Relative path -> content hash of every file under `root` matching `pattern`, but for
    bytecode caches (`__pycache__`): a package's files, as the cache keys and `edgeflow run`'s
    up-to-date stamp hash edgeflow's own."""
    return {
        p.relative_to(root).as_posix(): file_sha256(p)
        for p in sorted(root.rglob(pattern))
        if p.is_file() and "__pycache__" not in p.relative_to(root).parts
    }


def json_digest(payload: Any) -> str:
    """One hash of a JSON-able value (keys sorted): what a cache key or a stamp records."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@lru_cache(maxsize=4096)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@lru_cache(maxsize=1)
def _third_party_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    dirs.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    dirs.add(site.getusersitepackages())
    dirs.update(p for p in sys.path if Path(p).name in ("site-packages", "dist-packages"))
    return tuple(sorted(str(Path(d).resolve()) for d in dirs if d))


def is_third_party(path: Path) -> bool:
    """Whether a module file belongs to the standard library or an installed distribution."""
    text = str(path.resolve())
    parts = Path(text).parts
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    return any(text.startswith(d.rstrip("/") + "/") for d in _third_party_dirs())


def user_code(name: str, path: Path) -> bool:
    """The default `follow`: the user's own modules, not the stdlib or installed packages."""
    return not is_third_party(path)


def closure(
    roots: Iterable[Path], follow: Follow = user_code, search: Iterable[str] = ()
) -> dict[str, str]:
    """Module name -> sha256 for each root file and each module it reaches by imports."""
    return {name: file_sha256(path) for name, path in closure_files(roots, follow, search).items()}


def closure_files(
    roots: Iterable[Path],
    follow: Follow = user_code,
    search: Iterable[str] = (),
    names: Iterable[str] = (),
) -> dict[str, Path]:
    """Module name -> file for each root file and each module it reaches by imports.

    `search` adds folders to look for top-level modules in, before sys.path (the folder of a
    recipe's `file.py:Name`, which edgeflow puts on sys.path when it loads the file). `names`
    are the roots' dotted names where known (a module in a namespace package, whose folders
    have no __init__.py to tell them by); the others get module_name's."""
    roots = [Path(r).resolve() for r in roots]
    known = list(names)
    path = [*search, *(str(r.parent) for r in roots), *(p or "." for p in sys.path)]
    path += [str(package_root(r)) for r in roots]
    search_path = list(dict.fromkeys(str(Path(p).resolve()) for p in path))
    found: dict[str, Path] = {}
    todo = [(known[i] if i < len(known) else module_name(r), r) for i, r in enumerate(roots)]
    while todo:
        name, file = todo.pop()
        if name in found:
            continue
        found[name] = file
        if file.suffix != ".py":
            continue  # an extension module: hashed, not read
        for wanted in _imports(str(file), file.stat().st_mtime_ns, name, file.name):
            for candidate, spec in resolve(wanted, search_path):
                origin = Path(spec.origin) if spec.origin else None
                if origin is None or not origin.is_file() or candidate in found:
                    continue
                if follow(candidate, origin):
                    todo.append((candidate, origin))
    return dict(sorted(found.items()))


def digest(hashes: dict[str, str]) -> str:
    """One hash for a closure (what a cache key records)."""
    text = "\n".join(f"{k} {v}" for k, v in sorted(hashes.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def package_root(file: Path) -> Path:
    """The folder a file's top-level package sits in (its own folder outside packages)."""
    folder = file.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        folder = folder.parent
    return folder


def module_name(file: Path) -> str:
    """The dotted name a file has inside its package folders (`pkg/sub/m.py` -> pkg.sub.m)."""
    parts = [] if file.name == "__init__.py" else [file.stem]
    folder = file.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts) or file.stem


@lru_cache(maxsize=4096)
def _imports(file: str, mtime_ns: int, name: str, filename: str) -> tuple[str, ...]:
    """Absolute module names a file imports anywhere in it (memoised per file version)."""
    try:
        tree = ast.parse(Path(file).read_bytes(), filename=file)
    except (SyntaxError, ValueError):
        return ()  # it will fail loudly when it runs; nothing to follow here
    package = name if filename == "__init__.py" else name.rpartition(".")[0]
    wanted: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            wanted += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            if base is None:
                continue
            wanted.append(base)
            wanted += [f"{base}.{a.name}" if base else a.name for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                wanted.append(first.value)
    return tuple(dict.fromkeys(w for w in wanted if w))


def _absolute(module: str | None, level: int, package: str) -> str | None:
    if level == 0:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None  # beyond the top-level package: an ImportError at run time
    base = parts[: len(parts) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def find_spec(name: str) -> ModuleSpec | None:
    """importlib's spec of a dotted module name on sys.path, without importing its packages
    (importlib.util.find_spec("a.b") runs a/__init__.py)."""
    search = [str(Path(p or ".").resolve()) for p in sys.path]
    found = resolve(name, search)
    return found[-1][1] if found and found[-1][0] == name else None


def resolve(name: str, search: list[str]) -> list[tuple[str, ModuleSpec]]:
    """The specs of `name` and of each package above it (importing a.b.c runs a and a.b)."""
    parts = name.split(".")
    found: list[tuple[str, ModuleSpec]] = []
    locations: list[str] | None = search
    for i in range(len(parts)):
        full = ".".join(parts[: i + 1])
        if locations is None:
            break
        spec = _find(full, locations)
        if spec is None:
            break
        found.append((full, spec))
        sub = spec.submodule_search_locations
        locations = list(sub) if sub is not None else None
    return found


def _find(name: str, locations: list[str]) -> ModuleSpec | None:
    """PathFinder.find_spec(name, locations), with a namespace package's portions as a plain
    list: PathFinder's _NamespacePath looks the parent package up in sys.modules (a KeyError
    for a package nobody imported)."""
    portions: list[str] = []
    for entry in locations:
        finder = _finder(entry)
        if finder is None:
            continue
        try:
            spec = finder.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        if spec.loader is not None:
            return spec  # a module or a regular package: the first one on the path wins
        portions += list(spec.submodule_search_locations or [])
    if not portions:
        return None
    spec = ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = portions
    return spec


def _finder(entry: str) -> Any:
    """The path-entry finder for a folder (or zip) on the path, as PathFinder finds it."""
    if entry in sys.path_importer_cache:
        return sys.path_importer_cache[entry]
    for hook in sys.path_hooks:
        try:
            finder = hook(entry)
        except ImportError:
            continue
        sys.path_importer_cache[entry] = finder
        return finder
    return None
