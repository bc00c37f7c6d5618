"""One rule interface for all three levels: Python AST, torch.fx, ONNX.

A rule has a dotted name (`ast.*`, `fx.*`, `onnx.*`), a one-line description, an options model
validated from its recipe entry, and `apply(model, opts, ctx) -> RuleResult`. A rule never
mutates its input: it returns the rewritten model in the result (or the input, unchanged),
with a Site for each place it looked at (changed, kept with why, or nothing to do).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from edgeflow.rules.fixes import Fix
from edgeflow.schema.sections import TensorSpec

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


class Status(str, Enum):
    """What a rule did at one site."""

    CHANGED = "changed"  # rewritten
    KEPT = "kept"  # a candidate of the rule's kind, left as it was (the message says why)
    NOT_APPLICABLE = "not_applicable"  # nothing of the rule's kind to do


@dataclass(frozen=True)
class Site:
    """One place a rule looked at: what it did there (code decides on this), where, and why."""

    status: Status
    # a node, tensor or op type (fx, onnx), "file.py:12" or "Net.forward" (ast); "" for the
    # model as a whole
    where: str
    message: str  # for people: rendered by the report, never parsed

    @classmethod
    def changed(cls, where: str, message: str) -> Site:
        return cls(Status.CHANGED, where, message)

    @classmethod
    def kept(cls, where: str, message: str) -> Site:
        return cls(Status.KEPT, where, message)

    @classmethod
    def not_applicable(cls, message: str, where: str = "") -> Site:
        return cls(Status.NOT_APPLICABLE, where, message)

    def record(self) -> dict[str, str]:
        return {"status": self.status.value, "where": self.where, "message": self.message}


@dataclass(frozen=True)
class GraphOrigin:
    """How an fx rule got its graph: "GraphModule" (the previous rule's), "symbolic_trace" or
    "torch.export", with what people should know about it (`note`)."""

    kind: str
    note: str = ""


class RuleResult(Generic[M]):
    """The rewritten model (or the input, unchanged) and what the rule did at each site."""

    def __init__(
        self,
        model: M,
        changed: bool | None = None,
        matches: int | None = None,
        reasons: Iterable[str] = (),
        sources: dict[str, str] | None = None,
        *,
        sites: Iterable[Site] = (),
        graph: GraphOrigin | None = None,
    ) -> None:
        # changed: whether any site changed, matches: how many did, unless given (a rule that
        # reports a whole-graph pass as one site says how many nodes it touched). reasons=:
        # texts, each a site of the whole model (changed when `changed` is, else
        # not_applicable), for rules written before sites. sources: readable rewritten code
        # by file name (ast: new method sources; fx: graph code), kept by the rewrite stage.
        given = list(sites)
        status = Status.CHANGED if changed else Status.NOT_APPLICABLE
        self.model = model
        self.sites: list[Site] = [*given, *(Site(status, "", str(text)) for text in reasons)]
        self.sources = dict(sources or {})
        self.graph = graph
        counted = len(self.sites_of(Status.CHANGED))
        self.changed = bool(counted) if changed is None else bool(changed)
        self.matches = counted if matches is None else int(matches)
        if given and self.changed != bool(counted):
            raise ValueError(
                f"RuleResult: changed={self.changed}, but {counted} of its sites changed"
            )
        if given and not self.changed and self.matches:
            raise ValueError(f"RuleResult: nothing changed, but matches={self.matches}")

    def sites_of(self, status: Status) -> list[Site]:
        return [s for s in self.sites if s.status is status]

    def record(self) -> dict[str, Any]:
        """What the rewrite stages write for the rule (rewrite.json, rewrite_onnx.json)."""
        found: dict[str, Any] = {"changed": self.changed, "matches": self.matches}
        if self.graph is not None:
            found["graph"] = {"kind": self.graph.kind, "note": self.graph.note}
        found["sites"] = [site.record() for site in self.sites]
        return found

    def __repr__(self) -> str:
        return f"RuleResult(changed={self.changed}, matches={self.matches}, sites={self.sites!r})"


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
    # The options with which the rule removes one of its fixes, where it needs options: the
    # precheck and `edgeflow explain` print the entry with them (edgeflow.rules.entries).
    fix_options: ClassVar[dict[Fix, dict[str, Any]]] = {}
    # Quantization modes whose build the rule's output breaks, with what was measured: the
    # precheck does not suggest the rule for a build in such a mode.
    breaks: ClassVar[dict[str, str]] = {}
    # The rules this one must run before, or after, each with why: a name, or 'fx.*' for
    # every other rule of a level (edgeflow.rules.order; checked when the recipe loads).
    runs_before: ClassVar[dict[str, str]] = {}
    runs_after: ClassVar[dict[str, str]] = {}

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


# Annotated[str, CODE_REF] (or a list of them): an option naming a function, checked from
# source when the recipe loads like every reference (edgeflow.core.refcheck)
CODE_REF = "edgeflow:code-ref"


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
        for key, text in code_options(self.options).items():
            refs[key] = ImportRef.parse(text, self.base_dir)
        return refs


def code_options(options: RuleOptions) -> dict[str, str]:
    """The references an entry's options name code by (`Annotated[str, CODE_REF]` or a list
    of them), by option key (`functions[1]` for a list's), as 'module:attr'."""
    found: dict[str, str] = {}
    for name, info in type(options).model_fields.items():
        if CODE_REF not in info.metadata:
            continue
        value = getattr(options, name)
        texts = {name: value} if isinstance(value, str) else {}
        if isinstance(value, list):
            texts = {f"{name}[{i}]": text for i, text in enumerate(value)}
        for key, text in texts.items():
            found[key] = text if ":" in text else ":".join(text.rpartition(".")[::2])
    return found


def _restore_spec(
    rule: type[Rule[Any]] | None, source: str, options: dict[str, Any], base_dir: str
) -> RuleSpec:
    from edgeflow.core.refs import ImportRef

    if rule is None:
        rule = ImportRef.parse(source, Path("/")).load()
    return RuleSpec(rule, rule.Options.model_validate(options), source, Path(base_dir))
