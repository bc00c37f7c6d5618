"""What a stage is: a pure function of declared inputs, a recipe slice, code and tool versions.

The code is edgeflow's own source (all of it: see engine/keys.py) and, through the recipe
slice, the user's code its references reach; the tools are distributions by version.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeflow.core.records import RECORDS, read_record
from edgeflow.recipe import LoadedRecipe
from edgeflow.targets.profile import TargetProfile

WARNINGS_FILE = ".warnings.json"
# In a stage's `tools`: the converter and runtime versions the target's backend declares
# (Backend.tools), for a stage that reads the target
BACKEND_TOOLS = "backend"


@dataclass(frozen=True)
class Stage:
    """A declared stage; the cache key and the generated DVC stages both come from this."""

    name: str
    description: str
    run: Callable[[StageContext], None]
    consumes: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()  # slots used when the pipeline makes them
    produces: Mapping[str, str] = field(default_factory=dict)  # slot -> file or folder name
    # Dotted recipe keys; "target" is the resolved profile, "recipe_file" the recipe's file stem.
    reads: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()  # distributions whose versions enter the key (BACKEND_TOOLS)
    # the levels of the recipe's `rewrites` a stage that reads them sees (and is keyed on):
    # adding an onnx rule leaves the export cached
    rule_levels: tuple[str, ...] = ("ast", "fx", "onnx")
    isolated: bool = False  # run in a worker process, so a native crash is a stage failure
    version: int = 1  # bump when outputs change meaning without a code change

    def tools_for(self, profile: TargetProfile) -> tuple[str, ...]:
        """The distributions whose versions enter the key, BACKEND_TOOLS replaced by those
        of the target's backend."""
        if BACKEND_TOOLS not in self.tools:
            return self.tools
        if "target" not in self.reads:
            raise AssertionError(f"stage '{self.name}' keys on backend tools without the target")
        backend = profile.family.tools
        tools = (t for name in self.tools for t in (backend if name == BACKEND_TOOLS else (name,)))
        return tuple(dict.fromkeys(tools))


@dataclass
class StageContext:
    """What a running stage sees: its recipe, its input files and its output folder."""

    stage: Stage
    loaded: LoadedRecipe
    inputs: dict[str, Path]
    out_dir: Path

    @property
    def recipe(self) -> Any:
        """The recipe, limited to the keys the stage declares in `reads` (they form its key)."""
        return RecipeView(self.loaded.recipe, "", self.stage)

    @property
    def recipe_file(self) -> str:
        """The recipe's file stem (names the build folder); only for stages that read it."""
        if "recipe_file" not in self.stage.reads:
            raise AssertionError(f"stage '{self.stage.name}' uses the file name without reading it")
        return self.loaded.stem

    @property
    def profile(self) -> TargetProfile:
        if "target" not in self.stage.reads:
            raise AssertionError(f"stage '{self.stage.name}' uses the target without reading it")
        return self.loaded.profile

    def warn(self, message: str) -> None:
        """A warning printed with the stage's line, also when the result comes from the cache."""
        path = self.out_dir / WARNINGS_FILE
        warnings = json.loads(path.read_text()) if path.is_file() else []
        path.write_text(json.dumps([*warnings, message]))

    def output(self, slot: str) -> Path:
        return self.out_dir / self.stage.produces[slot]

    def write(self, slot: str, record: Any) -> Path:
        """Write the record of `slot` (its model: edgeflow.core.records.RECORDS), validated: a
        record that does not fit its model is a bug here, not in the reader."""
        model = RECORDS[slot]
        value = record if isinstance(record, model) else model.model_validate(record)
        return self._json(slot, value.dump())

    def read(self, slot: str) -> Any:
        """The record of an input slot, validated against its model."""
        return read_record(slot, self.inputs[slot])

    def write_json(self, slot: str, data: Any) -> Path:
        """A slot's JSON that has no record model (yet): a file of this stage's own."""
        if slot in RECORDS:
            raise AssertionError(f"slot '{slot}' has a record model: write it with ctx.write")
        return self._json(slot, data)

    def read_json(self, slot: str) -> Any:
        if slot in RECORDS:
            raise AssertionError(f"slot '{slot}' has a record model: read it with ctx.read")
        return json.loads(self.inputs[slot].read_text(encoding="utf-8"))

    def _json(self, slot: str, data: Any) -> Path:
        path = self.output(slot)
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return path


class RecipeView:
    """Attribute access to a recipe that fails on keys outside a stage's `reads`.

    A stage that used an undeclared key would be cached under a key that ignores it and
    serve stale results; this turns that bug into an immediate error.
    """

    def __init__(self, value: Any, path: str, stage: Stage) -> None:
        self._value, self._path, self._stage = value, path, stage

    def __getattr__(self, name: str) -> Any:
        path = f"{self._path}.{name}" if self._path else name
        value = getattr(self._value, name)
        if path == "rewrites":
            value = rules_of(value, self._stage.rule_levels)
        reads = self._stage.reads
        if any(path == r or path.startswith(r + ".") for r in reads):
            return value
        if any(r.startswith(path + ".") for r in reads):
            return RecipeView(value, path, self._stage)
        raise AssertionError(f"stage '{self._stage.name}' reads '{path}' without declaring it")


def rules_of(specs: list[Any], levels: tuple[str, ...]) -> list[Any]:
    """The rule specs of the given levels, in order."""
    return [spec for spec in specs if spec.rule.level in levels]
