"""Coverage: how much third-party model code edgeflow carries to each target, verified.

Builds the development set (benchmarks/coverage_models.py: torchvision and timm models with
random weights), writes one recipe per model, runs edgeflow for each target configuration,
and prints one table (model x target: verified, or failed with a one-line reason) with
per-target counts; writes coverage.json. Needs torchvision and timm (docs/coverage.md):

    python benchmarks/coverage.py [--models resnet18,levit_128s] [--configs tflite:none]
        [--size 128] [--work .edgeflow/coverage] [--out coverage.json]

Verified means: the artifact ran in the target's runtime and, for float32 builds, every
output is within 1e-3 of the source model relative to that output's range; int8 builds
report top-1 agreement and the relative error on held-out inputs (scikit-learn's sample
photographs; random weights make task accuracy meaningless). A config `T:int8_fallback`
builds int8 with `quantization.fallback: auto` and top-1 agreement >= 0.99 as the budget,
and reports the layers it kept float ("missed" when no mix met the budget). Every int8 cell
that changed a prediction gives how close a call each was: the float model's top-two logit
margin on that crop, in standard deviations of its logits, against the median over all
crops (random weights leave some crops at near ties). `--calibration N` sets the number of
calibration crops (default 16; the test split stays 16).

`--dev` builds the second table instead: edgeflow's development models (DEV_RECIPES, shipped
recipes in recipes/; needs no torchvision) on every CPU target in float32 and int8, each
forced past the precheck (`precheck.continue_on_failure`) so that every cell says what the
real converter and runtime do, and what the precheck had said. Add a model by adding its
recipe's name to DEV_RECIPES.

    python benchmarks/coverage.py --dev [--models speech_lstm_encoder] [--configs armnn:int8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _versions import installed
from coverage_models import MODELS

CONFIGS = (
    ("tflite", "none"),
    ("tflite_micro", "none"),
    ("tflite_micro", "int8"),
    ("armnn", "none"),
    ("onnxruntime_micro", "int8"),
)
# The budget for tflite_micro at 128x128: an 8 MiB arena (flash not limited); a
# profile in the work folder's targets/ extends the built-in with that board.
BOARD = """\
extends: tflite_micro
boards:
  coverage_8m:
    description: the coverage benchmark's budget, 8 MiB of RAM for the arena; flash not limited
    ram_bytes: 8388608
default_board: coverage_8m
"""
# The development models' table (--dev): shipped recipes, by file stem in recipes/.
DEV_RECIPES = ("speech_lstm_encoder", "digits_prelu", "digits_paddle_style", "streaming_keywords")
DEV_TARGETS = ("tflite", "tflite_micro", "armnn", "onnxruntime_micro")
DEV_CONFIGS = tuple((t, m) for t in DEV_TARGETS for m in ("none", "int8"))
REPO = Path(__file__).resolve().parent.parent
FLOAT_TOLERANCE = 1e-3  # max |artifact - source| / max |source|, per output
# --configs T:int8_fallback: int8 with quantization.fallback=auto and this agreement as budget
FALLBACK_AGREEMENT = 0.99
TOOLS = ("torch", "torchvision", "timm", "onnx", "onnxruntime", "onnx2tf", "tensorflow",
         "ai-edge-litert", "tflite-micro")  # fmt: skip


def recipe_text(model: str, size: int, calibration: int = 16) -> str:
    factory = Path(__file__).resolve().parent / "coverage_models.py"
    data = "edgeflow.datasets:sample_image_crops"
    options = f"{{size: [{size}, {size}], count: 16, input_name: image}}"
    calibrate = f"{{size: [{size}, {size}], count: {calibration}, input_name: image}}"
    return f"""\
# Written by benchmarks/coverage.py: {model} with random weights, {size}x{size}.
name: {model}
description: coverage benchmark, {model}
source:
  kind: pytorch
  model: "{factory}:build"
  init: {{name: {model}, image_size: {size}}}
  inputs:
    - {{name: image, shape: [1, 3, {size}, {size}], dtype: float32}}
calibration: {{dataset: "{data}", split: calibration, options: {calibrate}}}
evaluation: {{dataset: "{data}", split: test, options: {options}, metric: agreement}}
quantization: {{mode: none}}
target: tflite
verify:                           # metric agreement: no labels, random weights
  max_relative_diff: {FLOAT_TOLERANCE}
  latency_runs: 10
  warmup_runs: 2
