"""The machinery every ast.* rule shares: parse the methods forward reaches, let the rule
transform them, compile the result and give it to the module.

`rewrite(model, ctx, rule, transform)` deep-copies the model, and for every module instance
in it whose class is user code (not torch's own) parses `forward` and the methods it reaches
through `self.<name>(...)` calls, transitively. The rule's transform edits one `Method` (an
`ast.FunctionDef` with original file line numbers) in place and returns how many sites it
rewrote. Each distinct result is compiled once, with the function's own globals (plus the
names the rule injected) and closure cells, and registered in `linecache` so that tracebacks,
`inspect.getsource` and `torch.jit.script` see the rewritten text.

The new methods go into a generated subclass of the instance's class (same name, module and
qualname), and the instance's `__class__` is switched to it. Binding with `types.MethodType`
on the instance is not enough: `torch.fx.symbolic_trace` traces `type(root).forward`.
"""

from __future__ import annotations

import ast
import builtins
import copy
import hashlib
import inspect
import linecache
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.ast import _fold, _scope
from edgeflow.rules.base import RewriteContext, RuleResult, Site

if TYPE_CHECKING:
    import torch

LIBRARIES = ("torch", "torchvision", "torchaudio", "torchtext")
RUNTIME = "_edgeflow_rt"  # the name rewritten code calls edgeflow.rules.ast._runtime by
MISSING: Any = object()


