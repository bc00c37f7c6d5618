"""Constant folding: evaluate expressions made only of constants, drop dead `if` branches.

Rules that substitute constants (shapes, loop indices) run this afterwards, so that
`if 4 == 4:` becomes its body and `self.blocks[0 + 1]` becomes `self.blocks[1]`.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
}
UNARY: dict[type, Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
    ast.Invert: operator.invert,
}
COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
BUILTINS: dict[str, Callable[..., Any]] = {
    f.__name__: f for f in (len, min, max, abs, int, float, bool, tuple, sum, round)
}


class NotConstant(Exception):
    pass


def value(node: ast.AST, builtin: Callable[[str], bool]) -> Any:
    """The value of a constant expression; NotConstant otherwise. `builtin(name)` says whether
    a name refers to the Python builtin of that name (not shadowed)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple | ast.List) and isinstance(node.ctx, ast.Load):
        items = [value(e, builtin) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return _small(UNARY[type(node.op)](value(node.operand, builtin)))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = value(node.left, builtin), value(node.right, builtin)
        if isinstance(node.op, ast.Pow | ast.LShift) and not abs(right) <= 64:
            raise NotConstant
        return _small(_apply(BINARY[type(node.op)], left, right))
    if isinstance(node, ast.BoolOp):
        result = None
        for operand in node.values:
            result = value(operand, builtin)
            if bool(result) == isinstance(node.op, ast.Or):
                return result
        return result
    if isinstance(node, ast.Compare) and all(type(op) in COMPARE for op in node.ops):
        left = value(node.left, builtin)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = value(comparator, builtin)
            if not _apply(COMPARE[type(op)], left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        seq = value(node.value, builtin)
        if not isinstance(seq, tuple | list | str):
            raise NotConstant
        return _small(_apply(operator.getitem, seq, _index(node.slice, builtin)))
    if isinstance(node, ast.IfExp):
        return value(node.body if value(node.test, builtin) else node.orelse, builtin)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in BUILTINS
        and builtin(node.func.id)
        and not node.keywords
    ):
        args = [value(a, builtin) for a in node.args]
        return _small(_apply(BUILTINS[node.func.id], *args))
    raise NotConstant


def _index(node: ast.AST, builtin: Callable[[str], bool]) -> Any:
    if isinstance(node, ast.Slice):
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if p is None else value(p, builtin) for p in parts))
    return value(node, builtin)


def _apply(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # e.g. 1 / 0, (1, 2)[5]: leave the expression to fail at run time
        raise NotConstant from None


def _small(result: Any) -> Any:
    """Refuse results too large to write into source (e.g. 'x' * 10**6, (0,) * 10**6)."""
    if isinstance(result, str) and len(result) > 256:
        raise NotConstant
    if isinstance(result, tuple | list):
        if len(result) > 64:
            raise NotConstant
        for item in result:
            _small(item)
    elif isinstance(result, float | int) and not abs(result) <= 2**63:  # also inf and nan
        raise NotConstant
    return result


def literal(result: Any, like: ast.AST) -> ast.expr:
    """An expression node that evaluates to `result`, located at `like`."""
    if isinstance(result, tuple | list):
        elts = [literal(item, like) for item in result]
        node: ast.expr = (
            ast.Tuple(elts=elts, ctx=ast.Load())
            if isinstance(result, tuple)
            else ast.List(elts=elts, ctx=ast.Load())
        )
    elif isinstance(result, int | float) and not isinstance(result, bool) and result < 0:
        node = ast.UnaryOp(op=ast.USub(), operand=ast.Constant(-result))
    else:
        node = ast.Constant(result)
    return ast.copy_location(node, like)


FOLDABLE = (
    ast.UnaryOp,
    ast.BinOp,
    ast.BoolOp,
    ast.Compare,
    ast.Subscript,
    ast.IfExp,
    ast.Call,
)


class Folder(ast.NodeTransformer):
    """Fold constant expressions; replace `if`/`x if c else y` with a constant test by the
    branch taken; drop `assert <true constant>`. Counts what it changed in `.folds`."""

    def __init__(self, builtin: Callable[[str], bool]) -> None:
        self.builtin = builtin
        self.folds = 0

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        if isinstance(node, FOLDABLE) and not _is_literal(node):
            try:
                result = value(node, self.builtin)
            except NotConstant:
                return self._partial(node)
            self.folds += 1
            return literal(result, node)
        return node

    def _partial(self, node: ast.AST) -> ast.AST:
        """`True and e` -> `e`, `False or e` -> `e`, `a if True else b` -> `a`."""
        if isinstance(node, ast.IfExp):
            try:
                taken = value(node.test, self.builtin)
            except NotConstant:
                return node
            self.folds += 1
            return node.body if taken else node.orelse
        if not isinstance(node, ast.BoolOp):
            return node
        values = list(node.values)
        while len(values) > 1:
            try:
                lead = value(values[0], self.builtin)
            except NotConstant:
                break
            if bool(lead) == isinstance(node.op, ast.Or):
                break  # short-circuits to the constant: already handled by value()
            values.pop(0)
            self.folds += 1
        if len(values) == 1:
            return values[0]
        node.values = values
        return node

    def visit_If(self, node: ast.If) -> Any:
        self.generic_visit(node)
        try:
            taken = value(node.test, self.builtin)
        except NotConstant:
            return node
        self.folds += 1
        return (node.body if taken else node.orelse) or None

    def visit_Assert(self, node: ast.Assert) -> Any:
        self.generic_visit(node)
        try:
            holds = value(node.test, self.builtin)
        except NotConstant:
            return node
        if holds:
            self.folds += 1
            return None
        return node


def _is_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant)


def fill_empty_blocks(tree: ast.AST) -> None:
    """Put `pass` into blocks that folding or unrolling emptied."""
    for node in ast.walk(tree):
        block = getattr(node, "body", None)
        if isinstance(block, list) and not block:
            block.append(ast.copy_location(ast.Pass(), node))


def fold(tree: ast.AST, builtin: Callable[[str], bool]) -> int:
    """Fold `tree` in place; returns the number of folds."""
    folder = Folder(builtin)
    folder.visit(tree)
    fill_empty_blocks(tree)
    return folder.folds