"""


def run_one(
    recipe: Path, target: str, mode: str, cache: Any, build_root: Path, forced: bool = False
) -> dict[str, Any]:
    """One build as a table row; `forced`: past a failed precheck, whose verdict the row keeps
    (`precheck`: passed or refused, None where the build stopped before it)."""
    from edgeflow.core.errors import EdgeflowError
    from edgeflow.engine.runner import run_build
    from edgeflow.recipe import load_recipe

    overrides: dict[str, Any] = {"target": target, "quantization.mode": mode}
    if forced:
        overrides["precheck.continue_on_failure"] = True
    if mode in ("int8", "int8_fallback"):
        overrides["verify.max_relative_diff"] = None  # reported, not a threshold
        overrides["verify.min_sqnr_db"] = None  # nor the int8 SQNR floor: benchmarks/int8.py
    if mode == "int8_fallback":  # the goal as the budget: agreement >= 0.99
        overrides.update(
            {
                "quantization.mode": "int8",
                "quantization.fallback": "auto",
                "verify.min_top1_agreement": FALLBACK_AGREEMENT,
            }
        )
    row: dict[str, Any] = {"model": recipe.stem, "target": target, "quantization": mode}
    start = time.perf_counter()
    lines: list[str] = []
    try:
        loaded = load_recipe(recipe, overrides)
        result = run_build(loaded, cache, build_root, echo=lines.append)
    except EdgeflowError as exc:
        row.update(status="failed", reason=_reason(exc.render()), detail=exc.render())
        metrics = {}
    else:
        metrics = result.metrics
        agreement = metrics.get("agreement") or {}
        row.update(
            top1=agreement.get("top1"),
            relative_diff=agreement.get("max_relative_diff"),
            sqnr_db=agreement.get("min_sqnr_db"),
            float_layers=metrics.get("float_layers"),
            size_bytes=metrics.get("size_bytes"),
            arena_bytes=metrics.get("arena_bytes"),
        )
        accuracy = metrics.get("accuracy") or {}
        row.update(accuracy=accuracy.get("artifact"), source_accuracy=accuracy.get("source"))
        if mode != "none" and agreement.get("top1") is not None and not forced:
            row["flip_margins"] = flip_margins(loaded, result, cache)
        if metrics.get("not_verified"):
            row.update(
                status="failed", reason=_one_line("not verified: " + metrics["not_verified"])
            )
        elif result.failed_checks:
            row.update(status="failed", reason=_one_line(result.failed_checks[0]))
        else:
            row.update(status="verified", reason="")
    row["precheck"] = precheck_verdict(lines, target)
    row["seconds"] = round(time.perf_counter() - start, 1)
    row["conversion_seconds"] = conversion_seconds(lines)
    return row


# A stage's line: "  convert        ran        2.56 s" (ran, cached or failed)
STAGE_LINE = re.compile(r"^\s*(\w+)\s+(?:ran|failed)\s+([\d.]+) s")
CONVERSION_STAGES = ("rewrite_target", "precheck", "quantize", "convert")


def conversion_seconds(lines: list[str]) -> float:
    """The seconds of the stages that made the artifact from the ONNX model in this run
    (cached stages: 0)."""
    found = (STAGE_LINE.match(line) for line in lines)
    return round(sum(float(m[2]) for m in found if m and m[1] in CONVERSION_STAGES), 1)


def precheck_verdict(lines: list[str], target: str) -> str | None:
    """'passed' or 'refused' from a build's printed lines (a refusal is a warning when the
    build is forced, replayed from the cache too); None when the precheck did not run."""
    text = "\n".join(lines)
    if f"does not pass the {target} precheck" in text:
        return "refused"
    ran = any(line.split()[:1] == ["precheck"] for line in lines)
    return "passed" if ran else None


def flip_margins(loaded: Any, result: Any, cache: Any) -> dict[str, Any]:
    """How close a call each changed prediction was: the float model's top-two logit margin,
    in standard deviations of that sample's logits, of every test crop whose top-1 the
    artifact changes, and the median margin over all crops. With random weights some crops
    are near ties that any rounding of the input breaks."""
    import numpy as np

    from edgeflow.data import load_samples
    from edgeflow.targets import backend
    from edgeflow.verify.runners import OnnxRunner, batching, run_all

    def entry(stage: str) -> Path:
        outcome = next(o for o in result.outcomes if o.stage == stage)
        return Path(cache.entry(stage, outcome.key))

    recipe = loaded.recipe
    samples = load_samples(recipe.evaluation, recipe.source.inputs, "evaluation")
    source = OnnxRunner.from_file(str(entry("export") / "model.onnx"))
    want = run_all(source, samples, *batching(recipe.source))[0]
    info = json.loads((entry("convert") / "convert.json").read_text())
    artifact = backend(loaded.profile).open_runner(entry("convert") / "artifact", info)
    got = run_all(artifact, samples, *batching(recipe.source))[0]
    want, got = want.reshape(len(want), -1), got.reshape(len(got), -1)
    top = np.sort(want, axis=-1)
    margins = (top[:, -1] - top[:, -2]) / want.std(axis=-1)
    flipped = want.argmax(-1) != got.argmax(-1)
    return {
        "flipped": [round(float(m), 4) for m in margins[flipped]],
        "median": round(float(np.median(margins)), 4),
    }


def _reason(text: str) -> str:
    """One line for the table: the failure, and for a precheck the operators it names."""
    lines = text.splitlines()
    rows = [line.split("|")[1:4] for line in lines if line.startswith("| ") and "---" not in line]
    findings = [f"{op.strip()} ({why.strip()[:40]})" for op, _, why in rows[1:]]
    if findings:
        return _one_line(lines[0].split(":")[0] + ": " + "; ".join(findings), 160)
    # a runtime's own error (Arm NN's parser: "RuntimeError: Failed to parse operator ...")
    errors = [line.strip() for line in lines if line.startswith(("RuntimeError:", "ValueError:"))]
    detail = errors[-1] if errors else next((x.strip() for x in lines[1:] if x.strip()), "")
    return _one_line(f"{lines[0].split(' (exit status')[0]} {detail}", 160)


def _one_line(text: str, width: int = 110) -> str:
    first = " ".join(text.split("\n")[0].split())
    return first if len(first) <= width else first[: width - 3] + "..."


def render(rows: list[dict[str, Any]], configs: list[tuple[str, str]]) -> str:
    names = [f"{t} {'f32' if m == 'none' else m}" for t, m in configs]
    out = ["| model | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for model in dict.fromkeys(r["model"] for r in rows):
        cells = []
        for target, mode in configs:
            found = [
                r
                for r in rows
                if (r["model"], r["target"], r["quantization"]) == (model, target, mode)
            ]
            if not found:
                cells.append("")
                continue
            r = found[0]
            if r["status"] == "verified" or r["quantization"] == "int8_fallback":
                cell = r["status"] if r["status"] == "verified" else "missed"
                if r["quantization"].startswith("int8") and r.get("top1") is not None:
                    cell += f" (top-1 {r['top1']:.2f}, rel {r['relative_diff']:.3f}"
                    cell += f", {r['sqnr_db']:.0f} dB" if r.get("sqnr_db") is not None else ""
                    float_layers = r.get("float_layers")
                    cell += f", {float_layers} layers float" if float_layers is not None else ""
                    flips = (r.get("flip_margins") or {}).get("flipped")
                    if flips:  # how close a call each changed prediction was
                        cell += ", flips at margin " + "/".join(f"{m:.3f}" for m in flips)
                        cell += f" sd (median {r['flip_margins']['median']:.3f})"
                    cell += ")"
            else:
                cell = f"failed: {r['reason']}"
            cells.append(cell.replace("|", "/"))
        out.append(f"| {model} | " + " | ".join(cells) + " |")
    counts = []
    for target, mode in configs:
        done = [r for r in rows if (r["target"], r["quantization"]) == (target, mode)]
        counts.append(f"{sum(r['status'] == 'verified' for r in done)}/{len(done)}")
    out.append("| **verified** | " + " | ".join(counts) + " |")
    return "\n".join(out)


def render_dev(rows: list[dict[str, Any]]) -> str:
    """The development models' table: target x model, float32 (verified / max relative diff)
    and int8 (its figures), each with the precheck's verdict where it refused."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    out = ["| target | " + " | ".join(models) + " |", "|---" * (len(models) + 1) + "|"]
    for target in dict.fromkeys(r["target"] for r in rows):
        cells = []
        for model in models:
            parts = []
            for r in rows:
                if (r["model"], r["target"]) != (model, target):
                    continue
                parts.append(_dev_cell(r))
            cells.append("<br>".join(parts).replace("|", "/"))
        out.append(f"| {target} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _dev_cell(r: dict[str, Any]) -> str:
    mode = "f32" if r["quantization"] == "none" else r["quantization"]
    if r["status"] == "verified" or r.get("relative_diff") is not None:
        text = f"{mode}: {r['status']}, rel {r['relative_diff']:.2g}"
        if r["quantization"] != "none":
            text += f", {r['sqnr_db']:.1f} dB" if r.get("sqnr_db") is not None else ""
            text += f", top-1 {r['top1']:.3f}" if r.get("top1") is not None else ""
            text += f", accuracy {r['accuracy']:.4f}" if r.get("accuracy") is not None else ""
        if r["status"] != "verified":
            text += f" ({r['reason']})"
    else:
        text = f"{mode}: failed: {r['reason']}"
    if r.get("precheck") == "refused":
        text += " [precheck refused]"
    if r.get("conversion_seconds"):
        text += f", converted in {r['conversion_seconds']:g} s"
    return text


def versions() -> dict[str, str]:
    return {"python": platform.python_version(), **installed(TOOLS)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dev", action="store_true", help="the development models' table")
    parser.add_argument("--models", default=None)
    parser.add_argument("--configs", default=None)
    parser.add_argument("--size", type=int, default=128)
    # calibration crops (the test split stays 16): int8_fallback's search measures its budget
    # on them, and a budget of agreement >= 0.99 needs more samples than 16 to mean it
    parser.add_argument("--calibration", type=int, default=16)
    parser.add_argument("--work", type=Path, default=Path(".edgeflow/coverage"))
    parser.add_argument("--out", type=Path, default=Path("coverage.json"))
    args = parser.parse_args(argv)
    from edgeflow.engine.cache import Cache

    default_models, default_configs = (DEV_RECIPES, DEV_CONFIGS) if args.dev else (MODELS, CONFIGS)
    models = [m for m in (args.models or ",".join(default_models)).split(",") if m]
    configs_text = args.configs or ",".join(f"{t}:{m}" for t, m in default_configs)
    configs = [tuple(c.split(":", 1)) for c in configs_text.split(",") if c]
    work, out = args.work.resolve(), args.out.resolve()
    if args.dev:
        return dev_table(models, configs, work, out)
    (work / "targets").mkdir(parents=True, exist_ok=True)
    (work / "targets" / "tflite_micro.yaml").write_text(BOARD, encoding="utf-8")
    os.chdir(work)  # so that edgeflow finds targets/tflite_micro.yaml
    recipes = work / "recipes"
    recipes.mkdir(parents=True, exist_ok=True)
    cache = Cache(work / "cache")
    rows = []
    for model in models:
        recipe = recipes / f"{model}.yaml"
        recipe.write_text(recipe_text(model, args.size, args.calibration), encoding="utf-8")
        for target, mode in configs:
            row = run_one(recipe, target, mode, cache, work / "build")
            rows.append(row)
            status = f"{row['status']:<9} {row['seconds']:6.1f} s  {row['reason']}"
            print(f"{model:<28} {target:<18} {mode:<5} {status}", flush=True)
    table = render(rows, configs)
    print("\n" + table)
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "image_size": args.size,
        "calibration_samples": args.calibration,
        "float_tolerance": FLOAT_TOLERANCE,
        "versions": versions(),
        "rows": rows,
    }
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\ncoverage.json: {out}")
    return 0


def dev_table(models: list[str], configs: list[tuple[str, str]], work: Path, out: Path) -> int:
    """--dev: the shipped development recipes, forced past the precheck, one table."""
    from edgeflow.engine.cache import Cache

    work.mkdir(parents=True, exist_ok=True)
    cache = Cache(work / "cache")
    rows = []
    for model in models:
        for target, mode in configs:
            recipe = REPO / "recipes" / f"{model}.yaml"
            row = run_one(recipe, target, mode, cache, work / "build", forced=True)
            rows.append(row)
            status = f"{row['status']:<9} {row['seconds']:6.1f} s"
            status += f" (conversion {row['conversion_seconds']:g} s)  {row['reason']}"
            print(f"{model:<24} {target:<18} {mode:<5} {status}", flush=True)
    print("\n" + render_dev(rows))
    report = {"date": time.strftime("%Y-%m-%d"), "versions": versions(), "rows": rows}
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\ncoverage.json: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
