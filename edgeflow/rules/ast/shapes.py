"""ast.specialize_shapes: fold the model's shape queries to the recipe's declared shapes.

Handled, in the model's own forward only (source.inputs describe its positional tensor
arguments, matched by position): `x.shape`, `x.size()`, `x.size(k)`, `x.size(dim=k)`,
`x.shape[k]`, `len(x)`, `x.dim()`, `x.ndimension()`, `x.ndim`, `x.numel()`, `x.nelement()`
where `x` is such an argument and still holds the input at that point (no earlier
rebinding, e.g. `x = self.conv(x)`). The values are substituted, constant expressions folded,
names bound once to such constants (`b, c, h, w = x.shape`) propagated, and `if` statements
and `a if c else b` whose test became constant replaced by the branch taken. A guard at the top
of forward raises EdgeflowError when it is called with other shapes.
`dynamic_batch: true` leaves everything that depends on dim 0 alone and does not check it.
Not handled (left as is, with a reason): queries on a rebound argument, on intermediate
tensors, in other methods or submodules; `x.shape.<attr>`.
"""

from __future__ import annotations

import ast
import math
from typing import Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.ast import _fold, _scope
from edgeflow.rules.ast._source import Method, rewrite
from edgeflow.rules.base import AstRule, RewriteContext, RuleOptions, RuleResult
from edgeflow.rules.fixes import Fix

BEFORE = """\
def forward(self, x):
    if x.dim() == 3:
        x = x.unsqueeze(0)
    return x.view(x.size(0), -1)
"""
AFTER = """\
def forward(self, x):
    _edgeflow_rt.check_shapes('Net.forward', ('x',), (x,), ((1, 3, 8, 8),))
    return x.view(1, -1)
"""
GUARD = "check_shapes"
Shape = tuple[int | None, ...]


class SpecializeShapes(AstRule):
    name = "ast.specialize_shapes"
    description = "Fold shape queries on forward's inputs to the declared shapes; guard them."
    fixes = (Fix.capture("shape"), Fix.capture("tensor_if"))
    example = (BEFORE, AFTER)

    class Options(RuleOptions):
        """dynamic_batch: leave dim 0 unfolded and unchecked; by default (null) it follows the
        recipe's source.dynamic_batch."""

        dynamic_batch: bool | None = None

    def apply(self, model: Any, opts: Options, ctx: RewriteContext) -> RuleResult[Any]:
        dynamic = ctx.dynamic_batch if opts.dynamic_batch is None else opts.dynamic_batch

        def transform(method: Method) -> int:
            return _specialize(method, dynamic) if method.is_root else 0

        wanted = "shape query on forward's arguments"
        return rewrite(model, ctx, self.name, transform, wanted)


def _shapes(method: Method, dynamic: bool) -> dict[str, Shape]:
    params, inputs = _scope.positional(method.tree), method.ctx.inputs
    if len(inputs) > len(params) and method.tree.args.vararg is None:
        raise EdgeflowError(
            f"{method.owner} takes {len(params)} positional arguments after self, but "
            f"source.inputs declares {len(inputs)} inputs",
            "declare one source.inputs entry per tensor argument of forward, in order",
        )
    return {
        name: (None, *spec.shape[1:]) if dynamic else tuple(spec.shape)
        for name, spec in zip(params, inputs, strict=False)
    }


def _specialize(method: Method, dynamic: bool) -> int:
    """Substitute, fold and propagate until no query is left that can be folded (folding an
    `if x.dim() == 3: x = ...` away makes later queries on x foldable)."""
    shapes = _shapes(method, dynamic)
    total = 0
    for _ in range(8):
        notes_before = len(method.kept)
        count = _round(method, shapes)
        total += count
        if not count:
            break
        del method.kept[notes_before:]  # sites noted in this round may fold in the next
    if total and not _has_guard(method.tree):
        method.tree.body.insert(_after_docstring(method.tree), _guard(method, shapes))
    return total


def _round(method: Method, shapes: dict[str, Shape]) -> int:
    tree = method.tree
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    mapping: dict[int, ast.expr] = {}
    for node in _scope.walk_scope(tree):
        found = _query(node, shapes, method)
        if found is None:
            continue
        name, value = found
        target: ast.AST = node
        if value is _WHOLE:
            target, value = _whole_shape(node, parents, shapes[name], method)
        if value is None:
            continue
        if not _scope.holds_entry_value(tree.body, name, node):
            method.note(node, f"{ast.unparse(node)} reads {name} after it is rebound: left as is")
            continue
        mapping[id(target)] = _fold.literal(value, target)
    if mapping:
        marked = {id(_statement_of(n, parents)) for n in _nodes(tree, mapping)}
        _scope.replace_nodes(tree, mapping)
        method.fold()
        _propagate(method, marked)
    return len(mapping)


_WHOLE: Any = object()


