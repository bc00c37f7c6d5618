"""The cross-framework loss matrix: what each conversion path and quantization mode costs.

The same digits networks exist in PyTorch, Keras and Flax, each trained in its own framework
(`dvc repro`). For every recipe in RECIPES that exists, every target and every quantization
mode the target offers, and for a Keras source both paths to the TFLite family (native:
TensorFlow's TFLite converter; onnx: tf2onnx and the ONNX pipeline), this runs one edgeflow
build in-process (one shared stage cache, so a rerun takes seconds) and reads its metrics.json:

    python benchmarks/loss_matrix.py [--recipes digits_keras,digits_jax] [--targets tflite]
        [--modes none,int8,int8_a16] [--cache .edgeflow/cache] [--build-dir build/loss_matrix]
        [--json loss_matrix.json]

Each row compares the artifact, run in its target's runtime on the recipe's evaluation split,
with its own source framework's outputs (not with another framework's model): the figures
measure conversion loss, not the training differences between frameworks. Printed: the tool
versions, one Markdown table (accuracy, drop, max abs diff, max diff relative to the output's
range, SQNR, the error each step added for TensorFlow and JAX sources, size), and for the
Keras models which path is closer on each TFLite target and mode. A build that fails is a row
with the failure's first line. tensorrt is left out: its engine builds but cannot run here.
Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _versions import installed

REPO = Path(__file__).resolve().parent.parent
# Recipe stems in recipes/; one that does not exist (yet) is skipped with a note.
RECIPES = (
    "digits_cnn",
    "digits_keras",
    "digits_jax",
    "digits_mobilenet",
    "digits_keras_mobilenet",
    "digits_jax_mobilenet",
)
TARGETS = ("tflite", "tflite_micro", "armnn", "onnxruntime_micro")
# mode name -> recipe overrides; int8_a16 is int8 weights with int16 activations (16x8)
MODES: dict[str, dict[str, str]] = {
    "none": {"quantization.mode": "none"},
    "fp16": {"quantization.mode": "fp16"},
    "int8": {"quantization.mode": "int8", "quantization.activations": "int8"},
    "int8_a16": {"quantization.mode": "int8", "quantization.activations": "int16"},
}
FRAMEWORKS = {"pytorch": "PyTorch", "tensorflow": "Keras", "jax": "Flax", "onnx": "ONNX"}
TOOLS = ("torch", "tensorflow", "tf2onnx", "jax", "flax", "jax2onnx", "onnx", "onnxruntime",
         "onnx2tf", "ai-edge-litert", "tflite-micro")  # fmt: skip
COLUMNS = ("recipe", "framework", "path", "target", "mode", "accuracy (artifact)", "drop (pp)",
           "max abs diff", "max rel diff (of range)", "SQNR dB",
           "step error: source->ONNX / ONNX->target", "size B", "note")  # fmt: skip


def versions() -> dict[str, str]:
    """The installed version of each tool, and Debian's Arm NN packages."""
    found = installed(TOOLS)
    from edgeflow.core.versions import debian_versions

    found["armnn (debian)"] = debian_versions("*armnn*") or "not installed"
    return found


def cases(recipe: str, targets: list[str], modes: list[str]) -> list[dict[str, Any]]:
    """The builds of one recipe: target x mode (the modes the target offers) x path."""
    from edgeflow.recipe import find_recipe
    from edgeflow.targets import load_profile

    path = find_recipe(str(REPO / "recipes" / f"{recipe}.yaml"))
    kind = _source_kind(path)
    found = []
    for target in targets:
        profile = load_profile(target)
        for mode in modes:
            overrides = {"target": target, **MODES[mode]}
            if overrides["quantization.mode"] not in profile.quantization:
                continue
            if mode == "int8_a16" and not profile.family.int16_activations:
                continue
            vias = ["onnx"]
            if kind == "tensorflow" and profile.family.tensorflow_native:
                vias = ["native", "onnx"]
            for via in vias:
                extra = {"convert.via": via} if kind == "tensorflow" else {}
                found.append(
                    {"recipe": recipe, "file": path, "kind": kind, "target": target,
                     "mode": mode, "path": via, "overrides": {**overrides, **extra}}
                )  # fmt: skip
    return found


