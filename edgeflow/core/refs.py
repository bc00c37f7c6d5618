"""References from a recipe to code ("pkg.mod:Attr", "file.py:Attr") and files, resolved lazily."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeflow.core.codehash import (
    closure_files,
    digest,
    file_sha256,
    find_spec,
    module_name,
    tree_sha256,
)
from edgeflow.core.errors import EdgeflowError
from edgeflow.core.refcheck import (
    Found,
    StdlibRef,
    check_loaded,
    definition,
    is_stdlib_file,
    is_stdlib_module,
)

__all__ = ["ImportRef", "file_sha256", "top_level_names", "tree_sha256"]


ONLY = "a recipe may name code of your own files or of an installed package only"

# reference -> the hashes of its closure's files when this process last loaded it
_LOADED: dict[str, dict[str, str]] = {}


@dataclass(frozen=True)
class ImportRef:
    """`package.module:Attr` or `path/to/file.py:Attr` (a path relative to the recipe's folder)."""

    module: str  # dotted module name, or an absolute file path when is_file
    attr: str
    is_file: bool

    @classmethod
    def parse(cls, text: str, base_dir: Path) -> ImportRef:
        module, sep, attr = text.rpartition(":")
        if not sep or not module or not attr.isidentifier():
            raise ValueError(f"expected 'package.module:Name' or 'path/file.py:Name' (got {text})")
        if module.endswith(".py"):
            return cls(str((base_dir / module).resolve()), attr, is_file=True)
        if not all(part.isidentifier() for part in module.split(".")):
            raise ValueError(f"'{module}' is not a dotted module name")
        return cls(module, attr, is_file=False)

    def __str__(self) -> str:
        return f"{self.module}:{self.attr}"

    def source_file(self) -> Path | None:
        """The file that defines the module, found without executing it (nor its packages)."""
        if self.is_file:
            return Path(self.module)
        spec = find_spec(self.module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None
        return Path(spec.origin)

    def check(self, code_only: bool = True) -> Found:
        """What the reference names, from source (nothing is imported): ValueError unless the
        module exists and plausibly defines `attr`, and (`code_only`) that is no module or
        constant; StdlibRef (a ValueError with a hint) where it is, or leads through imports
        to, the standard library or builtins."""
        if not self.is_file and is_stdlib_module(self.module):
            raise StdlibRef(f"{self} names the standard library ('{self.module}'): {ONLY}")
        path = self.source_file()
        if path is None or not path.is_file():
            what = "file" if self.is_file else "module"
            raise ValueError(f"{what} '{self.module}' not found")
        names = top_level_names(path.read_text(encoding="utf-8"))
        if names is not None and self.attr not in names:
            from edgeflow.core.suggest import closest

            guess = closest(self.attr, sorted(names))
            hint = f" (did you mean '{guess}'?)" if guess else ""
            raise ValueError(f"'{self.attr}' is not defined in {path.name}{hint}")
        module = module_name(path) if self.is_file else self.module
        search = [str(path.parent)] if self.is_file else []
        search += [str(Path(p or ".").resolve()) for p in sys.path]
        try:
            found = definition(module, path, self.attr, search)
        except StdlibRef as exc:
            raise StdlibRef(f"{self} names the standard library ({exc}): {ONLY}") from None
        if code_only and found.kind in ("module", "data"):
            what = f"a module ({found.name})" if found.kind == "module" else "a constant"
            raise ValueError(f"{self} is {what}, not a class or function")
        return found

    def files(self) -> dict[str, Path]:
        """The module's file and the file of every module of the user's that it imports
        (codehash.closure_files), by module name."""
        path = self.source_file()
        if path is None or not path.is_file():
            return {}
        if self.is_file:
            return closure_files([path], search=[str(path.parent)])
        return closure_files([path], names=[self.module])

    def fingerprint(self) -> dict[str, Any]:
        """What a cache key records: the reference, and the source of its module and of every
        module of the user's that it imports."""
        files = self.files()
        hashes = {name: file_sha256(path) for name, path in files.items()}
        return {"ref": str(self), "source_sha256": digest(hashes) if files else "unknown"}

    @property
    def _module_name(self) -> str:
        """The name the module has in sys.modules (a file gets a name of its own)."""
        if not self.is_file:
            return self.module
        return "edgeflow_user_" + hashlib.sha1(self.module.encode()).hexdigest()[:12]

    def load(self) -> Any:
        """Import the module (or execute the file) and return the attribute.

        A process that loads the same reference again after the user's code changed (a
        notebook, a test session) imports the changed code afresh: the module and the user's
        modules it imports are dropped from sys.modules when any of their files changed since
        the last load, so a stage never runs old code under the new code's cache key."""
        if is_stdlib_file(Path(self.module)) if self.is_file else is_stdlib_module(self.module):
            raise EdgeflowError(f"{self} names the standard library: {ONLY}", StdlibRef.hint)
        files = self.files()
        hashes = {name: file_sha256(path) for name, path in files.items()}
        name = self._module_name
        if _LOADED.get(str(self)) not in (None, hashes):
            for stale in (name, *files):
                if stale != "edgeflow" and not stale.startswith("edgeflow."):
                    sys.modules.pop(stale, None)
        try:
            if self.is_file:
                module = sys.modules.get(name)
                if module is None:
                    # as for a script: `import helpers` finds the file's neighbours
                    folder = str(Path(self.module).parent)
                    if folder not in sys.path:
                        sys.path.append(folder)
                    spec = importlib.util.spec_from_file_location(name, self.module)
                    assert spec is not None and spec.loader is not None
                    module = importlib.util.module_from_spec(spec)
                    sys.modules[name] = module
                    try:
                        spec.loader.exec_module(module)
                    except BaseException:
                        sys.modules.pop(name, None)  # no half-run module for the next load
                        raise
            else:
                module = importlib.import_module(self.module)
            _LOADED[str(self)] = hashes
        except ImportError as exc:
            raise EdgeflowError(f"cannot import '{self.module}': {exc}") from exc
        except EdgeflowError:
            raise
        except Exception as exc:  # the user's module failed as it ran: their error, located
            raise EdgeflowError(
                f"importing {self.module} raised {type(exc).__name__}: {exc} ({user_frame(exc)})",
                "import the module in Python to reproduce it",
            ) from exc
        try:
            found = getattr(module, self.attr)
        except AttributeError:
            raise EdgeflowError(f"'{self.module}' has no attribute '{self.attr}'") from None
        try:  # what its source could not show: nothing of the standard library is called
            check_loaded(found, str(self))
        except StdlibRef as exc:
            raise EdgeflowError(f"{exc}: {ONLY}", StdlibRef.hint) from None
        return found


def top_level_names(source: str) -> set[str] | None:
    """Names bound at a module's top level; None when they cannot be known statically."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            return None
    return names


def user_frame(exc: BaseException) -> str:
    """Where in the user's code an exception was raised: its innermost frame outside edgeflow
    and installed packages (a SyntaxError: its own file and line), as `file:line`."""
    from edgeflow.core.codehash import is_third_party

    if isinstance(exc, SyntaxError) and exc.filename:
        return f"at {Path(exc.filename).name}:{exc.lineno}"
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    edgeflow_dir = str(Path(__file__).resolve().parent.parent)
    for frame in reversed(frames):
        path = Path(frame.filename)
        if not str(path.resolve()).startswith(edgeflow_dir) and not is_third_party(path):
            return f"at {path.name}:{frame.lineno}"
    return f"at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "no traceback"
