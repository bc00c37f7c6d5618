"""ast.float64_to_float32: compute in float32 where the model's source asks for float64.

Handled, in forward and the methods it reaches:
- any expression that resolves to `torch.float64` / `torch.double` (`torch.float64`,
  `torch.double`, `from torch import float64`, `self.dtype` holding it) -> `torch.float32`;
  `torch.DoubleTensor` -> `torch.FloatTensor`;
- `<expr>.double()` with no arguments -> `<expr>.float()`;
- `dtype=float` (Python's float means float64 to torch) -> `dtype=torch.float32`;
- `.type('torch.DoubleTensor')` -> `.type('torch.FloatTensor')`;
- with `parameters: true` (default), float64 parameters and buffers of the copy -> float32.
Left as is, with a reason: float64 inside a comparison (`x.dtype == torch.float64`), since
changing it would change which branch runs. Not seen at all: float64 that comes from data
(`torch.from_numpy` of a float64 array, float64 inputs) or from code the rule does not reach.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

from edgeflow.rules.ast._source import Method, rewrite
from edgeflow.rules.base import AstRule, RewriteContext, RuleOptions, RuleResult, Site, Status
from edgeflow.rules.fixes import Fix

if TYPE_CHECKING:
    import torch

BEFORE = """\
def forward(self, x):
    y = self.conv(x.double())
    return y.to(dtype=torch.float64) * torch.ones(1, dtype=float)
"""
AFTER = """\
def forward(self, x):
    y = self.conv(x.float())
    return y.to(dtype=torch.float32) * torch.ones(1, dtype=torch.float32)
"""


class Float64ToFloat32(AstRule):
    name = "ast.float64_to_float32"
    description = "Replace torch.float64/.double()/dtype=float in model source with float32."
    fixes = (Fix.finding("float64"), Fix.capture("float64"))
    example = (BEFORE, AFTER)

    class Options(RuleOptions):
        parameters: bool = True  # also cast float64 parameters and buffers to float32

    def apply(self, model: Any, opts: Options, ctx: RewriteContext) -> RuleResult[Any]:
        result = rewrite(
            model, ctx, self.name, _transform, "torch.float64, .double() or dtype=float"
        )
        cast = _cast_tensors(result.model) if opts.parameters else []
        if not cast:
            return result
        sites = [s for s in result.sites if s.status is not Status.NOT_APPLICABLE]
        sites += [Site.changed(name, "float64 -> float32") for name in cast]
        matches = result.matches + len(cast)
        return RuleResult(result.model, matches=matches, sites=sites, sources=result.sources)

    def tolerance(self, opts: Any) -> float | None:
        return 1e-4  # float32 rounding of values of order 1


def _transform(method: Method) -> int:
    import torch

    rewriter = _Rewriter(method, torch)
    rewriter.visit(method.tree)
    return rewriter.count


class _Rewriter(ast.NodeTransformer):
    def __init__(self, method: Method, torch: Any) -> None:
        self.method = method
        self.torch = torch
        self.count = 0

    def _is(self, node: ast.AST, *objects: Any) -> bool:
        found = self.method.resolve(node)
        return any(found is obj for obj in objects)

    def _torch_attr(self, node: ast.AST, attr: str) -> ast.expr:
        self.count += 1
        if isinstance(node, ast.Attribute) and self._is(node.value, self.torch):
            base = node.value
        else:
            base = self.method.torch_name()
        return ast.copy_location(ast.Attribute(base, attr, ast.Load()), node)

    def _replace(self, node: ast.expr) -> ast.expr | None:
        if isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Load):
            if self._is(node, self.torch.float64):
                return self._torch_attr(node, "float32")
            if self._is(node, self.torch.DoubleTensor):
                return self._torch_attr(node, "FloatTensor")
        return None

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return self._replace(node) or node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        return self._replace(node) or self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        operands = [node.left, *node.comparators]
        if any(self._is(o, self.torch.float64, self.torch.DoubleTensor) for o in operands):
            self.method.note(node, "float64 in a comparison left as is (it decides a branch)")
            return node
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "double"
            and not node.args
            and not node.keywords
            and not self._is(func.value, self.torch)
        ):
            func.attr = "float"
            self.count += 1
        for keyword in node.keywords:
            if keyword.arg == "dtype" and self._is(keyword.value, float):
                keyword.value = self._torch_attr(keyword.value, "float32")
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "type"
            and len(node.args) == 1
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == "torch.DoubleTensor"
        ):
            node.args[0] = ast.copy_location(ast.Constant("torch.FloatTensor"), node.args[0])
            self.count += 1
        return node


def _cast_tensors(model: torch.nn.Module) -> list[str]:
    """Cast float64 parameters and buffers to float32 in place; their names."""
    import torch

    cast = []
    for path, module in model.named_modules():
        prefix = f"{path}." if path else ""
        for name, param in module.named_parameters(recurse=False):
            if param.dtype == torch.float64:
                param.data = param.data.float()
                cast.append(prefix + name)
        for name, buf in module.named_buffers(recurse=False):
            if buf is not None and buf.dtype == torch.float64:
                module._buffers[name] = buf.float()
                cast.append(prefix + name)
    return cast
