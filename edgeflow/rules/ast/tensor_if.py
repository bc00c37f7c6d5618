"""ast.tensor_if_to_where: branches on tensor values become both branches and torch.where.

Handled, where the condition is a tensor (see _types.py; `.item()` and `bool()` around a
tensor are dropped, `and`/`or`/`not` of tensor conditions become logical ops):
- `if c: <assignments> else: <assignments>` (or no `else`): both branches run, each binding
  fresh names (`y_then`, `y_else`), then `y = _edgeflow_rt.where(c, y_then, y_else)` for
  every name a branch binds and the method reads after the `if` (a name bound in one branch
  only must be bound before the `if`);
- `if c: <assignments>; return a else: <assignments>; return b`, and the early-return form
  `if c: ...; return a` followed by `...; return b` in the same block:
  `return _edgeflow_rt.where(c, a, b)` (element-wise for tuples of equal length);
- `a if c else b` -> `_edgeflow_rt.where(c, a, b)`.
Branches may only assign names (simple or tuple targets); merged names must be tensors
(every value bound to them in the method is). `_edgeflow_rt.where` raises if the two values
differ in shape or dtype, where torch.where would broadcast or promote.
Not handled (a reason is given): branches with other statements (calls for effect,
attribute or item stores, raise, loops), in-place tensor methods (`x.add_()`), `print`,
list/dict mutators, names bound in one branch only and not before, conditions that mix
tensors with Python values, `while` on a tensor.
Both branches are computed: a branch that fails on inputs the original never gave it (say,
indexing past an end) now fails too.
"""

from __future__ import annotations

import ast
import copy
from typing import Any

from edgeflow.rules.ast import _scope
from edgeflow.rules.ast._source import Method, rewrite
from edgeflow.rules.ast._types import Types
from edgeflow.rules.base import AstRule, RewriteContext, RuleOptions, RuleResult
from edgeflow.rules.fixes import Fix

BEFORE = """\
def forward(self, x):
    if x.sum() > 0:
        y = x * 2
    else:
        y = -x
    return y
"""
AFTER = """\
def forward(self, x):
    cond = x.sum() > 0
    y_then = x * 2
    y_else = -x
    y = _edgeflow_rt.where(cond, y_then, y_else)
    return y
"""
IMPURE_CALLS = {"print", "setattr", "delattr", "exec", "eval", "input", "open", "breakpoint"}
MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "add"}


class TensorIfToWhere(AstRule):
    name = "ast.tensor_if_to_where"
    description = "Compute both branches of an if on a tensor value and blend them with where."
    fixes = (Fix.op("If"), Fix.capture("tensor_if"), Fix.capture("baked_branch"))
    example = (BEFORE, AFTER)

    class Options(RuleOptions):
        pass

    def apply(self, model: Any, opts: Options, ctx: RewriteContext) -> RuleResult[Any]:
        def transform(method: Method) -> int:
            rewriter = _Rewriter(method)
            method.tree.body = rewriter.block(method.tree.body)
            return rewriter.count

        return rewrite(model, ctx, self.name, transform, "if or a-if-c-else-b on a tensor value")


