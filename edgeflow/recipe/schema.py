"""The recipe schema: every field a recipe may have, validated before any stage runs.

The sections are edgeflow.schema.sections' models; this module composes them with the target
profile (by name or inline) and the resolved rewrite rules."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Discriminator,
    Tag,
    ValidationInfo,
)

from edgeflow.rules.base import RuleSpec
from edgeflow.schema.sections import (
    DatasetSpec,
    Diff,
    Evaluation,
    ExportOptions,
    HostPostprocess,
    OptimizeOptions,
    PrecheckOptions,
    Quantization,
    Strict,
    Verify,
    user_error,
)
from edgeflow.schema.source import ConvertOptions, Source
from edgeflow.targets.profile import Accelerator, TargetProfile


def _target_kind(value: Any) -> str:
    return "name" if isinstance(value, str) else "inline"


def _target_name(name: str, info: ValidationInfo) -> str:
    from edgeflow.core import resources
    from edgeflow.core.suggest import did_you_mean

    cwd = (info.context or {}).get("cwd")
    known = resources.available("targets", Path(cwd) if cwd else None)
    if name not in known:
        raise user_error(f"unknown target '{name}'", did_you_mean(name, known))
    return name


TargetRef = Annotated[
    Annotated[str, AfterValidator(_target_name), Tag("name")]
    | Annotated[TargetProfile, Tag("inline")],
    Discriminator(_target_kind),
]


def _resolved_rules(value: Any, info: ValidationInfo) -> Any:
    """The RuleSpecs of the `rewrites:` entries: edgeflow.rules.resolve_rewrites resolves them
    (each problem located at its entry) and load_recipe passes them in the context."""
    context = info.context or {}
    if "rewrites" in context:
        return tuple(context["rewrites"])
    if not isinstance(value, list | tuple):
        raise user_error(
            f"expected a list of rules (got {value!r:.80})",
            "write one rule per line: '- fx.fuse_conv_bn' (see `edgeflow rules`)",
        )
    return value  # RuleSpecs already (a copy of a loaded recipe); anything else is refused


class Recipe(Strict):
    name: str | None = None
    description: str = ""
    source: Source
    export: ExportOptions = ExportOptions()
    convert: ConvertOptions = ConvertOptions()
    # the entries' rules, resolved and their options validated by load_recipe
    rewrites: Annotated[tuple[RuleSpec, ...], BeforeValidator(_resolved_rules)] = ()
    # `rewrites: auto`, or an entry `auto` last in the list: the precheck's proven rules are
    # applied too (edgeflow.targets.auto_rewrites); set by load_recipe, never written as a key
    rewrites_auto: bool = False
    postprocess: HostPostprocess | None = None
    # the target profile's own rewrites (its `rewrites:`), applied after the recipe's
    target_rewrites: bool = True
    optimize: OptimizeOptions = OptimizeOptions()
    calibration: DatasetSpec | None = None
    evaluation: Evaluation
    quantization: Quantization = Quantization()
    target: TargetRef
    # an NPU target's accelerator, over its profile's (`target.accelerator=ethos-u85-256` on
    # the command line): the build compiles for it, in a folder of its own
    accelerator: Accelerator | None = None
    precheck: PrecheckOptions = PrecheckOptions()
    verify: Verify = Verify()
    diff: Diff = Diff()
