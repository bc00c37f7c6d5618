"""ast.static_item: tensor-to-Python conversions whose value is fixed become constants.

Sites: `<t>.item()`, `int(<t>)`, `float(<t>)` where `<t>` is a tensor. The rule evaluates
`<t>` when the rule is applied, with forward's arguments as meta tensors of the declared
shapes (so only their shapes are known), buffers and parameters of the module as they are,
names bound once at the top level of the method before the site, literals, module constants,
torch functions and methods of tensors (not in-place ones, not submodules or other methods).
- decidable (the value does not depend on input values): the site becomes the constant;
- not decidable and used to build a shape (a size argument of view/reshape/expand/repeat/
  new_*/narrow/unflatten/topk/split/chunk/tile, torch.zeros/ones/empty/full/arange/rand*/
  linspace/eye, range(), a slice bound, or a name that flows into one): EdgeflowError naming
  the source file:line;
- not decidable otherwise: left as is, with a reason.
Parameters are folded with their values at apply time: later weight changes are not seen.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

from edgeflow.rules.ast import _scope
from edgeflow.rules.ast._source import MISSING, Method, rewrite, user_error
from edgeflow.rules.base import AstRule, RewriteContext, RuleOptions, RuleResult
from edgeflow.rules.fixes import Fix

if TYPE_CHECKING:
    import torch

BEFORE = """\
def forward(self, x):
    k = int(self.num_anchors)
    return x.view(k, -1)[:, : torch.tensor(x.shape[1:]).prod().item()]
"""
AFTER = """\
def forward(self, x):
    k = 3
    return x.view(k, -1)[:, :64]