@dataclass
class Method:
    """One method of one module instance, parsed for a rule to transform in place."""

    instance: torch.nn.Module
    name: str
    function: types.FunctionType  # as found on the instance's class (maybe rewritten before)
    tree: ast.FunctionDef  # a private copy; line numbers are those of `filename`
    filename: str
    is_root: bool  # forward of the model itself: ctx.inputs describe its arguments
    ctx: RewriteContext
    kept: list[Site] = field(default_factory=list)  # sites left as they are, with why
    inject: dict[str, Any] = field(default_factory=dict)
    _locals: set[str] | None = None

    @property
    def owner(self) -> str:
        return f"{class_name(type(self.instance))}.{self.name}"

    @property
    def self_name(self) -> str:
        args = self.tree.args
        first = (*args.posonlyargs, *args.args)
        return first[0].arg if first else "self"

    @property
    def locals(self) -> set[str]:
        if self._locals is None:
            self._locals = _scope.local_names(self.tree)
        return self._locals

    def where(self, node: ast.AST) -> str:
        return f"{self.filename}:{getattr(node, 'lineno', '?')}"

    def note(self, node: ast.AST, text: str) -> None:
        """Record why a site was left as it is."""
        self.kept.append(Site.kept(self.where(node), f"{self.owner}: {text}"))

    def is_builtin(self, name: str) -> bool:
        return name not in self.locals and name not in self.function.__globals__

    def resolve(self, node: ast.AST) -> Any:
        """The object a `name.attr.attr` chain refers to through the function's globals,
        closure, builtins or `self`; MISSING when that cannot be known without running it."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return MISSING
        obj = self._resolve_name(node.id)
        for attr in reversed(parts):
            if obj is MISSING or isinstance(inspect.getattr_static(obj, attr, None), property):
                return MISSING
            try:
                obj = getattr(obj, attr)
            except Exception:
                return MISSING
        return obj

    def _resolve_name(self, name: str) -> Any:
        if name == self.self_name:
            return self.instance
        if name in self.locals:
            return MISSING
        if name in self.inject:
            return self.inject[name]
        fn = self.function
        if name in fn.__globals__:
            return fn.__globals__[name]
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))
        if name in cells:
            try:
                return cells[name].cell_contents
            except ValueError:
                return MISSING
        return getattr(builtins, name, MISSING)

    def global_name(self, obj: Any, preferred: str) -> str:
        """A global name for `obj` in the rewritten function: an existing one, or one injected."""
        taken = self.locals | set(self.function.__globals__) | set(self.inject)
        for candidate in (preferred, f"_edgeflow_{preferred}"):
            if self._resolve_name(candidate) is obj:
                return candidate
        name = _scope.fresh_name(
            preferred if preferred not in taken else f"_edgeflow_{preferred}", taken
        )
        self.inject[name] = obj
        return name

    def torch_name(self) -> ast.Name:
        """An expression for the torch module inside the rewritten function."""
        import torch

        return ast.Name(id=self.global_name(torch, "torch"), ctx=ast.Load())

    def runtime(self, helper: str) -> ast.Attribute:
        """`_edgeflow_rt.<helper>`: a function of edgeflow.rules.ast._runtime."""
        from edgeflow.rules.ast import _runtime

        name = self.global_name(_runtime, RUNTIME)
        return ast.Attribute(value=ast.Name(id=name, ctx=ast.Load()), attr=helper, ctx=ast.Load())

    def fold(self) -> int:
        """Fold constant expressions and dead branches of the tree."""
        return _fold.fold(self.tree, self.is_builtin)


Transform = Callable[[Method], int]


def class_name(cls: type) -> str:
    return getattr(cls, "__edgeflow_base__", cls).__name__


def rewrite(
    model: torch.nn.Module, ctx: RewriteContext, rule: str, transform: Transform, wanted: str
) -> RuleResult[Any]:
    """Apply `transform` to every method forward reaches, in a deep copy of `model`.
    `wanted` names what the rule looks for, for the site given when it finds nothing."""
    copy_ = copy.deepcopy(model)
    compiled: dict[tuple[Any, str], types.FunctionType] = {}
    classes: dict[tuple[Any, ...], type] = {}
    sources: dict[str, str] = {}
    sites: dict[Site, None] = {}  # in order, once each
    looked: dict[str, None] = {}
    matches = 0
    files: dict[str, ast.Module] = {}
    for path, instance in copy_.named_modules():
        new: dict[str, types.FunctionType] = {}
        for method in reached_methods(instance, path == "", ctx, files, sites):
            looked[method.owner] = None
            count = transform(method)
            sites.update(dict.fromkeys(method.kept))
            if not count:
                continue
            ast.fix_missing_locations(method.tree)
            text = ast.unparse(method.tree)
            key = (method.function, text)
            if key not in compiled:
                compiled[key] = _compile(method, text, rule)
                matches += count
                owner = method.owner
                sites[Site.changed(owner, f"{count} site(s) rewritten")] = None
                if sources.setdefault(owner, text + "\n") != text + "\n":
                    sources[f"{owner}@{path}"] = text + "\n"  # other instances, other code
            new[method.name] = compiled[key]
        if new:
            _give(instance, new, classes)
    if not compiled and looked:
        sites[Site.not_applicable(f"no {wanted} in {', '.join(looked)}")] = None
    elif not compiled:
        why = "no method could be read" if sites else "the model has only torch's own modules"
        sites[Site.not_applicable(why)] = None
    return RuleResult(copy_, matches=matches, sites=list(sites), sources=sources)


def reached_methods(
    instance: torch.nn.Module,
    is_root: bool,
    ctx: RewriteContext,
    files: dict[str, ast.Module],
    sites: dict[Site, None],
) -> list[Method]:
    """forward of a user-defined module and the methods it reaches via `self.<name>(...)`."""
    cls = type(instance)
    todo, seen, found = ["forward"], {"forward"}, []
    while todo:
        name = todo.pop(0)
        fn = inspect.getattr_static(cls, name, None)
        if not isinstance(fn, types.FunctionType) or _library(fn):
            continue
        parsed = _parse(fn, files)
        if isinstance(parsed, str):
            sites[Site.kept(f"{class_name(cls)}.{name}", parsed)] = None
            continue
        tree, filename = parsed
        method = Method(instance, name, fn, tree, filename, is_root and name == "forward", ctx)
        found.append(method)
        for node in _scope.walk_scope(tree):
            callee = node.func if isinstance(node, ast.Call) else None
            if (
                isinstance(callee, ast.Attribute)
                and isinstance(callee.value, ast.Name)
                and callee.value.id == method.self_name
                and callee.attr not in seen
                and isinstance(inspect.getattr_static(cls, callee.attr, None), types.FunctionType)
            ):
                seen.add(callee.attr)
                todo.append(callee.attr)
    return found


def _library(fn: types.FunctionType) -> bool:
    return (fn.__module__ or "").split(".")[0] in LIBRARIES


def _parse(
    fn: types.FunctionType, files: dict[str, ast.Module]
) -> tuple[ast.FunctionDef, str] | str:
    """A private copy of the function's tree with file line numbers, or why there is none."""
    if hasattr(fn, "__wrapped__"):
        return "decorated methods are not rewritten"
    stored = getattr(fn, "__edgeflow_ast__", None)
    if stored is not None:
        return copy.deepcopy(stored), fn.__edgeflow_file__  # type: ignore[attr-defined]
    try:
        filename = inspect.getsourcefile(fn)
    except TypeError:
        filename = None
    lines = linecache.getlines(filename) if filename else []
    if not filename or not lines:
        return "source not available (defined interactively or in compiled code)"
    if filename not in files:
        try:
            files[filename] = ast.parse("".join(lines), filename)
        except SyntaxError as exc:
            return f"cannot parse {filename}: {exc}"
    first = fn.__code__.co_firstlineno
    for node in ast.walk(files[filename]):
        if isinstance(node, ast.FunctionDef) and node.name == fn.__name__:
            start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            if start == first:
                if node.decorator_list:
                    return "decorated methods are not rewritten"
                return copy.deepcopy(node), filename
    return f"no definition of {fn.__name__} at {filename}:{first}"