def _query(node: ast.AST, shapes: dict[str, Shape], method: Method) -> tuple[str, Any] | None:
    """(argument, value) for a shape query on a declared argument; _WHOLE for its full shape;
    None as value when the query depends on a dynamic dim."""
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        name = _arg(node.value, shapes)
        if name and node.attr == "shape":
            return name, _WHOLE
        if name and node.attr == "ndim":
            return name, len(shapes[name])
        return None
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Name) and func.id == "len" and method.is_builtin("len"):
        name = _arg(node.args[0], shapes) if len(node.args) == 1 else None
        return (name, _dim(shapes[name], 0, node, method)) if name else None
    if not isinstance(func, ast.Attribute):
        return None
    name = _arg(func.value, shapes)
    if name is None:
        return None
    shape, nargs = shapes[name], len(node.args) + len(node.keywords)
    if func.attr in ("dim", "ndimension") and nargs == 0:
        return name, len(shape)
    if func.attr in ("numel", "nelement") and nargs == 0:
        if None in shape:
            method.note(node, f"{ast.unparse(node)} depends on the dynamic batch dim")
            return name, None
        return name, math.prod(shape)
    if func.attr == "size" and nargs == 0:
        return name, _WHOLE
    if func.attr == "size" and nargs == 1:
        arg = node.args[0] if node.args else node.keywords[0].value
        keyword = node.keywords[0].arg if node.keywords else "dim"
        index = arg.value if isinstance(arg, ast.Constant) else None
        if keyword == "dim" and isinstance(index, int) and -len(shape) <= index < len(shape):
            return name, _dim(shape, index, node, method)
    return None


def _arg(node: ast.AST, shapes: dict[str, Shape]) -> str | None:
    return node.id if isinstance(node, ast.Name) and node.id in shapes else None


def _dim(shape: Shape, index: int, node: ast.AST, method: Method) -> int | None:
    if index >= len(shape) or index < -len(shape):
        return None
    if shape[index] is None:
        method.note(node, f"{ast.unparse(node)} depends on the dynamic batch dim")
    return shape[index]


def _whole_shape(
    node: ast.AST, parents: dict[int, ast.AST], shape: Shape, method: Method
) -> tuple[ast.AST, Any]:
    """What replaces a full-shape query: the tuple itself, or (with a dynamic dim) the
    enclosing subscript when it picks only static dims."""
    parent = parents.get(id(node))
    if isinstance(parent, ast.Attribute):
        method.note(node, f"{ast.unparse(parent)}: attributes of a shape are left as is")
        return node, None
    if None not in shape:
        return node, shape
    if isinstance(parent, ast.Subscript) and parent.value is node:
        try:
            index = _fold.value(parent.slice, method.is_builtin)
            picked = shape[index]
        except (_fold.NotConstant, TypeError, IndexError):
            picked = None
        if picked is not None and (not isinstance(picked, tuple) or None not in picked):
            return parent, picked
    method.note(node, f"{ast.unparse(parent or node)} depends on the dynamic batch dim")
    return node, None


def _nodes(tree: ast.AST, mapping: dict[int, ast.expr]) -> list[ast.AST]:
    return [n for n in ast.walk(tree) if id(n) in mapping]


def _statement_of(node: ast.AST, parents: dict[int, ast.AST]) -> ast.AST:
    while not isinstance(node, ast.stmt) and id(node) in parents:
        node = parents[id(node)]
    return node


def _propagate(method: Method, marked: set[int]) -> None:
    """Substitute names bound once, at the top level, to a folded shape constant."""
    tree = method.tree
    for _ in range(8):
        counts = _scope.local_counts(tree)
        params = set(_scope.parameters(tree))
        mapping: dict[int, ast.expr] = {}
        for i, stmt in enumerate(tree.body):
            if id(stmt) not in marked or not isinstance(stmt, ast.Assign):
                continue
            for name, value in _constant_bindings(stmt, method):
                if counts[name] != 1 or name in params:
                    continue
                for later in tree.body[i + 1 :]:
                    for load in _scope.loads(later, name):
                        mapping[id(load)] = _fold.literal(value, load)
        if not mapping:
            return
        parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        marked |= {id(_statement_of(n, parents)) for n in _nodes(tree, mapping)}
        _scope.replace_nodes(tree, mapping)
        method.fold()


def _constant_bindings(stmt: ast.Assign, method: Method) -> list[tuple[str, Any]]:
    if len(stmt.targets) != 1:
        return []
    target = stmt.targets[0]
    try:
        value = _fold.value(stmt.value, method.is_builtin)
    except _fold.NotConstant:
        return []
    if isinstance(target, ast.Name):
        return [(target.id, value)]
    if (
        isinstance(target, ast.Tuple)
        and isinstance(value, tuple)
        and len(value) == len(target.elts)
        and all(isinstance(e, ast.Name) for e in target.elts)
    ):
        return [(e.id, v) for e, v in zip(target.elts, value, strict=True)]  # type: ignore[attr-defined]
    return []


def _has_guard(tree: ast.FunctionDef) -> bool:
    for stmt in tree.body[:2]:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        func = call.func if isinstance(call, ast.Call) else None
        if isinstance(func, ast.Attribute) and func.attr == GUARD:
            return True
    return False


def _after_docstring(tree: ast.FunctionDef) -> int:
    first = tree.body[0] if tree.body else None
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return 1 if docstring and isinstance(first.value.value, str) else 0  # type: ignore[union-attr]


def _guard(method: Method, shapes: dict[str, Shape]) -> ast.stmt:
    names = list(shapes)
    call = ast.Call(
        func=method.runtime(GUARD),
        args=[
            ast.Constant(method.owner),
            _fold.literal(tuple(names), method.tree),
            ast.Tuple([ast.Name(n, ast.Load()) for n in names], ast.Load()),
            _fold.literal(tuple(shapes.values()), method.tree),
        ],
        keywords=[],
    )
    return ast.copy_location(ast.Expr(call), method.tree.body[0])
