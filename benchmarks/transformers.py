"""Transformers on every target: float32, weight-only int8, full int8 and int8 with fallback.

    python benchmarks/transformers.py [--models sentence_encoder,vit_digits,keyword_attention]
        [--targets onnxruntime_micro,tflite,tflite_micro,armnn]
        [--modes float,int8_weights,int8,fallback,fallback_mse] [--timeout 1200]
        [--work .edgeflow/transformers] [--out transformers.json]

The development transformers made in code (edgeflow/zoo/transformers.py, the recipes
recipes/sentence_encoder.yaml, vit_digits.yaml and keyword_attention.yaml: a BERT-style
sentence encoder with int64 ids and an attention mask, a ViT-tiny digit classifier, an
attention keyword spotter), each built as its recipe is with the target and mode as
overrides, forced past the precheck (`precheck.continue_on_failure`: a row is what the
converter and the runtime do). The trained small transformer of the development set
(rxnmapper's ALBERT, shared/DEVSET.md) is measured by benchmarks/devset.py (`--models
rxnmapper`), which fetches its wheel.

Modes: `float` (quantization none, the recipe's float32 threshold: max relative difference
1e-4), `int8_weights` (int8 weights, float activations), `int8` (full int8 with the target's
defaults, its float islands included), `fallback` (int8 with `quantization.fallback: auto`),
`fallback_mse` (that with `quantization.method: mse`, the TFLite family's targets only);
the classifiers' builds with `verify.min_top1_agreement: 0.99`, the goal, which the
fallback search then aims at.
Printed per row: float verified (max relative difference to the output's range), artifact
size and p50 latency, SQNR of the lowest output, the decision that output's kind makes (an
embedding: the lowest cosine similarity and the share of retrieval pairs whose match keeps
its rank; classes: top-1 agreement with the float model), layers kept float, mixes and the
time of the stage that searched (fallback); a failed build, its first error line (the whole
output beside it, MODEL-TARGET-MODE.log). Rows go to --out as JSON.

Goal (issue 35): float32 verified on every target with the operators; int8 (either form)
keeps top-1 agreement or the pair ranking at >= 0.99 of the float model's on every target
that runs int8.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _devset.decide import search
from devset import STAGE_LINE, first_error, missed

REPO = Path(__file__).resolve().parent.parent
MODELS = ("sentence_encoder", "vit_digits", "keyword_attention")
CLASSIFIERS = ("vit_digits", "keyword_attention")  # the sentence encoder: pair ranking
TARGETS = ("onnxruntime_micro", "tflite", "tflite_micro", "armnn")
MODES = ("float", "int8_weights", "int8", "fallback", "fallback_mse")
MSE_TARGETS = ("tflite", "tflite_micro", "armnn")  # quantization.method mse: the TFLite family
GOAL = 0.99
BUILT_LINE = re.compile(r"^\s+-> (\S+): ")  # a build's summary line: its folder, then figures
QUANTIZATION = {
    "float": "none",
    "int8_weights": "int8_weights",
    "int8": "int8",
    "fallback": "int8",
    "fallback_mse": "int8",
}


def overrides(model: str, target: str, mode: str) -> list[str]:
    """The command line's key=value for one build of a recipe: a classifier's builds are held
    to the goal's top-1 agreement (the fallback search then aims at it)."""
    keys = [
        f"target={target}",
        f"quantization.mode={QUANTIZATION[mode]}",
        "precheck.continue_on_failure=true",
    ]
    if mode.startswith("fallback"):
        keys.append("quantization.fallback=auto")
    if mode == "fallback_mse":
        keys.append("quantization.method=mse")
    if model in CLASSIFIERS:
        keys.append(f"verify.min_top1_agreement={GOAL}")
    return keys


