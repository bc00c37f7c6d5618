"""Pipelines as data: which stages run, in what order, for a source kind (pipelines/*.yaml)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from edgeflow.core import resources
from edgeflow.core.errors import EdgeflowError
from edgeflow.core.loader import read_yaml, validate
from edgeflow.recipe import LoadedRecipe
from edgeflow.stages.base import Stage


class PipelineSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str
    source_kind: str
    seeds: dict[str, str] = {}  # slot -> dotted recipe key of a file that fills it
    stages: list[str]


@dataclass(frozen=True)
class Pipeline:
    name: str
    path: Path
    seeds: dict[str, str]
    stages: list[Stage]


def load_pipeline(kind: str, cwd: Path | None = None) -> Pipeline:
    """The pipeline for a source kind, checked: every stage exists and gets the slots it needs."""
    from edgeflow.stages import STAGES

    known = resources.available("pipelines", cwd)
    if kind not in known:
        raise EdgeflowError(f"no pipeline for source kind '{kind}' (have: {', '.join(known)})")
    path = known[kind]
    spec = validate(PipelineSpec, read_yaml(path), path)
    stages: list[Stage] = []
    slots = set(spec.seeds)
    for name in spec.stages:
        if name not in STAGES:
            raise EdgeflowError(f"{path}: unknown stage '{name}' (have: {', '.join(STAGES)})")
        stage = STAGES[name]
        missing = [slot for slot in stage.consumes if slot not in slots]
        if missing:
            raise EdgeflowError(
                f"{path}: stage '{name}' needs {', '.join(missing)}, which no earlier stage makes"
            )
        slots.update(stage.produces)
        stages.append(stage)
    return Pipeline(kind, path, dict(spec.seeds), stages)


def pipeline_name(loaded: LoadedRecipe) -> str:
    """The pipeline a loaded recipe's build runs: its source kind's, or for a tensorflow
    source the native or the ONNX path (convert.via, or the default for the target and the
    quantization settings)."""
    from edgeflow.schema.source import conversion_path

    recipe = loaded.recipe
    return conversion_path(
        recipe.source.kind,
        recipe.convert.via,
        loaded.profile.family.tensorflow_native,
        recipe.quantization,
    )
