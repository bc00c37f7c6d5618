"""A regression output's decision agreement (models.Tolerance), which verify does not compute:
the build's artifact is run again on the evaluation split in the target's runtime, through
the same edgeflow code verify uses, and compared with the source's reference outputs.

The build's cache entries are found from the cache's events.jsonl: the entries of the stages
its `edgeflow run` process (by pid) ran or reused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

REFERENCE_STAGES = ("load", "ingest", "tf_load", "jax_load")


def entries(cache: Path, pid: int) -> dict[str, Path]:
    """Stage -> the cache folder of its entry, for the stages process `pid` ran or reused."""
    found: dict[str, Path] = {}
    for line in (cache / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("pid") != pid or event.get("event") not in ("ran", "hit"):
            continue
        stage, key = event["stage"], event["key"]
        matches = sorted((cache / stage / key[:2]).glob(key + "*"))
        if matches:
            found[stage] = matches[0]
    return found


def within(
    recipe: Path, cache: Path, pid: int, tolerances: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per tolerance: the share of values (on the positions counted) within it."""
    from edgeflow.data import load_samples
    from edgeflow.recipe import load_recipe
    from edgeflow.stages.verify import read_reference
    from edgeflow.targets import backend
    from edgeflow.verify.runners import BatchAxes, batching, run_all

    stages = entries(cache, pid)
    loaded = load_recipe(recipe)
    source = loaded.recipe.source
    reference_at = next(stages[s] for s in REFERENCE_STAGES if s in stages)
    reference, names = read_reference(reference_at / "reference.npz", source.outputs)
    converted = stages["convert"]
    info = json.loads((converted / "convert.json").read_text())
    runner = backend(loaded.profile).open_runner(converted / "artifact", info)
    samples = load_samples(loaded.recipe.evaluation, source.inputs, "evaluation", source.state)
    axes = BatchAxes.of(loaded.recipe.evaluation.outputs, names)
    outputs = run_all(runner, samples, *batching(source), "evaluation", axes)
    found = {}
    for t in tolerances:
        ref = reference[names.index(t["output"])].astype(np.float64)
        out = outputs[names.index(t["output"])].astype(np.float64)
        counted = np.ones(ref.shape, bool)
        if t["where"]:
            counted = reference[names.index(t["where"])] >= 0.5
        if t["unit"] == "cents":  # pitch: 1200 log2 of the ratio
            with np.errstate(divide="ignore", invalid="ignore"):
                error = np.abs(1200 * np.log2(out / ref))
        else:
            error = np.abs(out - ref)
        error = np.where(np.isfinite(error), error, np.inf)[counted]
        found[t["output"]] = {
            "within": float((error <= t["atol"]).mean()) if error.size else None,
            "counted": int(error.size),
            "max_error": float(error.max()) if error.size else None,
            "atol": t["atol"],
            "unit": t["unit"],
        }
    return found


def search(cache: Path, pid: int) -> dict[str, Any] | None:
    """The fallback search's record (the quantize stage's, onnxruntime; or the converter's):
    mixes tried, layers kept float, whether the budget was met and what the chosen mix missed."""
    stages = entries(cache, pid)
    for stage in ("quantize", "convert"):
        path = stages.get(stage)
        record = path and path / f"{stage}.json"
        if record and record.is_file():
            fallback = json.loads(record.read_text()).get("fallback")
            if fallback:
                return {
                    "mixes": len(fallback.get("trials", [])),
                    "float_layers": len(fallback.get("float_layers", [])),
                    "met": bool(fallback.get("met")),
                    "missed": fallback.get("chosen", {}).get("missed", []),
                }
    return None
