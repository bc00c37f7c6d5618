"""ast.replace_method: give every instance of a class a different method, written for export.

`{rule: ast.replace_method, method: torchvision.models.detection.ssd.SSD.forward}` replaces
the method with edgeflow's own static-shape version from the built-in library (LIBRARY);
`with: mypkg.static:forward` names any other function (or `Replacement`) instead. Where the
other ast.* rules edit statements, this one swaps a whole method: the right tool when the data
flow of a method has to change as a whole (a detector's post-processing carries a validity
mask through mask -> topk -> concat -> NMS -> gather), or when the method is library code,
which the statement-level rules leave alone.

A replacement is written against one version of the original: it carries the sha256 of the
original's source (`inspect.getsource`), and the rule refuses to apply it when the installed
library's source differs, naming both hashes. Its `check` refuses instances whose settings it
does not reproduce (for SSD: a transform that resizes to another size than the declared
input's), and its `prepare` adds what it needs to the instance (constant buffers, computed
once from the declared input shape). The model is deep-copied; the original is untouched.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from pydantic import Field, field_validator

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.ast._source import _give
from edgeflow.rules.ast.calls import _import_path, _replacement_path, load
from edgeflow.rules.base import AstRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.fixes import Fix

NAME = "ast.replace_method"

# Qualified name of the original method -> import path of its Replacement. Imported only
# when a recipe names the method, so that this list costs nothing.
LIBRARY = {
    "torchvision.models.detection.ssd.SSD.forward": (
        "edgeflow.rules.ast.replacements.torchvision_detection:SSD_FORWARD"
    ),
}

BEFORE = """\
class SSD(nn.Module):  # torchvision.models.detection.ssd
    def forward(self, images, targets=None):
        original_image_sizes = []
        for img in images:  # fails symbolic_trace
            original_image_sizes.append(img.shape[-2:])
        images, targets = self.transform(images, targets)
        ...
        detections = self.postprocess_detections(head_outputs, anchors, images.image_sizes)
        return self.transform.postprocess(detections, images.image_sizes, original_image_sizes)
"""
AFTER = """\
def ssd_forward(self, images):  # edgeflow.rules.ast.replacements.torchvision_detection
    x = (images - self._edgeflow_image_mean) / self._edgeflow_image_std
    head = self.head(features(self.backbone(x)))
    # padded: boxes [B, D, 4], scores [B, D], labels [B, D], valid [B, D]
    return ssd_postprocess(self, head["bbox_regression"], head["cls_logits"])
"""


@dataclass(frozen=True)
class Replacement:
    """A method written to replace `original` for export."""

    function: Callable[..., Any]  # def f(self, ...): becomes the method
    source_sha256: str | None = None  # of the original's source it was written against
    written_for: str = ""  # e.g. "torchvision 0.29.1", for the mismatch message
    check: Callable[[Any, RewriteContext], list[str]] | None = None  # why it cannot apply
    prepare: Callable[[Any, RewriteContext], None] | None = None  # buffers on the instance


def source_sha256(function: Callable[..., Any]) -> str:
    """sha256 of a function's dedented source text."""
    text = textwrap.dedent(inspect.getsource(function))
    return hashlib.sha256(text.encode()).hexdigest()


