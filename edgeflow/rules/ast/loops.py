"""ast.unroll_loops: unroll `for` loops whose iterations are known from the module instance.

Handled iterables (values read from the instance when the rule is applied, so attributes
such as `self.n` are taken to be constants of the model):
- `range(a[, b[, c]])` whose arguments are literals, module-level constants, `self.<int>`,
  or `len(<ModuleList/Sequential/ModuleDict/tuple attribute>)`;
- a ModuleList or Sequential (`for blk in self.blocks`), a ModuleDict (`self.heads`,
  `.keys()`, `.values()`, `.items()`), a tuple or list of constants (`self.strides`);
- `enumerate(...)`, `zip(...)` and `reversed(...)` of those; in `zip`, a plain name or
  attribute of unknown length (`zip(self.heads, features)`) is indexed (`features[0]`, ...)
  up to the known length, so it must be at least that long (zip would stop early).
Each iteration becomes a copy of the body with the loop variable replaced by its value
(`self.blocks[0]`, `2`); if the body rebinds the variable, `i = <value>` is assigned instead.
`for ... else` bodies follow the unrolled iterations. Constant expressions and `if` tests that
become constant are folded (`if i == 0:`). `self.blocks[self.idx]` with an index that is such
a constant becomes `self.blocks[2]`.
Not unrolled (a reason is given): loops with `break`/`continue`, over anything else (tensors,
data-dependent ranges), longer than `max_iterations`, whose body rebinds a name the iterable
uses. `while` loops are not looked at.
"""

from __future__ import annotations

import ast
import copy
from typing import Any

from pydantic import Field

from edgeflow.rules.ast import _fold, _scope
from edgeflow.rules.ast._source import MISSING, Method, rewrite
from edgeflow.rules.base import AstRule, RewriteContext, RuleOptions, RuleResult
from edgeflow.rules.fixes import Fix

BEFORE = """\
def forward(self, x):
    for i in range(self.depth):
        x = self.blocks[i](x) if i > 0 else self.stem(x)
    return self.heads[self.task](x)
"""
AFTER = """\
def forward(self, x):
    x = self.stem(x)
    x = self.blocks[1](x)
    x = self.blocks[2](x)
    return self.heads['cls'](x)
"""


class UnrollLoops(AstRule):
    name = "ast.unroll_loops"
    description = "Unroll for loops over constant ranges and module lists; constant-index them."
    fixes = (Fix.op("Loop"), Fix.op("Scan"), Fix.capture("loop"))
    example = (BEFORE, AFTER)

    class Options(RuleOptions):
        max_iterations: int = Field(64, ge=1)  # longer loops are left as they are

    def apply(self, model: Any, opts: Options, ctx: RewriteContext) -> RuleResult[Any]:
        def transform(method: Method) -> int:
            unroller = _Unroller(method, opts.max_iterations)
            unroller.visit(method.tree)
            count = unroller.count + _constant_indices(method)
            if count:
                method.fold()
            return count

        wanted = "for loop over a constant range or module list, or constant container index"
        return rewrite(model, ctx, self.name, transform, wanted)


def _constant_indices(method: Method) -> int:
    """`self.blocks[self.idx]` -> `self.blocks[2]` when the index is a constant of the model."""
    import torch

    containers = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)
    mapping: dict[int, ast.expr] = {}
    for node in _scope.walk_scope(method.tree):
        if not isinstance(node, ast.Subscript) or isinstance(node.slice, ast.Constant):
            continue
        if not isinstance(method.resolve(node.value), containers):
            continue
        key = _constant(node.slice, method)
        if isinstance(key, int | str) and not isinstance(key, bool):
            mapping[id(node.slice)] = ast.Constant(key)
    _scope.replace_nodes(method.tree, mapping)
    return len(mapping)


