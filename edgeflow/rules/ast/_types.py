"""Static guesses of which expressions in a method are tensors, and boolean tensors.

Source carries no types, so this reads the code the way a reviewer would: forward's declared
inputs, parameters annotated `Tensor` (or unannotated without a default), buffers and
parameters of `self`, calls of torch functions and submodules, methods of tensors, and
arithmetic on any of these are tensors; a name is a tensor when every value bound to it is.
The guesses decide only whether a rule applies; the rules' runtime helpers check the rest.
"""

from __future__ import annotations

import ast
import inspect
from typing import Any

from edgeflow.rules.ast import _scope
from edgeflow.rules.ast._source import MISSING, Method

NOT_TENSOR_FUNCTIONS = {
    "is_tensor",
    "numel",
    "is_floating_point",
    "is_complex",
    "is_nonzero",
    "get_default_dtype",
    "is_grad_enabled",
    "result_type",
    "broadcast_shapes",
    "promote_types",
    "can_cast",
    "is_storage",
}
NOT_TENSOR_METHODS = {
    "item",
    "tolist",
    "dim",
    "ndimension",
    "size",
    "numel",
    "nelement",
    "element_size",
    "is_contiguous",
    "is_floating_point",
    "is_complex",
    "data_ptr",
    "stride",
    "storage_offset",
    "get_device",
    "numpy",
    "equal",
    "__len__",
}
TENSOR_ATTRIBUTES = {"T", "mT", "H", "mH", "data", "real", "imag", "grad"}
BOOL_FUNCTIONS = {
    "bool",
    "isnan",
    "isinf",
    "isfinite",
    "isposinf",
    "isneginf",
    "signbit",
    "isclose",
    "isin",
    "logical_and",
    "logical_or",
    "logical_xor",
    "logical_not",
    "gt",
    "lt",
    "ge",
    "le",
    "eq",
    "ne",
    "greater",
    "less",
    "greater_equal",
    "less_equal",
    "not_equal",
}
BOOL_OPS = (ast.BitAnd, ast.BitOr, ast.BitXor)


