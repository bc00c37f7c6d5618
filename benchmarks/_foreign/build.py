"""One edgeflow build of a foreign file as a record, and the files' recipes and data.

`one()` runs in a process of its own (benchmarks/foreign.py starts one per build), so that a
crash in a native library ends that build, not the benchmark. It prints one JSON line.
"""

from __future__ import annotations

import json
import re
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from .files import Foreign

FLOAT_TOLERANCE = 1e-3  # max |artifact - source| / max |source|, per output (docs/coverage.md)
SAMPLES = 8  # evaluation samples per file
RULE = re.compile(r"^(onnx|fx|ast|tf)\.\w+$")  # a suggestion that names a rule


def write_inputs(foreign: Foreign, folder: Path) -> tuple[Path, Path]:
    """The file and its evaluation data (.npz: SAMPLES seeded samples of the declared
    shapes, stacked on each input's batch axis; integer inputs in [0, 8))."""
    import onnx

    rng = np.random.default_rng(0)
    arrays = {}
    for spec in foreign.inputs:
        if spec.value is not None:
            continue
        axis = spec.batch_axis or 0
        shape = list(spec.shape)
        shape[axis] = SAMPLES
        if "int" in spec.dtype:
            arrays[spec.name] = rng.integers(0, 8, shape).astype(spec.dtype)
        else:
            arrays[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
    model, data = folder / f"{foreign.name}.onnx", folder / f"{foreign.name}.npz"
    onnx.save(foreign.model, str(model))
    np.savez(data, **arrays)  # type: ignore[arg-type]
    return model, data


def recipe_text(foreign: Foreign, target: str, model: Path, data: Path) -> str:
    """The recipe a user would write for the file: its inputs, float32, agreement."""
    lines = []
    for spec in foreign.inputs:
        fields = [f"name: {json.dumps(spec.name)}", f"shape: {list(spec.shape)}",
                  f"dtype: {spec.dtype}"]  # fmt: skip
        if spec.value is not None:
            fields.append(f"value: {spec.value}")
        elif spec.batch_axis not in (0, None):
            fields.append(f"batch_axis: {spec.batch_axis}")
        lines.append("    - {" + ", ".join(fields) + "}")
    inputs = "\n".join(lines)
    return f"""\
# Written by benchmarks/foreign.py: {foreign.style}.
name: {foreign.name}
description: foreign-files benchmark, {foreign.name}
source:
  kind: onnx
  model: {json.dumps(str(model))}
  inputs:
{inputs}
evaluation: {{dataset: {json.dumps(str(data))}, metric: agreement}}
quantization: {{mode: none}}
target: {target}
verify:
  max_relative_diff: {FLOAT_TOLERANCE}
  latency_runs: 2
  warmup_runs: 1
"""


def one(recipe: Path, cache_dir: Path, build_root: Path, overrides: dict[str, Any]) -> dict:
    """Build the recipe once; what happened, as a record (printed by the caller)."""
    from edgeflow.core.errors import EdgeflowError
    from edgeflow.engine.cache import Cache
    from edgeflow.engine.runner import run_build
    from edgeflow.recipe import load_recipe

    lines: list[str] = []
    record: dict[str, Any] = {"overrides": overrides}
    start = time.perf_counter()
    try:
        loaded = load_recipe(recipe, overrides)
        result = run_build(loaded, Cache(cache_dir), build_root, echo=lines.append)
    except EdgeflowError as exc:
        text = exc.render()
        internal = "internal error" in text
        record.update(status="internal" if internal else "refused", message=text)
    except Exception as exc:  # a bug in edgeflow: the benchmark records it, with its place
        record.update(status="internal", message="".join(traceback.format_exception(exc)))
    else:
        metrics = result.metrics
        agreement = metrics.get("agreement") or {}
        record["relative_diff"] = agreement.get("max_relative_diff")
        record["sqnr_db"] = agreement.get("min_sqnr_db")
        if metrics.get("not_verified"):
            record.update(status="not_verified", message=metrics["not_verified"])
        elif result.failed_checks:
            record.update(status="wrong_output", message="\n".join(result.failed_checks))
        else:
            record.update(status="verified", message="")
    record["stages"] = _stages(lines)
    record["failed_stage"] = next(
        (s for s, state in record["stages"].items() if state == "failed"), None
    )
    if record["status"] in ("refused", "internal") and record["failed_stage"] is None:
        record["failed_stage"] = "recipe" if not record["stages"] else "unknown"
    text = "\n".join(lines) + "\n" + record.get("message", "")
    record["precheck"] = _verdict(lines, record)
    record["suggested"] = suggestions(text)
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


def _stages(lines: list[str]) -> dict[str, str]:
    """Stage -> ran / cached / failed, from the build's printed lines."""
    found = {}
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[1] in ("ran", "cached", "failed", "skipped"):
            found[parts[0]] = parts[1]
    return found


def _verdict(lines: list[str], record: dict[str, Any]) -> str | None:
    """'passed' or 'refused' (a refusal stops the build, or is a warning when forced)."""
    text = "\n".join(lines) + record.get("message", "")
    if re.search(r"does not pass the \w+ precheck", text):
        return "refused"
    state = record["stages"].get("precheck")
    return "passed" if state in ("ran", "cached") else None


def suggestions(text: str) -> list[str]:
    """The Suggested rule column of the precheck's table, as printed: each backticked entry."""
    found: list[str] = []
    for line in text.splitlines():
        if not line.startswith("| ") or "Suggested rule" in line or "---" in line:
            continue
        cells = line.split(" | ")
        if len(cells) < 5:
            continue
        for entry in re.findall(r"`([^`]+)`", cells[-1].split(" (")[0]):
            if entry not in found:
                found.append(entry)
    return found


def followable(suggested: list[str]) -> tuple[list[Any], list[str]]:
    """The suggestions that are a `rewrites:` entry (a rule's name, or a mapping with its
    options), parsed as the recipe would, and those that are not."""
    import yaml

    rules: list[Any] = []
    others = []
    for text in suggested:
        value = yaml.safe_load(text) if text.startswith("{") else text
        name = value.get("rule", "") if isinstance(value, dict) else value
        if isinstance(name, str) and RULE.match(name):
            rules.append(value)
        else:
            others.append(text)
    return rules, others
