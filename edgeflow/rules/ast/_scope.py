"""Scope facts about one parsed method: which names it binds, where, and fresh names."""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterator

# Nodes that open a new scope: names bound inside them are not the method's locals.
NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def walk_scope(node: ast.AST, skip_binding: str | None = None) -> Iterator[ast.AST]:
    """Like ast.walk, but yields nested functions, lambdas and classes without entering them,
    and (given `skip_binding`) skips comprehensions that bind that name."""
    todo: list[ast.AST] = [node]
    while todo:
        current = todo.pop()
        yield current
        if current is not node and isinstance(current, NESTED):
            continue
        if skip_binding and isinstance(current, COMPREHENSIONS):
            targets = [n for g in current.generators for n in ast.walk(g.target)]
            bound = {n.id for n in targets if isinstance(n, ast.Name)}
            if skip_binding in bound:
                continue
        todo.extend(ast.iter_child_nodes(current))


def bound_names(node: ast.AST) -> Counter[str]:
    """How many times each name is bound in `node` (nested scopes and comprehensions excluded)."""
    found: Counter[str] = Counter()
    comprehension_targets = {
        id(n)
        for c in walk_scope(node)
        if isinstance(c, COMPREHENSIONS)
        for gen in c.generators
        for n in ast.walk(gen.target)
    }
    for child in walk_scope(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store | ast.Del):
            if id(child) not in comprehension_targets:
                found[child.id] += 1
        elif isinstance(child, ast.alias):
            found[(child.asname or child.name).split(".")[0]] += 1
        elif isinstance(child, ast.ExceptHandler | ast.FunctionDef | ast.ClassDef) and child.name:
            if child is not node:
                found[child.name] += 1
        elif isinstance(child, ast.AsyncFunctionDef) and child is not node:
            found[child.name] += 1
    return found


def parameters(fdef: ast.FunctionDef) -> list[str]:
    """Every parameter name of a function, in order."""
    args = fdef.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return names


def positional(fdef: ast.FunctionDef) -> list[str]:
    """The positional parameters after `self`."""
    args = fdef.args
    return [a.arg for a in (*args.posonlyargs, *args.args)][1:]


def local_names(fdef: ast.FunctionDef) -> set[str]:
    """Names local to the function: parameters and names it binds (minus `global` ones)."""
    declared = {n for s in walk_scope(fdef) if isinstance(s, ast.Global) for n in s.names}
    body = ast.Module(body=fdef.body, type_ignores=[])
    return (set(parameters(fdef)) | set(bound_names(body))) - declared


def statement_index(fdef: ast.FunctionDef) -> dict[int, int]:
    """id(node) -> index of the top-level statement of the body that contains it."""
    return {id(n): i for i, stmt in enumerate(fdef.body) for n in ast.walk(stmt)}


def single_assignment(fdef: ast.FunctionDef, name: str) -> tuple[int, ast.Assign] | None:
    """The one top-level `name = value` statement of a name bound exactly once, if so."""
    if name in parameters(fdef) or local_counts(fdef)[name] != 1:
        return None
    for i, stmt in enumerate(fdef.body):
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id == name
        ):
            return i, stmt
    return None


def local_counts(fdef: ast.FunctionDef) -> Counter[str]:
    return bound_names(ast.Module(body=fdef.body, type_ignores=[]))


def all_names(node: ast.AST) -> set[str]:
    """Every identifier that appears in `node`, in any scope (for picking fresh names)."""
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    names |= {n.arg for n in ast.walk(node) if isinstance(n, ast.arg)}
    return names


def fresh_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_1`, `base_2`, ...: the first one not in `taken`, which it joins."""
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def loads(node: ast.AST, name: str) -> list[ast.Name]:
    """The Name nodes that read `name` in this scope (nested scopes excluded)."""
    return [
        n
        for n in walk_scope(node, skip_binding=name)
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
    ]


def holds_entry_value(block: list[ast.stmt], name: str, site: ast.AST) -> bool:
    """True when `name`, read at `site` inside `block`, surely still holds the value it had
    when `block` began: no statement that runs before the read can have rebound it."""
    for i, stmt in enumerate(block):
        if not any(n is site for n in ast.walk(stmt)):
            continue
        if any(bound_names(s)[name] for s in block[:i]):
            return False
        return _holds_in(stmt, name, site)
    return False


def _holds_in(stmt: ast.stmt, name: str, site: ast.AST) -> bool:
    def inside(part: ast.AST | None) -> bool:
        return part is not None and any(n is site for n in ast.walk(part))

    if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.Expr | ast.Return):
        return stmt.value is None or not bound_names(ast.Expr(stmt.value))[name]
    if isinstance(stmt, ast.If):
        if inside(stmt.test):
            return not bound_names(ast.Expr(stmt.test))[name]
        branch = stmt.body if any(inside(s) for s in stmt.body) else stmt.orelse
        return holds_entry_value(branch, name, site)
    if isinstance(stmt, ast.For):
        if inside(stmt.iter):
            return True
        loop = ast.Module(body=[*stmt.body, *stmt.orelse], type_ignores=[])
        if bound_names(stmt.target)[name] or bound_names(loop)[name]:
            return False
        return holds_entry_value([*stmt.body, *stmt.orelse], name, site)
    if isinstance(stmt, ast.With):
        if any(inside(item) for item in stmt.items):
            return True
        items = ast.Module(body=[ast.Expr(i.context_expr) for i in stmt.items], type_ignores=[])
        if any(i.optional_vars and bound_names(i.optional_vars)[name] for i in stmt.items):
            return False
        return not bound_names(items)[name] and holds_entry_value(stmt.body, name, site)
    return not bound_names(stmt)[name]


class _Replace(ast.NodeTransformer):
    def __init__(self, mapping: dict[int, ast.expr]) -> None:
        self.mapping = mapping

    def visit(self, node: ast.AST) -> ast.AST:
        found = self.mapping.get(id(node))
        if found is not None:
            return ast.copy_location(found, node)
        return super().visit(node)


def replace_nodes(tree: ast.AST, mapping: dict[int, ast.expr]) -> None:
    """Replace the nodes whose id() is a key of `mapping`, in place."""
    if mapping:
        _Replace(mapping).visit(tree)
