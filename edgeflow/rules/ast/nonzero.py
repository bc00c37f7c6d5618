"""ast.nonzero_to_mask: data-dependent selections become fixed-size mask arithmetic.

A selection is `x[m]` with `m` a boolean tensor (see _types.py for how that is decided),
`x[torch.where(m)]`, `x[torch.nonzero(m, as_tuple=True)]`, or `torch.masked_select(x, m)` /
`x.masked_select(m)`. Exact rewrites (numbers unchanged, no options needed):
- `.sum()`, `.mean()`, `.max()`/`.amax()`, `.min()`/`.amin()`, `.any()`, `.all()`, `.numel()`
  of a selection (method or `torch.<name>(sel)` form, without further arguments) ->
  `_edgeflow_rt.masked_sum(x, m)` etc.: a `torch.where(m, x, neutral)` reduction;
- `len(sel)`, `sel.shape[0]`, `sel.size(0)`, and the same of `torch.nonzero(m)`,
  `m.nonzero()`, `torch.argwhere(m)` -> the count of selected rows, a 0-d int64 tensor (it was
  a Python int: fine in arithmetic, not as a size);
- a name bound once to a selection (`sel = x[m]`) and only reduced as above is inlined.
Differences: `max()`/`min()` of an empty selection give the dtype's lowest/highest value
(the original raises); sums may round differently (order of addition).
With `max_size: K` (padded rewrites, which change the outputs on purpose):
- any other selection -> `_edgeflow_rt.masked_select_padded(x, m, K, fill)`: the selected
  rows in order, then rows of `fill`, K rows in all (rows beyond K are dropped);
- `torch.nonzero(m)`, `m.nonzero()`, `torch.argwhere(m)` ->
  `_edgeflow_rt.nonzero_padded(m, K, fill_index)`: (K, m.dim()) indices, padding rows hold
  `fill_index` (the validity mask is `idx[:, 0] != fill_index`);
- `torch.where(m)` with one argument, `torch.nonzero(m, as_tuple=True)` ->
  `_edgeflow_rt.nonzero_padded(m, K, fill_index).unbind(1)`.
Without `max_size` those sites are left as they are, each with a reason. Also a reason:
a boolean mask inside a multi-axis index (`x[:, m]`). Not looked at: masked assignment
`x[m] = v` (it keeps x's shape), `torch.unique` and other data-dependent ops.
"""

from __future__ import annotations

import ast
import copy
from typing import Any

from pydantic import PositiveInt

from edgeflow.rules.ast import _scope
from edgeflow.rules.ast._source import MISSING, Method, rewrite
from edgeflow.rules.ast._types import Types
from edgeflow.rules.base import AstRule, RewriteContext, RuleOptions, RuleResult
from edgeflow.rules.fixes import Fix

BEFORE = """\
def forward(self, scores, boxes):
    keep = scores > 0.5
    n = len(torch.nonzero(keep))
    return scores[keep].sum() / n, boxes[keep]
"""
AFTER = """\
def forward(self, scores, boxes):
    keep = scores > 0.5
    n = _edgeflow_rt.count_nonzero(keep)
    return (_edgeflow_rt.masked_sum(scores, keep) / n,
            _edgeflow_rt.masked_select_padded(boxes, keep, 16, 0.0))  # max_size: 16
"""
REDUCTIONS = {
    "sum": "masked_sum",
    "mean": "masked_mean",
    "max": "masked_amax",
    "amax": "masked_amax",
    "min": "masked_amin",
    "amin": "masked_amin",
    "any": "masked_any",
    "all": "masked_all",
    "numel": "masked_numel",
}


class NonzeroToMask(AstRule):
    name = "ast.nonzero_to_mask"
    description = "Rewrite nonzero, one-argument where and boolean-mask indexing to fixed sizes."
    fixes = (Fix.op("NonZero"), Fix.capture("nonzero"))
    example = (BEFORE, AFTER)

    class Options(RuleOptions):
        max_size: PositiveInt | None = None  # pad other selections to this many rows
        fill: float = 0.0  # value of the padding rows of a padded selection
        fill_index: int = -1  # index in the padding rows of padded nonzero/where

    def apply(self, model: Any, opts: Options, ctx: RewriteContext) -> RuleResult[Any]:
        def transform(method: Method) -> int:
            rewriter = _Rewriter(method, opts)
            _inline_reduced_aliases(rewriter)
            rewriter.visit(method.tree)
            return rewriter.count

        wanted = "nonzero, one-argument where, masked_select or boolean-mask indexing"
        return rewrite(model, ctx, self.name, transform, wanted)

    def tolerance(self, opts: Any) -> float | None:
        return 1e-5 if opts.max_size is None else None