def _source_kind(path: Path) -> str:
    import yaml

    return str(yaml.safe_load(path.read_text(encoding="utf-8"))["source"]["kind"])


def build(case: dict[str, Any], cache: Path, build_dir: Path) -> dict[str, Any]:
    """Run one build and return its row; a failed build is a row that says why."""
    from edgeflow.core.errors import EdgeflowError, InternalError
    from edgeflow.engine.cache import Cache
    from edgeflow.engine.runner import run_build
    from edgeflow.recipe import load_recipe

    base = {k: case[k] for k in ("recipe", "kind", "target", "mode", "path")}
    base["framework"] = FRAMEWORKS.get(case["kind"], case["kind"])
    base["overrides"] = case["overrides"]
    start = time.perf_counter()
    try:
        loaded = load_recipe(case["file"], case["overrides"])
        result = run_build(loaded, Cache(cache), build_dir, lambda line: None)
    except (EdgeflowError, InternalError) as exc:
        row = {**base, "failed": exc.render().splitlines()[0]}
        details = getattr(exc, "details", None)
        if details is not None:
            row["details"] = str(details)
        row["internal"] = isinstance(exc, InternalError)
        row["seconds"] = time.perf_counter() - start
        return row
    row = row_from_metrics(base, result.metrics)
    row["failed_checks"] = list(result.failed_checks)
    row["seconds"] = time.perf_counter() - start
    return row