def build(model: str, target: str, mode: str, work: Path, timeout: float) -> dict[str, Any]:
    """One build in its own process; its row."""
    cache, builds = work / "cache", work / "build"
    command = [
        sys.executable,
        "-m",
        "edgeflow",
        "run",
        f"recipe={REPO / 'recipes' / f'{model}.yaml'}",
        *overrides(model, target, mode),
        f"cache_dir={cache}",
        f"build_dir={builds}",
    ]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    row: dict[str, Any] = {"model": model, "target": target, "mode": mode}
    start = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {**row, "result": f"timed out after {timeout:.0f} s"}
    row["wall_s"] = round(time.perf_counter() - start, 1)
    (work / f"{model}-{target}-{mode}.log").write_text(stdout + "\n" + stderr)
    lines = [m for ln in stdout.splitlines() if (m := STAGE_LINE.match(ln))]
    stages = {m[1]: float(m[3]) for m in lines if m[2] != "cached"}
    if mode.startswith("fallback"):
        record = search(cache, process.pid)
        row["searched"] = record is not None
        row.update(record or {})
        if record is not None:
            row["search_s"] = stages.get("quantize" if target == "onnxruntime_micro" else "convert")
    built = [m[1] for ln in stdout.splitlines() if (m := BUILT_LINE.match(ln))]
    if not built:  # the build did not reach verify (its summary line names the folder)
        return {**row, "result": "failed: " + first_error(stdout + "\n" + stderr)}
    out = Path(built[-1])
    metrics = json.loads((out / "metrics.json").read_text())
    verify = json.loads((out / "verify.json").read_text())
    agreement = verify["agreement"] or {}
    outputs = agreement.get("outputs", [])
    row.update(
        result="verified" if metrics.get("verified") else "not verified: " + missed(out),
        max_relative_diff=max((o["max_rel_to_range"] or 0.0 for o in outputs), default=None),
        min_sqnr_db=agreement.get("min_sqnr_db"),
        size_bytes=metrics.get("size_bytes"),
        p50_ms=(metrics.get("latency_ms") or {}).get("p50"),
        decision=min((d for o in outputs if (d := decision(o))), default=None),
        accuracy=(verify.get("accuracy") or {}).get("artifact"),
    )
    return row


def decision(output: dict[str, Any]) -> tuple[float, str] | None:
    """The share of the float model's decisions an output keeps, by its kind, and its words."""
    if output["kind"] == "classes" and output.get("top1") is not None:
        return output["top1"], f"top-1 {output['top1']:.3f}"
    if output["kind"] == "embedding":
        retrieval = output.get("retrieval") or {}
        kept = retrieval.get("rank_kept")
        words = f"cosine {output['cosine_min']:.4f}"
        if kept is None:
            return output["cosine_min"], words
        return kept, f"{words}, rank kept {kept:.3f}"
    return None


def render(rows: list[dict[str, Any]]) -> str:
    """A line per model, target and mode; each failure's reason once, below, by number."""
    lines = [
        "| model | target | mode | result | float32 rel. diff | size | p50 ms | SQNR dB "
        "| decision | fallback: layers float, mixes, s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    reasons: list[str] = []
    for r in rows:
        result = r["result"]
        if not result.startswith(("verified", "not verified")):
            why = result.removeprefix("failed: ")
            if why not in reasons:
                reasons.append(why)
            result = f"fails ({reasons.index(why) + 1})"
        elif result != "verified":
            result = "**missed**: " + result.removeprefix("not verified: ")
        rel = r.get("max_relative_diff")
        sqnr = r.get("min_sqnr_db")
        made = r.get("decision")
        met = "" if made is None or r["mode"] == "float" or made[0] >= GOAL else " (< 0.99)"
        searched = (
            f"{r['float_layers']}, {r['mixes']}, {r.get('search_s') or 0:.0f}"
            if r.get("searched")
            else ""
        )
        cells = [
            r["model"],
            r["target"],
            r["mode"],
            result,
            f"{rel:.1e}" if rel is not None and r["mode"] == "float" else "",
            f"{r['size_bytes']:,}" if r.get("size_bytes") else "",
            f"{r['p50_ms']:.3f}" if r.get("p50_ms") is not None else "",
            f"{sqnr:.1f}" if sqnr is not None else "",
            (made[1] + met) if made is not None else "",
            searched,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *(f"{i}. {why}" for i, why in enumerate(reasons, 1))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--work", type=Path, default=Path(".edgeflow/transformers"))
    parser.add_argument("--out", type=Path, default=Path("transformers.json"))
    args = parser.parse_args(argv)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.models.split(","):
        for target in args.targets.split(","):
            for mode in args.modes.split(","):
                if mode == "fallback_mse" and target not in MSE_TARGETS:
                    continue  # onnxruntime calibrates with minmax, entropy or percentile
                row = build(model, target, mode, work, args.timeout)
                print(json.dumps(row), flush=True)
                rows.append(row)
                args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