class _Rewriter(ast.NodeTransformer):
    def __init__(self, method: Method, opts: NonzeroToMask.Options) -> None:
        import torch

        self.method = method
        self.opts = opts
        self.torch = torch
        self.types = Types(method)
        self.count = 0

    # --- recognising the patterns -------------------------------------------------------

    def _is(self, func: ast.expr, *names: str) -> bool:
        found = self.method.resolve(func)
        return found is not MISSING and any(found is getattr(self.torch, n) for n in names)

    def selection(self, node: ast.AST) -> tuple[ast.expr, ast.expr, bool] | None:
        """(x, mask, broadcast) of a masked selection, else None."""
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if self.types.boolean(node.slice):
                return node.value, node.slice, False
            found = self.nonzero(node.slice)
            if found is not None and found[1]:
                return node.value, self._as_mask(found[0]), False
            return None
        if not isinstance(node, ast.Call) or node.keywords:
            return None
        func = node.func
        if self._is(func, "masked_select") and len(node.args) == 2:
            return node.args[0], node.args[1], True
        if not (isinstance(func, ast.Attribute) and func.attr == "masked_select"):
            return None
        if len(node.args) == 1 and self.types.tensor(func.value):
            return func.value, node.args[0], True
        return None

    def nonzero(self, node: ast.AST) -> tuple[ast.expr, bool] | None:
        """(tensor, as_tuple) of torch.nonzero / argwhere / one-argument where, else None."""
        if not isinstance(node, ast.Call):
            return None
        func, args = node.func, node.args
        as_tuple = _as_tuple(node)
        if as_tuple is None:
            return None
        if self._is(func, "where") and len(args) == 1 and not node.keywords:
            return args[0], True
        if self._is(func, "nonzero", "argwhere") and len(args) == 1:
            return args[0], as_tuple
        if (
            isinstance(func, ast.Attribute)
            and func.attr in ("nonzero", "argwhere")
            and not args
            and self.types.tensor(func.value)
        ):
            return func.value, as_tuple
        return None

    def reduction(self, node: ast.AST) -> tuple[str, ast.expr] | None:
        """(kind, operand) of a whole-tensor reduction or a row count, else None."""
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "shape"
            and _is_zero(node.slice)
        ):
            return "len", node.value.value
        if not isinstance(node, ast.Call) or node.keywords:
            return None
        func, args = node.func, node.args
        if isinstance(func, ast.Name) and func.id == "len" and self.method.is_builtin("len"):
            return ("len", args[0]) if len(args) == 1 else None
        if isinstance(func, ast.Attribute):
            if func.attr == "size" and len(args) == 1 and _is_zero(args[0]):
                return "len", func.value
            if func.attr in REDUCTIONS and not args:
                return func.attr, func.value
        for name in REDUCTIONS:
            if self._is(func, name) and len(args) == 1:
                return name, args[0]
        return None

    def _as_mask(self, tensor: ast.expr) -> ast.expr:
        if self.types.boolean(tensor):
            return tensor
        return ast.Compare(left=tensor, ops=[ast.NotEq()], comparators=[ast.Constant(0)])

    # --- rewriting ----------------------------------------------------------------------

    def _helper(self, name: str, args: list[ast.expr], like: ast.AST, **kw: Any) -> ast.expr:
        keywords = [ast.keyword(arg=k, value=ast.Constant(v)) for k, v in kw.items()]
        call = ast.Call(func=self.method.runtime(name), args=args, keywords=keywords)
        return ast.copy_location(call, like)

    def generic_visit(self, node: ast.AST) -> ast.AST:
        reduced = self.reduction(node)
        if reduced is not None:
            kind, operand = reduced
            replaced = self._reduce(kind, operand, node)
            if replaced is not None:
                self.count += 1
                return super().generic_visit(replaced)
        selected = self.selection(node)
        if selected is not None:
            x, mask, broadcast = selected
            return self._padded_selection(node, self.visit(x), self.visit(mask), broadcast)
        node = super().generic_visit(node)
        found = self.nonzero(node)
        if found is not None:
            return self._padded_nonzero(node, *found)
        axes = (
            node.slice.elts
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple)
            else []
        )
        if any(self.types.boolean(e) for e in axes):
            self.method.note(node, f"{ast.unparse(node)}: a mask in a multi-axis index")
        return node

    def _reduce(self, kind: str, operand: ast.expr, node: ast.AST) -> ast.expr | None:
        selected = self.selection(operand)
        if selected is not None:
            x, mask, broadcast = selected
            if kind == "len" and not broadcast:
                return self._helper("count_nonzero", [mask], node)
            name = REDUCTIONS["numel" if kind == "len" else kind]
            extra = {"broadcast": True} if broadcast else {}
            return self._helper(name, [x, mask], node, **extra)
        found = self.nonzero(operand)
        if found is not None and not found[1] and kind == "len":
            return self._helper("count_nonzero", [found[0]], node)
        return None

    def _unsized(self, node: ast.AST) -> bool:
        if self.opts.max_size is None:
            self.method.note(node, f"{ast.unparse(node)} has a data-dependent size: set max_size")
            return True
        self.count += 1
        return False

    def _padded_selection(self, node: ast.AST, x: Any, mask: Any, broadcast: bool) -> ast.AST:
        if self._unsized(node):
            return node
        extra = {"broadcast": True} if broadcast else {}
        args = [x, mask, ast.Constant(self.opts.max_size), ast.Constant(self.opts.fill)]
        return self._helper("masked_select_padded", args, node, **extra)

    def _padded_nonzero(self, node: ast.AST, tensor: ast.expr, as_tuple: bool) -> ast.AST:
        if self._unsized(node):
            return node
        args = [tensor, ast.Constant(self.opts.max_size), ast.Constant(self.opts.fill_index)]
        padded = self._helper("nonzero_padded", args, node)
        if not as_tuple:
            return padded
        unbind = ast.Attribute(value=padded, attr="unbind", ctx=ast.Load())
        return ast.copy_location(ast.Call(func=unbind, args=[ast.Constant(1)], keywords=[]), node)