"""
SHAPE_METHODS = {
    "view",
    "reshape",
    "expand",
    "repeat",
    "new_zeros",
    "new_ones",
    "new_empty",
    "new_full",
    "narrow",
    "unflatten",
    "topk",
    "split",
    "chunk",
    "tile",
    "unfold",
}
SHAPE_FUNCTIONS = {
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "rand",
    "randn",
    "randint",
    "linspace",
    "eye",
    "reshape",
    "narrow",
    "split",
    "chunk",
    "topk",
    "tile",
    "range",
    "interpolate",
    "pad",
}
SAFE_BUILTINS = {
    "len",
    "int",
    "float",
    "bool",
    "min",
    "max",
    "abs",
    "sum",
    "round",
    "tuple",
    "list",
}


class StaticItem(AstRule):
    name = "ast.static_item"
    description = (
        "Replace .item()/int(t)/float(t) whose value is fixed by the model with constants."
    )
    fixes = (Fix.capture("item"), Fix.capture("baked_branch"))
    example = (BEFORE, AFTER)

    class Options(RuleOptions):
        pass

    def apply(self, model: Any, opts: Options, ctx: RewriteContext) -> RuleResult[Any]:
        return rewrite(
            model, ctx, self.name, _static_items, ".item(), int(tensor) or float(tensor)"
        )


class Undecidable(Exception):
    pass


def _static_items(method: Method) -> int:
    import torch

    evaluator = _Evaluator(method, torch)
    parents = {id(c): p for p in ast.walk(method.tree) for c in ast.iter_child_nodes(p)}
    shape_names = _shape_names(method.tree, parents)
    mapping: dict[int, ast.expr] = {}
    for node in _scope.walk_scope(method.tree):
        operand = _site(node, method) if isinstance(node, ast.Call) else None
        if operand is None or not isinstance(node, ast.Call):
            continue
        try:
            value = evaluator.value(operand, node)
            if not isinstance(value, torch.Tensor):
                continue  # int(<Python number>): not a tensor conversion
            if value.is_meta:
                raise Undecidable("it depends on the values of forward's inputs")
            result = _convert(node, value)
        except Undecidable as exc:
            if isinstance(node.func, ast.Name) and not evaluator.types.tensor(operand):
                continue  # int(n) of something that may not be a tensor at all
            if _shape_use(node, parents, shape_names):
                raise user_error(
                    method,
                    node,
                    f"{ast.unparse(node)} is used to build a shape, but {exc}",
                    "compute the size from shapes or a Python int attribute of the model",
                ) from None
            method.note(node, f"{ast.unparse(node)} left as is ({exc}): not used for a shape")
            continue
        mapping[id(node)] = ast.Constant(result)
    _scope.replace_nodes(method.tree, mapping)
    if mapping:
        method.fold()
    return len(mapping)


def _site(node: ast.Call, method: Method) -> ast.expr | None:
    """The tensor operand of `t.item()`, `int(t)`, `float(t)`, else None."""
    if node.keywords:
        return None
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "item" and not node.args:
        return func.value
    if (
        isinstance(func, ast.Name)
        and func.id in ("int", "float")
        and method.is_builtin(func.id)
        and len(node.args) == 1
    ):
        return node.args[0]
    return None


def _convert(node: ast.Call, value: torch.Tensor) -> Any:
    if value.numel() != 1:
        raise Undecidable(f"it converts a tensor of {value.numel()} elements")
    if isinstance(node.func, ast.Name):
        return int(value) if node.func.id == "int" else float(value)
    return value.item()


class _Evaluator:
    """Values of expressions at a site, from what is fixed when the rule is applied."""

    def __init__(self, method: Method, torch: Any) -> None:
        from edgeflow.rules.ast._types import Types

        self.method = method
        self.torch = torch
        self.types = Types(method)
        self.index = _scope.statement_index(method.tree)
        self.inputs = dict(
            zip(_scope.positional(method.tree), method.ctx.inputs, strict=False)
            if method.is_root
            else []
        )

    def value(self, expr: ast.expr, site: ast.AST) -> Any:
        names: dict[str, Any] = {}
        for node in ast.walk(expr):
            self._check(node)
            if isinstance(node, ast.Name) and node.id not in names:
                names[node.id] = self._name(node.id, site)
        code = compile(ast.fix_missing_locations(ast.Expression(expr)), "<edgeflow>", "eval")
        try:
            return eval(code, {"__builtins__": {}}, names)
        except Exception as exc:
            meta = any(isinstance(v, self.torch.Tensor) and v.is_meta for v in names.values())
            if meta:
                raise Undecidable("it depends on the values of forward's inputs") from None
            raise Undecidable(f"evaluating it failed: {type(exc).__name__}: {exc}") from None

    def _check(self, node: ast.AST) -> None:
        if isinstance(node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp):
            raise Undecidable("it contains a lambda or comprehension")
        if isinstance(node, ast.GeneratorExp | ast.NamedExpr | ast.Await | ast.Starred):
            raise Undecidable(f"it contains {type(node).__name__}")
        if not isinstance(node, ast.Call):
            return
        func = node.func
        found = self.method.resolve(func)
        if isinstance(found, self.torch.nn.Module):
            raise Undecidable(f"it calls the submodule {ast.unparse(func)}")
        if found is not MISSING:
            module = (getattr(found, "__module__", None) or "").split(".")[0]
            builtin = isinstance(func, ast.Name) and func.id in SAFE_BUILTINS
            if not builtin and module != "torch":
                raise Undecidable(f"it calls {ast.unparse(func)}")
            return
        if not isinstance(func, ast.Attribute):
            raise Undecidable(f"it calls {ast.unparse(func)}")
        if func.attr.endswith("_") and not func.attr.endswith("__"):
            raise Undecidable(f"it calls the in-place method {func.attr}")

    def _name(self, name: str, site: ast.AST) -> Any:
        method = self.method
        if name == method.self_name:
            return method.instance
        if name in self.inputs:
            if not _scope.holds_entry_value(method.tree.body, name, site):
                raise Undecidable(f"{name} is rebound before it")
            spec = self.inputs[name]
            dtype = getattr(self.torch, spec.dtype)
            return self.torch.empty(spec.shape, dtype=dtype, device="meta")
        if name in method.locals:
            found = _scope.single_assignment(method.tree, name)
            where = self.index.get(id(site))
            if found is None or where is None or found[0] >= where:
                raise Undecidable(f"{name} is not bound once, at the top level, before it")
            return self.value(found[1].value, found[1])
        value = method.resolve(ast.Name(id=name, ctx=ast.Load()))
        if value is MISSING:
            raise Undecidable(f"{name} is not known")
        return value


def _shape_call(call: ast.Call, child: ast.AST) -> bool:
    """Whether `child`, an argument of `call`, is a size (over-approximated for calls that
    also take tensors, such as torch.reshape(x, shape))."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    if name in ("full", "new_full"):
        return bool(call.args) and child is call.args[0]
    if name in ("interpolate", "pad"):
        second = len(call.args) > 1 and child is call.args[1]
        return second or (isinstance(child, ast.keyword) and child.arg in ("size", "pad"))
    if isinstance(func, ast.Attribute) and name in SHAPE_METHODS:
        return True
    return name in SHAPE_FUNCTIONS


def _shape_use(node: ast.AST, parents: dict[int, ast.AST], names: set[str]) -> bool:
    """Whether the value of `node` flows into a size, an index bound, or a name in `names`."""
    child = node
    while id(child) in parents:
        parent = parents[id(child)]
        if isinstance(parent, ast.stmt):
            targets = parent.targets if isinstance(parent, ast.Assign) else []
            bound = [n for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            return any(n.id in names for n in bound)
        if isinstance(parent, ast.Subscript) and child is parent.slice:
            return True
        if isinstance(parent, ast.Call) and child is not parent.func and _shape_call(parent, child):
            return True
        child = parent
    return False


def _shape_names(tree: ast.FunctionDef, parents: dict[int, ast.AST]) -> set[str]:
    """Local names whose values flow into a size or an index bound."""
    names = {
        n.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and _shape_use(n, parents, set())
    }
    while True:
        more = {
            n.id
            for stmt in ast.walk(tree)
            if isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id in names for t in stmt.targets)
            for n in ast.walk(stmt.value)
            if isinstance(n, ast.Name)
        }
        if more <= names:
            return names
        names |= more