def _compile(method: Method, text: str, rule: str) -> types.FunctionType:
    """Compile the rewritten tree into a function with the original's globals and closure."""
    fn, tree = method.function, method.tree
    freevars = fn.__code__.co_freevars
    body: list[ast.stmt] = [tree]
    if freevars:  # define the free variables in an enclosing function; cells are swapped below
        outer = ast.parse(f"def __edgeflow_outer__():\n    {' = '.join(freevars)} = None")
        outer_def = outer.body[0]
        assert isinstance(outer_def, ast.FunctionDef)
        outer_def.body += [tree, ast.Return(ast.Name(tree.name, ast.Load()))]
        body = [outer_def]
    full = ast.unparse(ast.Module(body=body, type_ignores=[])) + "\n"
    digest = hashlib.sha1(full.encode()).hexdigest()[:8]
    filename = f"<edgeflow {rule}: {method.owner} {digest}>"
    code = compile(full, filename, "exec")
    linecache.cache[filename] = (len(full), None, full.splitlines(True), filename)
    inner = _code_named(code, tree.name)
    namespace = _namespace(fn, method.inject, digest)
    cells = dict(zip(freevars, fn.__closure__ or (), strict=True))
    closure = tuple(cells[name] for name in inner.co_freevars)
    new = types.FunctionType(inner, namespace, fn.__name__, fn.__defaults__, closure or None)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    new.__annotations__ = dict(fn.__annotations__)
    new.__edgeflow_ast__ = copy.deepcopy(tree)  # type: ignore[attr-defined]
    new.__edgeflow_file__ = method.filename  # type: ignore[attr-defined]
    new.__edgeflow_source__ = text + "\n"  # type: ignore[attr-defined]
    new.__edgeflow_rules__ = (*getattr(fn, "__edgeflow_rules__", ()), rule)  # type: ignore[attr-defined]
    return new


def _namespace(fn: types.FunctionType, inject: dict[str, Any], digest: str) -> dict[str, Any]:
    """The rewritten function's globals: the original's plus the injected names, as the
    namespace of a module registered in sys.modules. torch.export (strict) resolves globals
    through `sys.modules[__name__]`, so a bare dict would hide the injected names from it,
    and writing them into the user's own module would change that module."""
    name = f"{fn.__globals__.get('__name__', 'edgeflow')}.__edgeflow_{digest}__"
    module = sys.modules.get(name) or types.ModuleType(name)
    module.__dict__.update(fn.__globals__)
    module.__dict__.update(inject)
    module.__dict__["__name__"] = name
    sys.modules[name] = module
    return module.__dict__


def _code_named(code: types.CodeType, name: str) -> types.CodeType:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name:
                return const
            if const.co_name == "__edgeflow_outer__":
                return _code_named(const, name)
    raise AssertionError(f"compiled code has no function {name}")


def _give(instance: torch.nn.Module, new: dict[str, types.FunctionType], classes: dict) -> None:
    """Switch the instance to a generated subclass of its class that holds the new methods."""
    cls = type(instance)
    base = getattr(cls, "__edgeflow_base__", cls)
    methods = {k: v for k, v in vars(cls).items() if isinstance(v, types.FunctionType)}
    methods = (methods if cls is not base else {}) | new
    key = (base, tuple(sorted((k, id(v)) for k, v in methods.items())))
    if key not in classes:
        namespace = {
            **methods,
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            "__doc__": base.__doc__,
            "__edgeflow_base__": base,
        }
        classes[key] = type(base.__name__, (base,), namespace)
    instance.__class__ = classes[key]


def rewritten_sources(model: torch.nn.Module) -> dict[str, str]:
    """The current text of every rewritten method in a model, by `Class.method`."""
    found: dict[str, str] = {}
    for _, module in model.named_modules():
        for name, fn in vars(type(module)).items():
            text = getattr(fn, "__edgeflow_source__", None)
            if text is not None:
                found.setdefault(f"{class_name(type(module))}.{name}", text)
    return found


def user_error(method: Method, node: ast.AST, message: str, hint: str) -> EdgeflowError:
    """An EdgeflowError located at a site of the user's source."""
    return EdgeflowError(f"{method.where(node)}: {method.owner}: {message}", hint)
