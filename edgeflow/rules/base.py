"""One rule interface for all three levels: Python AST, torch.fx, ONNX.

A rule has a dotted name (`ast.*`, `fx.*`, `onnx.*`), a one-line description, an options model
validated from its recipe entry, and `apply(model, opts, ctx) -> RuleResult`. A rule never
mutates its input: it returns the rewritten model in the result (or the input, unchanged).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from edgeflow.recipe.refs import file_sha256
from edgeflow.recipe.schema import TensorSpec

Level = Literal["ast", "fx", "onnx"]
LEVEL_ORDER: dict[str, int] = {"ast": 0, "fx": 1, "onnx": 2}
M = TypeVar("M")


class RuleOptions(BaseModel):
    """A rule's options, validated from its recipe entry; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


@dataclass
class RewriteContext:
    """What a rule may know besides the model: the declared inputs and the recipe's folder."""

    inputs: list[TensorSpec]
    base_dir: Path = Path(".")  # relative paths in rule options ("patterns.py:fn") start here
    dynamic_batch: bool = False  # the recipe exports with a dynamic batch dimension

    def example_inputs(self) -> tuple[Any, ...]:
        from edgeflow.source import example_inputs

        return example_inputs(self.inputs)


@dataclass
class RuleResult(Generic[M]):
    """The rewritten model, whether anything changed, how many sites matched, and why."""

    model: M
    changed: bool
    matches: int = 0
    reasons: list[str] = field(default_factory=list)
    # Readable rewritten code by file name (AST: new method sources; FX: graph code), kept in
    # the rewrite stage's output for inspection.
    sources: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"changed": self.changed, "matches": self.matches, "reasons": list(self.reasons)}


class Rule(ABC, Generic[M]):
    """Subclass one of AstRule, FxRule, OnnxRule; set name, description, Options, example."""

    name: ClassVar[str]
    description: ClassVar[str]
    level: ClassVar[Level]
    Options: ClassVar[type[RuleOptions]] = RuleOptions
    # (before, after) for the rule catalogue: source text, or a short description of a graph.
    example: ClassVar[tuple[str, str] | None] = None

    @abstractmethod
    def apply(self, model: M, opts: Any, ctx: RewriteContext) -> RuleResult[M]: ...

    def tolerance(self, opts: Any) -> float | None:
        """Largest output change the rule may cause on the declared inputs; None when the rule
        changes numerics on purpose (e.g. relu -> relu6), leaving the judgement to verify."""
        return 1e-5


class AstRule(Rule[Any]):
    """Rewrites the Python source of `forward` (and methods it reaches) before tracing."""

    level: ClassVar[Level] = "ast"


class FxRule(Rule[Any]):
    """Rewrites a torch.fx graph (symbolic_trace, or torch.export's graph when tracing fails)."""

    level: ClassVar[Level] = "fx"


class OnnxRule(Rule[Any]):
    """Rewrites an onnx.ModelProto."""

    level: ClassVar[Level] = "onnx"


@dataclass(frozen=True)
class RuleSpec:
    """A validated `rewrites:` entry: the rule class and its options."""

    rule: type[Rule[Any]]
    options: RuleOptions
    source: str  # the built-in name, or the user rule's import reference ("/abs/rules.py:Cls")

    @property
    def name(self) -> str:
        return self.rule.name

    def __reduce__(self) -> tuple[Any, ...]:
        # Worker processes re-import the rule: a user rule's module may be a file that only
        # this process loaded.
        return _restore_spec, (self.source, self.options.model_dump(by_alias=True))

    def fingerprint(self) -> dict[str, Any]:
        """What enters a stage's cache key: the rule, its options, and the source of its
        module and of the edgeflow.rules helpers it uses (e.g. onnx/_edit.py)."""
        options = self.options.model_dump(mode="json", by_alias=True)
        return {"rule": self.name, "options": options, "code": _code_digest(self.rule)}


def _code_digest(rule: type) -> str | dict[str, str]:
    """sha256 of the rule's module file; for a built-in rule, of every edgeflow.rules module
    it reaches through its imports too (a change to a shared helper changes the key)."""
    import sys

    module = sys.modules.get(rule.__module__)
    source = inspect.getsourcefile(rule)
    if module is None or not rule.__module__.startswith("edgeflow.rules."):
        return file_sha256(Path(source)) if source else "unknown"
    seen: dict[str, str] = {}
    todo = [module]
    while todo:
        current = todo.pop()
        path = getattr(current, "__file__", None)
        if current.__name__ in seen or not path:
            continue
        seen[current.__name__] = file_sha256(Path(path))
        for value in vars(current).values():
            name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", "")
            if isinstance(name, str) and name.startswith("edgeflow.rules.") and name in sys.modules:
                todo.append(sys.modules[name])
    return dict(sorted(seen.items()))


def _restore_spec(source: str, options: dict[str, Any]) -> RuleSpec:
    from edgeflow.recipe.refs import ImportRef
    from edgeflow.rules import builtin_rules

    user = ":" in source
    rule = ImportRef.parse(source, Path("/")).load() if user else builtin_rules()[source]
    return RuleSpec(rule, rule.Options.model_validate(options), source)