def _constant(node: ast.AST, method: Method) -> Any:
    """The value of an expression made of literals and constants of the model, else MISSING."""
    try:
        return _fold.value(node, method.is_builtin)
    except _fold.NotConstant:
        pass
    if isinstance(node, ast.Name | ast.Attribute):
        found = method.resolve(node)
        return found if isinstance(found, int | float | str | tuple) else MISSING
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "len"
        and method.is_builtin("len")
        and len(node.args) == 1
    ):
        found = method.resolve(node.args[0])
        try:
            return len(found) if found is not MISSING else MISSING
        except TypeError:
            return MISSING
    return MISSING


class _Unroller(ast.NodeTransformer):
    def __init__(self, method: Method, limit: int) -> None:
        self.method = method
        self.limit = limit
        self.count = 0

    def visit_For(self, node: ast.For) -> Any:
        self.generic_visit(node)  # inner loops first
        items = _items(node.iter, self.method)
        if items is None:
            self.method.note(node, f"for over {ast.unparse(node.iter)}: not known statically")
            return node
        if len(items) > self.limit:
            self.method.note(node, f"{len(items)} iterations > max_iterations={self.limit}")
            return node
        if _jumps(node.body):
            self.method.note(node, "loops with break or continue are not unrolled")
            return node
        body = ast.Module(body=node.body, type_ignores=[])
        used = {n.id for item in items for n in ast.walk(item) if isinstance(n, ast.Name)}
        rebound = sorted(name for name in used if _scope.bound_names(body)[name])
        if rebound:
            self.method.note(node, f"the loop body rebinds {', '.join(rebound)}")
            return node
        bindings = [_bind(node.target, item) for item in items]
        if any(b is None for b in bindings):
            self.method.note(node, f"cannot unpack into {ast.unparse(node.target)}")
            return node
        self.count += 1
        return _unrolled(node, bindings, self.method) + node.orelse  # type: ignore[arg-type]


def _unrolled(
    node: ast.For, bindings: list[list[tuple[str, ast.expr]]], method: Method
) -> list[ast.stmt]:
    names = {name for binding in bindings for name, _ in binding}
    loop = ast.Module(body=node.body, type_ignores=[])
    rebound = any(_scope.bound_names(loop)[name] for name in names)
    out: list[ast.stmt] = []
    for binding in bindings:
        body = copy.deepcopy(node.body)
        if rebound:  # keep the variable: each iteration starts by binding it
            out += [_assign(name, value, node) for name, value in binding]
        else:
            block = ast.Module(body=body, type_ignores=[])
            for name, value in binding:
                uses = _scope.loads(block, name)
                _scope.replace_nodes(block, {id(n): copy.deepcopy(value) for n in uses})
        out += body
    if bindings and not rebound:  # the variable keeps its last value after a loop
        last = bindings[-1]
        out += [_assign(name, value, node) for name, value in last if _read_after(method, name)]
    return out


def _read_after(method: Method, name: str) -> bool:
    """Whether `name` is read outside every loop that binds it as its variable."""
    inside = {
        id(n)
        for loop in ast.walk(method.tree)
        if isinstance(loop, ast.For) and _scope.bound_names(loop.target)[name]
        for n in ast.walk(loop)
    }
    return any(id(n) not in inside for n in _scope.loads(method.tree, name))


def _assign(name: str, value: ast.expr, like: ast.AST) -> ast.stmt:
    target = ast.Name(id=name, ctx=ast.Store())
    return ast.copy_location(ast.Assign(targets=[target], value=copy.deepcopy(value)), like)


def _jumps(body: list[ast.stmt]) -> bool:
    """break/continue that belong to this loop (not to loops nested in it)."""
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Break | ast.Continue):
            return True
        if isinstance(node, ast.For | ast.While):
            todo += node.orelse
            continue
        if not isinstance(node, _scope.NESTED):
            todo += list(ast.iter_child_nodes(node))
    return False


