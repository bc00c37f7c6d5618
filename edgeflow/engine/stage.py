"""What a stage is: a pure function of declared inputs, a recipe slice, code and tool versions."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeflow.recipe import LoadedRecipe


@dataclass(frozen=True)
class Stage:
    """A declared stage; the cache key and the generated DVC stages both come from this."""

    name: str
    description: str
    run: Callable[[StageContext], None]
    consumes: tuple[str, ...] = ()
    produces: Mapping[str, str] = field(default_factory=dict)  # slot -> file or folder name
    reads: tuple[str, ...] = ()  # dotted recipe keys; "target" means the resolved profile
    tools: tuple[str, ...] = ()  # distributions whose versions enter the key
    code: tuple[str, ...] = ()  # modules besides the stage's own whose source enters the key
    isolated: bool = False  # run in a worker process, so a native crash is a stage failure
    version: int = 1  # bump when outputs change meaning without a code change


@dataclass
class StageContext:
    """What a running stage sees: its recipe, its input files and its output folder."""

    stage: Stage
    loaded: LoadedRecipe
    inputs: dict[str, Path]
    out_dir: Path

    @property
    def recipe(self) -> Any:
        return self.loaded.recipe

    def output(self, slot: str) -> Path:
        return self.out_dir / self.stage.produces[slot]

    def write_json(self, slot: str, data: Any) -> Path:
        path = self.output(slot)
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return path

    def read_json(self, slot: str) -> Any:
        return json.loads(self.inputs[slot].read_text(encoding="utf-8"))
