"""One rule interface for all three levels: Python AST, torch.fx, ONNX.

A rule has a dotted name (`ast.*`, `fx.*`, `onnx.*`), a one-line description, an options model
validated from its recipe entry, and `apply(model, opts, ctx) -> RuleResult`. A rule never
mutates its input: it returns the rewritten model in the result (or the input, unchanged).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from edgeflow.core.specs import TensorSpec
from edgeflow.rules.fixes import Fix

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
    # compare each rule's outputs with its input's (off for detectors, whose output form a
    # rule may change on purpose: the rewrite stage compares their detections as sets)
    check_numerics: bool = True

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
    # What the rule removes, in the precheck's and `edgeflow explain`'s words: they suggest
    # the built-in rules that declare what they report (see edgeflow.rules.fixes).
    fixes: ClassVar[tuple[Fix, ...]] = ()

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


CODE_REF = "edgeflow:code-ref"  # Annotated[str, CODE_REF]: an option naming a function


@dataclass(frozen=True)
class RuleSpec:
    """A validated `rewrites:` entry: the rule class and its options."""

    rule: type[Rule[Any]]
    options: RuleOptions
    source: str  # the built-in name, or the user rule's import reference ("/abs/rules.py:Cls")
    base_dir: Path = Path(".")  # the recipe's folder: code options' file paths start here

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        # in a pydantic model (Recipe.rewrites), a RuleSpec is taken as it is: resolved already
        from pydantic_core import core_schema

        return core_schema.is_instance_schema(cls)

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def is_user_rule(self) -> bool:
        return ":" in self.source

    def __reduce__(self) -> tuple[Any, ...]:
        # Worker processes re-import a user rule by its reference (its module may be a file
        # that only this process loaded); a built-in rule pickles as its class.
        options = self.options.model_dump(by_alias=True)
        rule = None if self.is_user_rule else self.rule
        return _restore_spec, (rule, self.source, options, str(self.base_dir))

    def fingerprint(self) -> dict[str, Any]:
        """What enters a stage's cache key: the rule and its options; for a user rule, the
        source of its module and of the user's modules that it imports; for options that
        name code (`Annotated[str, CODE_REF]`, e.g. fx.replace_pattern's pattern), that
        code's. Built-in rules' code is edgeflow's, which every key holds."""
        options = self.options.model_dump(mode="json", by_alias=True)
        found: dict[str, Any] = {"rule": self.name, "options": options}
        code = self.code_refs()
        if code:
            found["code"] = {name: ref.fingerprint() for name, ref in code.items()}
        return found

    def code_refs(self) -> dict[str, Any]:
        """The user's code this entry runs, as ImportRefs: the rule itself (a user rule) and
        the functions its options name ("rule" and the option names)."""
        from edgeflow.core.refs import ImportRef

        refs = {"rule": ImportRef.parse(self.source, Path("/"))} if self.is_user_rule else {}
        for name, info in type(self.options).model_fields.items():
            value = getattr(self.options, name)
            if CODE_REF in info.metadata and isinstance(value, str):
                refs[name] = ImportRef.parse(value, self.base_dir)
        return refs


def _restore_spec(
    rule: type[Rule[Any]] | None, source: str, options: dict[str, Any], base_dir: str
) -> RuleSpec:
    from edgeflow.core.refs import ImportRef

    if rule is None:
        rule = ImportRef.parse(source, Path("/")).load()
    return RuleSpec(rule, rule.Options.model_validate(options), source, Path(base_dir))