def _bind(target: ast.expr, item: ast.expr) -> list[tuple[str, ast.expr]] | None:
    if isinstance(target, ast.Name):
        return [(target.id, item)]
    if isinstance(target, ast.Tuple | ast.List) and isinstance(item, ast.Tuple):
        if len(target.elts) != len(item.elts):
            return None
        pairs: list[tuple[str, ast.expr]] = []
        for sub_target, sub_item in zip(target.elts, item.elts, strict=True):
            sub = _bind(sub_target, sub_item)
            if sub is None:
                return None
            pairs += sub
        return pairs
    return None


def _items(node: ast.expr, method: Method) -> list[ast.expr] | None:
    """One expression per iteration of `for _ in node`, or None when they are not known."""
    import torch

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        func, args = node.func.id, node.args
        strict = [k for k in node.keywords if k.arg == "strict" and func == "zip"]
        if len(strict) != len(node.keywords):
            return None
        if func in ("range", "enumerate", "zip", "reversed") and not method.is_builtin(func):
            return None
        if func == "range" and 1 <= len(args) <= 3:
            bounds = [_constant(a, method) for a in args]
            if all(isinstance(b, int) and not isinstance(b, bool) for b in bounds):
                return [_fold.literal(i, node) for i in range(*bounds)]
            return None
        if func == "enumerate" and len(args) == 1:
            inner = _items(args[0], method)
            if inner is None:
                return None
            return [_tuple([_fold.literal(i, node), item]) for i, item in enumerate(inner)]
        if func == "zip" and args:
            return _zipped(args, method, bool(strict))
        if func == "reversed" and len(args) == 1:
            inner = _items(args[0], method)
            return None if inner is None else inner[::-1]
        return None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args:
        found = method.resolve(node.func.value)
        if isinstance(found, torch.nn.ModuleDict) and node.func.attr in ("keys", "values", "items"):
            return _dict_items(node.func.value, found, node.func.attr)
        return None
    found = method.resolve(node)
    if isinstance(found, torch.nn.ModuleDict):
        return _dict_items(node, found, "keys")
    if isinstance(found, torch.nn.ModuleList | torch.nn.Sequential):
        return [_at(node, ast.Constant(i)) for i in range(len(found))]
    if isinstance(found, tuple | list):
        plain = all(isinstance(v, int | float | str | bool | None) for v in found)
        return [_fold.literal(v, node) for v in found] if plain else None
    try:
        return [_fold.literal(v, node) for v in _fold.value(node, method.is_builtin)]
    except (_fold.NotConstant, TypeError):
        return None


def _zipped(args: list[ast.expr], method: Method, strict: bool) -> list[ast.expr] | None:
    """Rows of zip(...): known columns give the length; a column of unknown length that is a
    plain name or attribute (`features`) is indexed, `features[0]`, ... (it must then be at
    least that long, where zip would stop early)."""
    columns = [_items(a, method) for a in args]
    known = [c for c in columns if c is not None]
    if not known or (strict and len({len(c) for c in known}) > 1):
        return None  # nothing gives the length, or zip(strict=True) would raise
    n = min(len(c) for c in known)
    for i, (arg, column) in enumerate(zip(args, columns, strict=True)):
        if column is None:
            if not _plain(arg):
                return None
            columns[i] = [_at(arg, ast.Constant(k)) for k in range(n)]
    return [_tuple(list(row)) for row in zip(*columns, strict=False)]


def _plain(node: ast.expr) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _dict_items(node: ast.expr, found: Any, kind: str) -> list[ast.expr]:
    keys = [ast.Constant(k) for k in found]
    if kind == "keys":
        return list(keys)
    values = [_at(node, k) for k in keys]
    return (
        values if kind == "values" else [_tuple([k, v]) for k, v in zip(keys, values, strict=True)]
    )


def _at(container: ast.expr, key: ast.expr) -> ast.expr:
    node = ast.Subscript(value=copy.deepcopy(container), slice=key, ctx=ast.Load())
    return ast.copy_location(node, container)


def _tuple(items: list[ast.expr]) -> ast.expr:
    return ast.Tuple(elts=items, ctx=ast.Load())