class Types:
    """Tensor-ness of the expressions of one method (as parsed before the rule edits it)."""

    def __init__(self, method: Method) -> None:
        self.method = method
        self.known: dict[str, bool] = {}  # names a rule created
        self.bool_known: dict[str, bool] = {}
        self.values = _bound_values(method.tree)
        self.params = _tensor_parameters(method)
        self._busy: set[tuple[str, bool]] = set()

    def tensor(self, node: ast.AST) -> bool:
        """Whether `node` surely evaluates to a torch.Tensor (by the reading above)."""
        import torch

        if isinstance(node, ast.Name):
            return self._name(node.id, boolean=False)
        if isinstance(node, ast.Call):
            return self._call(node, torch)
        if isinstance(node, ast.Attribute):
            if node.attr in TENSOR_ATTRIBUTES and self.tensor(node.value):
                return True
            return isinstance(self.method.resolve(node), torch.Tensor)
        if isinstance(node, ast.BinOp):
            return self.tensor(node.left) or self.tensor(node.right)
        if isinstance(node, ast.UnaryOp):
            return not isinstance(node.op, ast.Not) and self.tensor(node.operand)
        if isinstance(node, ast.Compare):
            plain = all(isinstance(op, _VALUE_COMPARE) for op in node.ops)
            return plain and any(self.tensor(o) for o in (node.left, *node.comparators))
        if isinstance(node, ast.Subscript):
            return self.tensor(node.value)
        if isinstance(node, ast.IfExp):
            return self.tensor(node.body) and self.tensor(node.orelse)
        return False

    def boolean(self, node: ast.AST) -> bool:
        """Whether `node` surely evaluates to a tensor of dtype bool."""
        import torch

        if isinstance(node, ast.Name):
            return self._name(node.id, boolean=True)
        if isinstance(node, ast.Compare):
            return self.tensor(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
            return self.boolean(node.operand)
        if isinstance(node, ast.BinOp) and isinstance(node.op, BOOL_OPS):
            return self.boolean(node.left) and self.boolean(node.right)
        if isinstance(node, ast.Subscript):
            return self.boolean(node.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if self.tensor(func.value) and func.attr in (*BOOL_FUNCTIONS, "any", "all"):
                return True
            if func.attr == "to" and self.tensor(func.value) and node.args:
                return self.method.resolve(node.args[0]) is torch.bool
            found = self.method.resolve(func)
            return found is not MISSING and _torch_function(found, torch) in BOOL_FUNCTIONS
        return False

    def _name(self, name: str, boolean: bool) -> bool:
        known = self.bool_known if boolean else self.known
        if name in known:
            return known[name]
        if (name, boolean) in self._busy:
            return True  # a cycle (x = x + 1): the other bindings decide
        values = self.values.get(name, [])
        from_param = self.params.get(name)
        if from_param is not None:
            if not (from_param == "bool" if boolean else True):
                return False
        elif not values:
            return False
        self._busy.add((name, boolean))
        try:
            check = self.boolean if boolean else self.tensor
            return all(v is not None and check(v) for v in values)
        finally:
            self._busy.discard((name, boolean))

    def _call(self, node: ast.Call, torch: Any) -> bool:
        func = node.func
        if isinstance(func, ast.Attribute) and self.tensor(func.value):
            return func.attr not in NOT_TENSOR_METHODS
        found = self.method.resolve(func)
        if found is MISSING:
            return False
        if isinstance(found, torch.nn.Module):
            return True  # a submodule: taken to return a tensor
        name = _torch_function(found, torch)
        if name is not None:
            return name not in NOT_TENSOR_FUNCTIONS
        try:
            returns = inspect.signature(found).return_annotation
        except (TypeError, ValueError):
            return False
        return "Tensor" in str(returns) and "tuple" not in str(returns).lower()


_VALUE_COMPARE = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _torch_function(found: Any, torch: Any) -> str | None:
    """The name of a torch function (torch.*, torch.nn.functional.*, ...), else None."""
    module = getattr(found, "__module__", None) or ""
    name = getattr(found, "__name__", None)
    if module.split(".")[0] != "torch" or not isinstance(name, str) or isinstance(found, type):
        return None
    return name


def _bound_values(tree: ast.FunctionDef) -> dict[str, list[ast.expr | None]]:
    """For each local name, the expressions bound to it (None: bound some other way)."""
    values: dict[str, list[ast.expr | None]] = {}

    def bind(target: ast.AST, value: ast.expr | None, element: bool = False) -> None:
        if isinstance(target, ast.Name):
            values.setdefault(target.id, []).append(_Element(value) if element else value)
        elif isinstance(target, ast.Tuple | ast.List):
            if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(target.elts):
                for t, v in zip(target.elts, value.elts, strict=True):
                    bind(t, v)
            else:
                for t in target.elts:
                    bind(t, value, element=True)
        elif isinstance(target, ast.Starred):
            bind(target.value, None)

    for node in _scope.walk_scope(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                bind(target, node.value)
        elif isinstance(node, ast.AugAssign):
            bind(node.target, ast.BinOp(left=_load(node.target), op=node.op, right=node.value))
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr):
            bind(node.target, node.value)
        elif isinstance(node, ast.For):
            bind(node.target, node.iter, element=True)
        elif isinstance(node, ast.With):
            for item in node.items:
                if item.optional_vars is not None:
                    bind(item.optional_vars, None)
    for name in _scope.local_counts(tree):
        values.setdefault(name, [None])
    return values


class _Element(ast.Subscript):
    """An element of a tensor (or of a tuple of tensors): `a, b = x.chunk(2)`."""

    def __init__(self, value: ast.expr | None) -> None:
        super().__init__(value=value or ast.Constant(None), slice=ast.Constant(0), ctx=ast.Load())


def _load(target: ast.AST) -> ast.expr:
    if isinstance(target, ast.Name):
        return ast.Name(id=target.id, ctx=ast.Load())
    return ast.Constant(None)


def _tensor_parameters(method: Method) -> dict[str, str]:
    """Parameters taken to be tensors -> dtype ('bool', 'float32', ... or '' if unknown)."""
    tree = method.tree
    found: dict[str, str] = {}
    positional = _scope.positional(tree)
    if method.is_root:
        for name, spec in zip(positional, method.ctx.inputs, strict=False):
            found[name] = spec.dtype
        return found
    args = tree.args
    plain = [*args.posonlyargs, *args.args][1:]
    defaults = [None] * (len(plain) - len(args.defaults)) + list(args.defaults)
    for arg, default in zip(plain, defaults, strict=True):
        note = ast.unparse(arg.annotation) if arg.annotation else ""
        if ("Tensor" in note and "Optional" not in note and "None" not in note) or (
            not note and default is None
        ):
            found[arg.arg] = ""
    return found
