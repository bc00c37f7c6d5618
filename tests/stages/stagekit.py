"""Run stages one at a time, in this process, on files a test chose: a stage's unit test gives
it its inputs and reads the records it writes, without the engine, the cache or a worker."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeflow.core.records import RECORDS, read_record
from edgeflow.engine.pipeline import load_pipeline, pipeline_name
from edgeflow.recipe import LoadedRecipe
from edgeflow.stages import STAGES
from edgeflow.stages.base import StageContext


@dataclass
class Slots:
    """The slots filled so far (a pipeline's seeds, then each stage's outputs)."""

    loaded: LoadedRecipe
    root: Path
    paths: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def seeded(cls, loaded: LoadedRecipe, root: Path) -> Slots:
        pipeline = load_pipeline(pipeline_name(loaded))
        slots = cls(loaded, root)
        for slot, dotted in pipeline.seeds.items():
            value: Any = loaded.recipe
            for part in dotted.split("."):
                value = getattr(value, part)
            slots.paths[slot] = Path(value)
        return slots

    def run(self, name: str, loaded: LoadedRecipe | None = None) -> Path:
        """Run the stage on the slots it uses; its outputs fill their slots. Returns its
        output folder. `loaded`: another recipe for this stage alone (a changed key); its
        outputs are then read from the folder and fill no slot."""
        stage = STAGES[name]
        out = self.root / name
        n = 1
        while out.exists():  # a stage run again (another recipe) gets a folder of its own
            n += 1
            out = self.root / f"{name}-{n}"
        out.mkdir(parents=True)
        inputs = {s: self.paths[s] for s in (*stage.consumes, *stage.optional) if s in self.paths}
        try:
            stage.run(StageContext(stage, loaded or self.loaded, inputs, out))
        finally:  # what a failed stage wrote is there to read too
            for slot, file in stage.produces.items():
                if loaded is None and (out / file).exists():
                    self.paths[slot] = out / file
        return out

    def through(self, names: Iterable[str]) -> None:
        for name in names:
            self.run(name)

    def record(self, slot: str) -> Any:
        """The slot's record, validated (or its JSON, for a slot without a model yet)."""
        if slot in RECORDS:
            return read_record(slot, self.paths[slot])
        import json

        return json.loads(self.paths[slot].read_text(encoding="utf-8"))