class ReplaceMethod(AstRule):
    name = NAME
    description = (
        "Replace a method of every instance of a class (library classes too) with a "
        "version written for export; built-in: torchvision SSD.forward."
    )
    fixes = (Fix.op("NonMaxSuppression"),)
    example = (BEFORE, AFTER)

    class Options(RuleOptions):
        method: str  # import path of the method: package.module.Class.method
        with_: str | None = Field(None, alias="with")  # replacement; default: built-in library
        source_sha256: str | None = None  # the original's source hash the replacement expects

        @field_validator("method")
        @classmethod
        def _import_path(cls, text: str) -> str:
            return _import_path(text)

        @field_validator("with_")
        @classmethod
        def _replacement(cls, text: str | None) -> str | None:
            return None if text is None else _replacement_path(text)

    def apply(self, model: Any, opts: Options, ctx: RewriteContext) -> RuleResult[Any]:
        cls, attr, original = _method(opts.method)
        qualified = f"{original.__module__}.{original.__qualname__}"
        replacement = _replacement(opts.with_, qualified)
        expected = opts.source_sha256 or replacement.source_sha256
        digest = source_sha256(original)
        if expected is not None and digest != expected:
            written = f" (written for {replacement.written_for})" if replacement.written_for else ""
            raise EdgeflowError(
                f"{NAME}: the source of {qualified} is not the one its replacement was written "
                f"against{written}: sha256 {digest[:12]}, expected {expected[:12]}",
                "install the version the replacement was written for, or read the replacement "
                f"against the new source and set source_sha256: {digest}",
            )
        method = _method_copy(replacement.function)
        copy_ = copy.deepcopy(model)
        classes: dict[tuple[Any, ...], type] = {}
        sites: list[Site] = []
        for path, instance in copy_.named_modules():
            where = path or "the model"
            if not isinstance(instance, cls):
                continue
            current = vars(type(instance)).get(attr)
            if getattr(current, "__edgeflow_replacement__", None) is replacement.function:
                sites.append(Site.kept(path, f"{qualified} already replaced"))
                continue
            problems = replacement.check(instance, _at(ctx, path)) if replacement.check else []
            if problems:
                raise EdgeflowError(
                    f"{NAME}: cannot replace {qualified} in {where}: {'; '.join(problems)}",
                    "change the recipe (or the model) as the message says, or write a "
                    "replacement for this configuration and give it as 'with'",
                )
            if replacement.prepare is not None:
                replacement.prepare(instance, _at(ctx, path))
            _give(cast(Any, instance), {attr: method}, classes)
            sites.append(Site.changed(path, f"{qualified} replaced (source sha256 {digest[:12]})"))
        result = RuleResult(copy_, sites=sites)
        if result.changed:
            result.sources[f"{cls.__name__}.{attr}"] = method.__edgeflow_source__  # type: ignore[attr-defined]
        elif not sites:
            nothing = Site.not_applicable(f"no instance of {cls.__qualname__} in the model")
            result = RuleResult(copy_, sites=[nothing])
        return result

    def tolerance(self, opts: Any) -> float | None:
        return None  # a replacement may change the output form on purpose (padded detections)


def _at(ctx: RewriteContext, path: str) -> RewriteContext:
    """The context for an instance: declared inputs describe only the root module's."""
    return ctx if path == "" else RewriteContext([], ctx.base_dir, ctx.dynamic_batch)


def _method(path: str) -> tuple[type, str, types.FunctionType]:
    owner, _, attr = path.replace(":", ".").rpartition(".")
    cls = load(owner, "method", NAME)
    if not isinstance(cls, type):
        raise EdgeflowError(
            f"{NAME}: '{owner}' is not a class", "give the method as package.module.Class.method"
        )
    function = inspect.getattr_static(cls, attr, None)
    if not isinstance(function, types.FunctionType):
        raise EdgeflowError(
            f"{NAME}: {cls.__qualname__} has no method '{attr}'",
            "give the method as package.module.Class.method",
        )
    return cls, attr, function


def _method_copy(function: Callable[..., Any]) -> types.FunctionType:
    """A copy of the replacement that carries what rewritten methods carry (its source, the
    rule), so that the original function object is never modified."""
    if not isinstance(function, types.FunctionType):
        raise EdgeflowError(f"{NAME}: the replacement {function!r} is not a Python function")
    copy_ = types.FunctionType(
        function.__code__,
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    copy_.__kwdefaults__ = function.__kwdefaults__
    copy_.__qualname__ = function.__qualname__
    copy_.__doc__ = function.__doc__
    copy_.__edgeflow_source__ = textwrap.dedent(inspect.getsource(function))  # type: ignore[attr-defined]
    copy_.__edgeflow_rules__ = (NAME,)  # type: ignore[attr-defined]
    copy_.__edgeflow_replacement__ = function  # type: ignore[attr-defined]
    return copy_


def _replacement(path: str | None, qualified: str) -> Replacement:
    if path is None:
        if qualified not in LIBRARY:
            raise EdgeflowError(
                f"{NAME}: edgeflow has no built-in replacement for {qualified}",
                f"give one with 'with: package.module:function'; built-in: {', '.join(LIBRARY)}",
            )
        path = LIBRARY[qualified]
    found = load(path, "with", NAME, must_call=False)
    if isinstance(found, Replacement):
        return found
    if isinstance(found, types.FunctionType):
        return Replacement(found)
    raise EdgeflowError(f"{NAME}: 'with' {path} is neither a function nor a Replacement")