class _Rewriter:
    def __init__(self, method: Method) -> None:
        self.method = method
        self.types = Types(method)
        self.taken = _scope.all_names(method.tree) | set(method.function.__globals__)
        self.count = 0

    def block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        """Rewrite a block (nested blocks first); returns the new statement list."""
        for stmt in stmts:
            for attr in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, attr, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    setattr(stmt, attr, self.block(inner))
            for handler in getattr(stmt, "handlers", []):
                handler.body = self.block(handler.body)
        out: list[ast.stmt] = []
        for i, stmt in enumerate(stmts):
            if isinstance(stmt, ast.While) and self._condition(stmt.test, quiet=True):
                self.method.note(stmt, "while on a tensor condition is not rewritten")
            if not isinstance(stmt, ast.If):
                out.append(self._expressions(stmt))
                continue
            cond = self._condition(stmt.test)
            if cond is None:
                out.append(self._expressions(stmt))
                continue
            rest = stmts[i + 1 :]
            merged = self._merge(stmt, cond, rest)
            if merged is None:
                out.append(stmt)
                continue
            self.count += 1
            statements, consumed_rest = merged
            out += statements
            if consumed_rest:
                return out
        return out

    def _condition(self, test: ast.expr, quiet: bool = False) -> ast.expr | None:
        """The condition as a tensor expression, or None when it is not a tensor."""
        test = _strip_conversions(test)
        if isinstance(test, ast.BoolOp):
            parts = [self._condition(v, quiet=True) for v in test.values]
            known = [p for p in parts if p is not None]
            if not known:
                return None
            if len(known) < len(parts):
                if not quiet:
                    self.method.note(test, "condition mixes tensors and Python values")
                return None
            helper = "all_of" if isinstance(test.op, ast.And) else "any_of"
            return self._call(helper, known, test)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self._condition(test.operand, quiet)
            return None if inner is None else self._call("not_", [inner], test)
        return test if self.types.tensor(test) else None

    def _call(self, helper: str, args: list[ast.expr], like: ast.AST) -> ast.expr:
        call = ast.Call(func=self.method.runtime(helper), args=args, keywords=[])
        return ast.copy_location(call, like)

    def _merge(
        self, node: ast.If, cond: ast.expr, rest: list[ast.stmt]
    ) -> tuple[list[ast.stmt], bool] | None:
        then, other, consumed = node.body, node.orelse, False
        if _returns(then) and not other and rest and _returns(rest):
            other, consumed = rest, True  # `if c: return a` then `return b`
        for branch in (then, other):
            problem = _impure(branch, allow_return=_returns(then) and _returns(other))
            if problem:
                self.method.note(node, f"branch not rewritten: {problem}")
                return None
        if _returns(then) != _returns(other):
            self.method.note(node, "only one branch returns")
            return None
        returns = _returns(then)
        out: list[ast.stmt] = []
        branches = ast.Module(body=[*then, *other], type_ignores=[])
        if not isinstance(cond, ast.Name) or _scope.bound_names(branches)[cond.id]:
            name = _scope.fresh_name("cond", self.taken)
            out.append(_assign(name, cond, node))
            cond = ast.Name(id=name, ctx=ast.Load())
            self.types.known[name] = True
        then_stmts, then_map = self._renamed(then, "then")
        else_stmts, else_map = self._renamed(other, "else")
        if returns:  # names bound before a return die with it: only the values merge
            a_ret, b_ret = then_stmts.pop(), else_stmts.pop()
            assert isinstance(a_ret, ast.Return) and isinstance(b_ret, ast.Return)
            value = self._returned(cond, a_ret.value, b_ret.value, node)
            if value is None:
                return None
            return [
                *out,
                *then_stmts,
                *else_stmts,
                ast.copy_location(ast.Return(value), node),
            ], consumed
        out += then_stmts + else_stmts
        for name in dict.fromkeys([*then_map, *else_map]):
            if not self._read_outside(name, node):
                continue  # a temporary of the branch
            if not self.types.tensor(ast.Name(name, ast.Load())):
                self.method.note(node, f"{name} is not known to be a tensor")
                return None
            one_sided = name not in then_map or name not in else_map
            if one_sided and not self._bound_before(name, node):
                self.method.note(node, f"{name} is bound in one branch only")
                return None
            a, b = then_map.get(name, name), else_map.get(name, name)
            out.append(_assign(name, self._where(cond, _load(a), _load(b), node), node))
        return out, consumed

    def _returned(
        self, cond: ast.expr, a: ast.expr | None, b: ast.expr | None, node: ast.AST
    ) -> ast.expr | None:
        if isinstance(a, ast.Tuple) and isinstance(b, ast.Tuple) and len(a.elts) == len(b.elts):
            items = [self._where(cond, x, y, node) for x, y in zip(a.elts, b.elts, strict=True)]
            return ast.Tuple(elts=items, ctx=ast.Load())
        if a is None or b is None or isinstance(a, ast.Tuple) or isinstance(b, ast.Tuple):
            self.method.note(node, "the branches return different kinds of values")
            return None
        return self._where(cond, a, b, node)

    def _where(self, cond: ast.expr, a: ast.expr, b: ast.expr, like: ast.AST) -> ast.expr:
        return self._call("where", [copy.deepcopy(cond), a, b], like)

    def _renamed(self, stmts: list[ast.stmt], suffix: str) -> tuple[list[ast.stmt], dict[str, str]]:
        """The branch with every name it binds renamed to a fresh one; old -> new names."""
        renames: dict[str, str] = {}
        out: list[ast.stmt] = []
        for stmt in copy.deepcopy(stmts):
            if isinstance(stmt, ast.Pass) or _is_docstring(stmt):
                continue
            if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                value = ast.BinOp(left=_load(stmt.target.id), op=stmt.op, right=stmt.value)
                stmt = ast.copy_location(ast.Assign(targets=[stmt.target], value=value), stmt)
            _Loads(renames).visit(stmt)
            for target in _targets(stmt):
                for node in ast.walk(target):
                    if isinstance(node, ast.Name):
                        new = renames.get(node.id) or _scope.fresh_name(
                            f"{node.id}_{suffix}", self.taken
                        )
                        renames[node.id] = new
                        self.types.known[new] = self.types.tensor(ast.Name(node.id, ast.Load()))
                        node.id = new
            out.append(stmt)
        return out, renames

    def _read_outside(self, name: str, node: ast.If) -> bool:
        inside = {id(n) for n in ast.walk(node)}
        return any(id(n) not in inside for n in _scope.loads(self.method.tree, name))

    def _bound_before(self, name: str, node: ast.If) -> bool:
        if name in _scope.parameters(self.method.tree):
            return True
        inside = {id(n) for n in ast.walk(node)}
        return any(
            isinstance(n, ast.Name)
            and n.id == name
            and isinstance(n.ctx, ast.Store)
            and id(n) not in inside
            and n.lineno < node.lineno
            for n in _scope.walk_scope(self.method.tree)
        )

    def _expressions(self, stmt: ast.stmt) -> ast.stmt:
        """Rewrite `a if c else b` with a tensor condition in a statement's own expressions
        (nested blocks were done already)."""
        rewriter = _IfExp(self)
        for field, value in ast.iter_fields(stmt):
            if isinstance(value, ast.expr):
                setattr(stmt, field, rewriter.visit(value))
            elif isinstance(value, list):
                value[:] = [rewriter.visit(v) if isinstance(v, ast.expr) else v for v in value]
        return stmt