def _inline_reduced_aliases(rewriter: _Rewriter) -> None:
    """`sel = x[m]` bound once and used only by reductions: put `x[m]` into each of them."""
    method = rewriter.method
    tree = method.tree
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    counts = _scope.local_counts(tree)
    params = set(_scope.parameters(tree))
    for stmt in list(tree.body):
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            continue
        target, value = stmt.targets[0], stmt.value
        if not isinstance(target, ast.Name) or counts[target.id] != 1:
            continue
        selection = rewriter.selection(value) is not None
        if not selection and rewriter.nonzero(value) is None:
            continue
        operands = _operands(value)
        if any(isinstance(n, ast.Call) for n in operands):
            continue  # inlining would compute it once per use
        names = {n.id for n in operands if isinstance(n, ast.Name) and n.id in method.locals}
        if any(counts[n] + (n in params) > 1 for n in names):
            continue  # an operand is rebound: inlining could read another value
        uses = _scope.loads(tree, target.id)
        if uses and all(_reduced(use, parents, rewriter, selection) for use in uses):
            _scope.replace_nodes(tree, {id(u): copy.deepcopy(value) for u in uses})
            tree.body.remove(stmt)


def _operands(value: ast.expr) -> list[ast.AST]:
    """The sub-expressions of a selection other than its own where/nonzero call."""
    inner = value.slice if isinstance(value, ast.Subscript) else value
    skip = {id(inner)} if isinstance(inner, ast.Call) else set()
    skip |= {id(inner.func)} if isinstance(inner, ast.Call) else set()
    if isinstance(value, ast.Call):
        skip |= {id(value), id(value.func)}
    return [n for n in ast.walk(value) if id(n) not in skip and n is not value]


def _reduced(
    use: ast.AST, parents: dict[int, ast.AST], rewriter: _Rewriter, selection: bool
) -> bool:
    """Whether `use` is the operand of a reduction the rule rewrites exactly (of a selection,
    or for nonzero results, a row count)."""
    node: ast.AST = use
    for _ in range(3):  # use.sum() / torch.sum(use) / len(use) / use.shape[0] / use.size(0)
        parent = parents.get(id(node))
        if parent is None:
            return False
        found = rewriter.reduction(parent)
        if found is not None:
            return found[1] is use and (selection or found[0] == "len")
        node = parent
    return False


def _as_tuple(node: ast.Call) -> bool | None:
    """The constant `as_tuple=` of a call (False when absent); None when not a constant."""
    for keyword in node.keywords:
        if keyword.arg == "as_tuple":
            value = keyword.value
            return bool(value.value) if isinstance(value, ast.Constant) else None
    return False


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0 and not isinstance(node.value, bool)
