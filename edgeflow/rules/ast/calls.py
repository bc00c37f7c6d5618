"""ast.replace_call: call another function wherever the model calls a given one.

`{rule: ast.replace_call, from: torchvision.ops.nms, to: edgeflow.ops.static:nms_fixed}`.
Both are import paths (`pkg.mod.attr` or `pkg.mod:attr`), imported when the rule is applied.
Handled: calls whose callee is a name or attribute chain that resolves, through the module's
globals (imports, aliases such as `from torchvision.ops import nms as tv_nms`), to the same
object as `from`. Each call's arguments must fit `to`'s signature (checked when it has one).
Not handled: tensor-method spellings (`x.nonzero()` for `torch.nonzero`), calls through
local variables, attributes of `self` or containers, and references that are not calls.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from typing import Any

from pydantic import Field, field_validator

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.ast._source import Method, rewrite, user_error
from edgeflow.rules.base import AstRule, RewriteContext, RuleOptions, RuleResult
from edgeflow.rules.fixes import Fix

BEFORE = """\
def forward(self, boxes, scores):
    keep = torchvision.ops.nms(boxes, scores, 0.5)
    return boxes[keep]
"""
AFTER = """\
def forward(self, boxes, scores):
    keep = nms_fixed(boxes, scores, 0.5)
    return boxes[keep]
"""


def _import_path(text: str) -> str:
    module, sep, attr = text.partition(":") if ":" in text else (text, "", "")
    parts = [*module.split("."), *(attr.split(".") if sep else [])]
    if not all(p.isidentifier() for p in parts) or (not sep and len(parts) < 2):
        raise ValueError(f"expected an import path like 'package.module.name' (got {text!r})")
    return text


def _replacement_path(text: str) -> str:
    """An import path of code the model will call: never the standard library's (as every
    code reference, see edgeflow.core.refcheck; checked again on the object when loaded)."""
    from edgeflow.core.refcheck import StdlibRef, is_stdlib_module
    from edgeflow.schema.base import user_error as located

    module = _import_path(text).partition(":")[0]
    if is_stdlib_module(module):
        raise located(
            f"{text} names the standard library: a replacement must be code of your own files "
            "or of an installed package",
            StdlibRef.hint,
        )
    return text


class ReplaceCall(AstRule):
    name = "ast.replace_call"
    description = "Call another function (by import path) wherever the model calls a given one."
    fixes = (Fix.op("NonMaxSuppression"), Fix.capture("nonzero"), Fix.capture("unsupported"))
    example = (BEFORE, AFTER)

    class Options(RuleOptions):
        from_: str = Field(alias="from")  # import path of the function the model calls
        to: str  # import path of its replacement, e.g. edgeflow.ops.static:nms_fixed

        @field_validator("from_")
        @classmethod
        def _import_path(cls, text: str) -> str:
            return _import_path(text)  # matched, never called: any function may be replaced

        @field_validator("to")
        @classmethod
        def _replacement(cls, text: str) -> str:
            return _replacement_path(text)

    def apply(self, model: Any, opts: Options, ctx: RewriteContext) -> RuleResult[Any]:
        old, new = load(opts.from_, "from"), load(opts.to, "to")
        try:
            signature: inspect.Signature | None = inspect.signature(new)
        except (TypeError, ValueError):
            signature = None  # some builtins have none: nothing to check calls against

        def transform(method: Method) -> int:
            return _replace(method, old, new, signature, opts.to)

        return rewrite(model, ctx, self.name, transform, f"call to {opts.from_}")

    def tolerance(self, opts: Any) -> float | None:
        return None  # the replacement may compute something else on purpose (padded outputs)


def load(path: str, key: str, rule: str = "ast.replace_call", must_call: bool = True) -> Any:
    """The object an import path names; EdgeflowError when it cannot be imported."""
    module, sep, attr = path.partition(":")
    names = attr.split(".") if sep else []
    if not sep:  # pkg.mod.attr: import the longest prefix that is a module
        parts = path.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            if _importable(".".join(parts[:cut])):
                module, names = ".".join(parts[:cut]), parts[cut:]
                break
    try:
        obj: Any = importlib.import_module(module)
        for name in names:
            obj = getattr(obj, name)
    except (ImportError, AttributeError) as exc:
        raise EdgeflowError(
            f"{rule}: cannot import {key} '{path}': {exc}",
            f"check the '{key}' path, and that its package is installed",
        ) from exc
    if must_call and not callable(obj):
        raise EdgeflowError(f"{rule}: {key} '{path}' is not callable")
    if key in ("to", "with"):  # what the model will call instead
        from edgeflow.core.refcheck import StdlibRef, check_loaded

        try:
            check_loaded(obj, f"{rule}: {key} '{path}'")
        except StdlibRef as exc:
            raise EdgeflowError(str(exc), StdlibRef.hint) from None
    return obj


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _replace(
    method: Method, old: Any, new: Any, signature: inspect.Signature | None, to: str
) -> int:
    count = 0
    for node in ast.walk(method.tree):
        if not isinstance(node, ast.Call) or method.resolve(node.func) is not old:
            continue
        if signature is not None:
            _check_fits(method, node, signature, to)
        name = method.global_name(new, getattr(new, "__name__", "replacement"))
        node.func = ast.copy_location(ast.Name(id=name, ctx=ast.Load()), node.func)
        count += 1
    return count


def _check_fits(method: Method, call: ast.Call, signature: inspect.Signature, to: str) -> None:
    starred = any(isinstance(a, ast.Starred) for a in call.args)
    if starred or any(k.arg is None for k in call.keywords):
        return  # *args / **kwargs: the arguments are known only at run time
    try:
        signature.bind(*call.args, **{k.arg: k.value for k in call.keywords if k.arg})
    except TypeError as exc:
        raise user_error(
            method,
            call,
            f"the call {ast.unparse(call)} does not fit {to}{signature}: {exc}",
            "choose a replacement with the same parameters, or wrap it in a function that has them",
        ) from None