class _IfExp(ast.NodeTransformer):
    def __init__(self, outer: _Rewriter) -> None:
        self.outer = outer

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        self.generic_visit(node)
        cond = self.outer._condition(node.test)
        if cond is None:
            return node
        for part in (node.body, node.orelse):
            problem = next(filter(None, map(_impure_expression, ast.walk(part))), None)
            if problem:
                self.outer.method.note(node, f"not rewritten: {problem}")
                return node
        self.outer.count += 1
        return self.outer._where(cond, node.body, node.orelse, node)

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        return node


class _Loads(ast.NodeTransformer):
    def __init__(self, renames: dict[str, str]) -> None:
        self.renames = renames

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in self.renames:
            node.id = self.renames[node.id]
        return node


def _strip_conversions(test: ast.expr) -> ast.expr:
    """`t.item() > 0` -> `t > 0`, `bool(t)` -> `t`: the same truth value, as a tensor."""

    class Strip(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> ast.AST:
            self.generic_visit(node)
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "item" and not node.args:
                return func.value
            if isinstance(func, ast.Name) and func.id == "bool" and len(node.args) == 1:
                return node.args[0]
            return node

    return Strip().visit(copy.deepcopy(test))


def _returns(stmts: list[ast.stmt]) -> bool:
    return bool(stmts) and isinstance(stmts[-1], ast.Return)


def _targets(stmt: ast.stmt) -> list[ast.expr]:
    if isinstance(stmt, ast.Assign):
        return list(stmt.targets)
    if isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        return [stmt.target]
    return []


def _impure(stmts: list[ast.stmt], allow_return: bool) -> str | None:
    """Why a branch cannot run unconditionally, or None when it can."""
    for i, stmt in enumerate(stmts):
        last = i == len(stmts) - 1
        if isinstance(stmt, ast.Return) and allow_return and last:
            pass
        elif isinstance(stmt, ast.Assign | ast.AugAssign | ast.AnnAssign):
            for target in _targets(stmt):
                if not all(
                    isinstance(n, ast.Name | ast.Tuple | ast.List | ast.Store)
                    for n in ast.walk(target)
                ):
                    return f"it assigns to {ast.unparse(target)}"
            if isinstance(stmt, ast.AnnAssign) and stmt.value is None:
                return "annotation without a value"
        elif not (isinstance(stmt, ast.Pass) or _is_docstring(stmt)):
            return f"it has a statement other than an assignment: {_first_line(stmt)}"
        for node in ast.walk(stmt):
            problem = _impure_expression(node)
            if problem:
                return problem
    return None


def _impure_expression(node: ast.AST) -> str | None:
    if isinstance(node, ast.NamedExpr | ast.Yield | ast.YieldFrom | ast.Await):
        return f"{ast.unparse(node)} has an effect"
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Name) and func.id in IMPURE_CALLS:
        return f"it calls {func.id}"
    if isinstance(func, ast.Attribute):
        in_place = func.attr.endswith("_") and not func.attr.endswith("__")
        if in_place or func.attr in MUTATORS:
            return f"{ast.unparse(func)}() changes its object in place"
    return None


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)


def _load(name: str) -> ast.Name:
    return ast.Name(id=name, ctx=ast.Load())


def _assign(name: str, value: ast.expr, like: ast.AST) -> ast.stmt:
    target = ast.Name(id=name, ctx=ast.Store())
    return ast.fix_missing_locations(ast.copy_location(ast.Assign([target], value), like))


def _first_line(stmt: ast.stmt) -> str:
    return ast.unparse(stmt).splitlines()[0]