def row_from_metrics(base: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """A row's figures from a build's metrics.json (edgeflow/stages/report.py)."""
    row = dict(base)
    row["size_bytes"] = metrics["size_bytes"]
    row["verified"] = metrics["verified"]
    if metrics.get("not_verified"):
        row["not_verified"] = str(metrics["not_verified"])
        return row
    accuracy = metrics.get("accuracy") or {}
    agreement = metrics.get("agreement") or {}
    conversion = metrics.get("conversion") or {}
    row.update(
        accuracy_source=accuracy.get("source"),
        accuracy=accuracy.get("artifact"),
        drop=accuracy.get("drop"),
        top1=agreement.get("top1"),
        max_abs_diff=agreement.get("max_abs_diff"),
        max_relative_diff=agreement.get("max_relative_diff"),
        sqnr_db=agreement.get("min_sqnr_db"),
        source_to_onnx=conversion.get("source_to_onnx"),
        onnx_to_target=conversion.get("onnx_to_target"),
        source_to_target=conversion.get("source_to_target"),
    )
    if "armnn_version" in metrics:
        row["armnn_version"] = metrics["armnn_version"]
    return row


def _num(value: Any, spec: str) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return format(value, spec)


def cells(row: dict[str, Any]) -> list[str]:
    """The table's cells of one row, in COLUMNS order."""
    start = [row["recipe"], row["framework"], row["path"], row["target"], row["mode"]]
    if "failed" in row:
        kind = "BUG" if row.get("internal") else "FAILED"
        return [*start, *[""] * 7, f"{kind}: {row['failed']}".replace("|", "\\|")]
    if "not_verified" in row:
        return [*start, *[""] * 6, f"{row['size_bytes']:,}", f"not verified: {row['not_verified']}"]
    steps = ""
    if row.get("source_to_onnx") is not None or row.get("onnx_to_target") is not None:
        steps = f"{_num(row['source_to_onnx'], '.1e')} / {_num(row['onnx_to_target'], '.1e')}"
    elif row["kind"] == "pytorch":
        steps = "not recorded"
    elif row["path"] == "native":
        steps = "no ONNX step"
    drop = None if row.get("drop") is None else 100 * row["drop"]
    note = "; ".join(row.get("failed_checks") or []) or ("" if row["verified"] else "NO")
    return [
        *start,
        _num(row.get("accuracy"), ".4f"),
        _num(drop, ".2f"),
        _num(row.get("max_abs_diff"), ".2e"),
        _num(row.get("max_relative_diff"), ".2e"),
        _num(row.get("sqnr_db"), ".1f"),
        steps,
        f"{row['size_bytes']:,}",
        ("missed: " + note if row.get("failed_checks") else note).replace("|", "\\|"),
    ]


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as one Markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def closer(rows: list[dict[str, Any]]) -> list[str]:
    """For each TensorFlow recipe, TFLite target and mode with both paths: which is closer
    to the Keras model (smaller max abs diff, higher SQNR), from the measured rows."""
    pairs: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r["kind"] == "tensorflow":
            pairs.setdefault((r["recipe"], r["target"], r["mode"]), {})[r["path"]] = r
    lines = []
    for (recipe, target, mode), by_path in pairs.items():
        if "native" not in by_path:
            continue
        native, onnx = by_path["native"], by_path.get("onnx")
        where = f"{recipe} {target} {mode}"
        if onnx is None:
            continue
        broken = [p for p, r in (("native", native), ("onnx", onnx)) if "max_abs_diff" not in r]
        if broken:
            why = "; ".join(f"{p}: {by_path[p].get('failed', 'not measured')}" for p in broken)
            lines.append(f"- {where}: no comparison ({why})")
            continue
        lines.append(f"- {where}: {_verdict(native, onnx)}")
    return lines


def _verdict(native: dict[str, Any], onnx: dict[str, Any]) -> str:
    a, b = native["max_abs_diff"], onnx["max_abs_diff"]
    sa, sb = native["sqnr_db"], onnx["sqnr_db"]
    by_diff = "native" if a < b else "onnx" if b < a else "tie"
    by_sqnr = "native" if sa > sb else "onnx" if sb > sa else "tie"
    figures = (
        f"max abs diff {a:.2e} (native) vs {b:.2e} (onnx), "
        f"SQNR {_num(sa, '.1f')} vs {_num(sb, '.1f')} dB"
    )
    if by_diff == by_sqnr:
        return f"{by_diff} closer ({figures})" if by_diff != "tie" else f"equal ({figures})"
    return f"mixed: {by_diff} by max abs diff, {by_sqnr} by SQNR ({figures})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--cache", type=Path, default=REPO / ".edgeflow" / "cache")
    parser.add_argument("--build-dir", type=Path, default=REPO / "build" / "loss_matrix")
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    args = parser.parse_args()
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; known: {', '.join(MODES)}")
    targets = args.targets.split(",")
    found = versions()
    print("Tool versions: " + ", ".join(f"{k} {v}" for k, v in found.items()))
    print()
    if "tensorrt" not in targets:
        print("note: tensorrt is left out: its engine builds here but cannot run (no GPU).")
    todo = []
    for recipe in args.recipes.split(","):
        if not (REPO / "recipes" / f"{recipe}.yaml").is_file():
            print(f"note: recipes/{recipe}.yaml does not exist here; skipped")
            continue
        todo += cases(recipe, targets, modes)
    rows = []
    began = time.perf_counter()
    for i, case in enumerate(todo, 1):
        row = build(case, args.cache, args.build_dir)
        verdict = row.get("failed", "built")
        print(
            f"[{i}/{len(todo)}] {case['recipe']} {case['target']} {case['mode']} "
            f"via {case['path']}: {verdict} ({row['seconds']:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
        rows.append(row)
    print()
    print(table(rows))
    print()
    print("Keras: which path is closer to the Keras model, per TFLite target and mode")
    print()
    print("\n".join(closer(rows)) or "(no Keras recipe with both paths measured)")
    print()
    print(f"{len(rows)} builds in {time.perf_counter() - began:.0f} s")
    if args.json:
        rows_out = [{k: v for k, v in r.items() if k != "file"} for r in rows]
        args.json.write_text(json.dumps({"versions": found, "rows": rows_out}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())
