"""Foreign model files: ONNX files as older and other exporters write them, through every target.

Builds, in code, small ONNX files the way early PyTorch, Caffe2-era tools, tf2onnx,
keras2onnx, Paddle2ONNX and onnxruntime's quantizer write them (benchmarks/_foreign/files.py:
opsets 5-18, IR 3-8, initializers as inputs, stale value_info, wrong declared output ranks,
names with '@', ':' and '/', pre-quantized files, -1 and symbolic dims, weights built in
the graph, a 0-D sample rate feeding an If; seeded random weights), writes one recipe per
file and target (float32, `metric: agreement` on seeded random data of the declared shapes),
and runs edgeflow on each, one process per build, `--jobs` at once on one stage cache:

    python benchmarks/foreign.py [--files 'lstm*,gru_op7_ir3'] [--targets tflite,armnn]
        [--jobs 2] [--work .edgeflow/foreign] [--out docs/foreign.json]

Per file and target it records: ingested (or refused, and whether the message is located
and names an op of the file), the precheck's verdict and suggested rules, the build as is,
the build with the suggested rules applied exactly as printed (`rewrites:`; a suggestion
that is not a rule, or a rule that fails as written, is recorded as a hint that cannot be
followed), and, where the precheck refused, the build forced past it
(`precheck.continue_on_failure`): verified, or wrong output that verify caught, or failed.
Prints a table per target and the issue's goals; writes every row to the JSON.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _foreign.build import FLOAT_TOLERANCE, followable, one, recipe_text, write_inputs
from _foreign.files import FILES
from _versions import installed

TARGETS = ("onnxruntime_micro", "tflite", "tflite_micro", "armnn")
TOOLS = ("onnx", "onnxruntime", "onnx2tf", "tensorflow", "ai-edge-litert", "tflite-micro")
REPO = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT = 900  # s per build


def build(recipe: Path, work: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """One build in a process of its own; a crash or a hang is a record too."""
    command = [sys.executable, str(Path(__file__).resolve()), "--one", str(recipe),
               "--work", str(work), "--overrides", json.dumps(overrides)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    start = time.perf_counter()
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT,
                             env=env, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"status": "hang", "message": f"no result in {BUILD_TIMEOUT} s",
                "overrides": overrides, "precheck": None, "suggested": [], "stages": {},
                "failed_stage": "unknown", "seconds": BUILD_TIMEOUT}  # fmt: skip
    last = run.stdout.strip().splitlines()[-1:] if run.stdout.strip() else []
    if run.returncode == 0 and last and last[0].startswith("{"):
        return json.loads(last[0])
    tail = (run.stderr or run.stdout)[-2000:]
    return {"status": "crashed", "message": f"exit status {run.returncode}: {tail}",
            "overrides": overrides, "precheck": None, "suggested": [], "stages": {},
            "failed_stage": "unknown",
            "seconds": round(time.perf_counter() - start, 1)}  # fmt: skip


def file_target(name: str, target: str, work: Path, ops: set[str]) -> dict[str, Any]:
    """Every build one file and target needs: as is, with the suggestions, forced."""
    recipe = work / "recipes" / f"{name}__{target}.yaml"
    row: dict[str, Any] = {"file": name, "target": target}
    as_is = build(recipe, work, {})
    row["as_is"] = as_is
    row["ingested"] = as_is["stages"].get("ingest") in ("ran", "cached")
    if not row["ingested"]:
        message = as_is.get("message", "")
        row["ingest_error"] = message
        row["ingest_error_located"] = _located(message, name)
        row["ingest_error_names_op"] = sorted(op for op in ops if op in message)
    row["precheck"] = as_is["precheck"]
    row["suggested"] = as_is["suggested"]
    if row["precheck"] == "refused":
        row["forced"] = build(recipe, work, {"precheck.continue_on_failure": True})
        rules, settings = followable(as_is["suggested"])
        row["not_rules"] = settings
        if rules:
            row["with_suggested"] = build(recipe, work, {"rewrites": rules})
    return row


def _located(message: str, name: str) -> bool:
    """Whether an error says where: the recipe's or the file's name, with a place."""
    return f"{name}__" in message or f"{name}.onnx" in message


def verdict(row: dict[str, Any]) -> dict[str, Any]:
    """The row's figures: as is, with suggestions, forced, agreement, wrong output."""
    as_is = row["as_is"]["status"] == "verified"
    suggested = row.get("with_suggested", row["as_is"] if row["precheck"] != "refused" else {})
    forced = row.get("forced", row["as_is"])
    refused_ok = row["ingested"] or (
        row.get("ingest_error_located") and bool(row.get("ingest_error_names_op"))
    )
    agrees = None
    if row["precheck"] is not None:
        agrees = (row["precheck"] == "passed") == (forced["status"] == "verified")
    return {
        "ingested": row["ingested"],
        "ingest_ok": bool(refused_ok),
        "precheck_passed": row["precheck"] == "passed",
        "verified_as_is": as_is,
        "verified_suggested": suggested.get("status") == "verified",
        "forced_verified": forced["status"] == "verified",
        "wrong_caught": forced["status"] == "wrong_output",
        "agrees": agrees,
        "wrong_passed": row["precheck"] == "passed" and row["as_is"]["status"] == "wrong_output",
    }


def render(rows: list[dict[str, Any]], targets: list[str]) -> str:
    """One table: a line per target, counts and % of the files."""
    head = ("| target | files | ingested | refused, located, naming the op | precheck passed | "
            "verified as is | verified with suggested rules | forced: verified | "
            "wrong output caught by verify | precheck agrees with forced build | "
            "wrong output the precheck passed |")  # fmt: skip
    out = [head, "|---" * 11 + "|"]
    for target in targets:
        mine = [verdict(r) for r in rows if r["target"] == target]
        n = len(mine)
        if not n:
            continue

        def cell(key: str, subset: list[dict[str, Any]] = mine) -> str:
            k = sum(bool(v[key]) for v in subset)
            return f"{k} ({100 * k / max(len(subset), 1):.0f}%)"

        judged = [v for v in mine if v["agrees"] is not None]
        refused = [v for v in mine if not v["ingested"]]
        out.append(
            f"| {target} | {n} | {cell('ingested')} | "
            f"{sum(v['ingest_ok'] for v in refused)}/{len(refused)} | {cell('precheck_passed')} | "
            f"{cell('verified_as_is')} | {cell('verified_suggested')} | "
            f"{cell('forced_verified')} | {cell('wrong_caught')} | "
            f"{sum(bool(v['agrees']) for v in judged)}/{len(judged)} | "
            f"{sum(v['wrong_passed'] for v in mine)} |"
        )
    return "\n".join(out)


def goals(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's three goals, met or not, over every row."""
    figures = [verdict(r) for r in rows]
    ingest = sum(v["ingest_ok"] for v in figures)
    judged = [v for v in figures if v["agrees"] is not None]
    agree = sum(bool(v["agrees"]) for v in judged)
    wrong = sum(v["wrong_passed"] for v in figures)
    pct = 100 * agree / max(len(judged), 1)
    return [
        f"ingested or refused with a located error naming the op: {ingest}/{len(figures)} "
        f"({100 * ingest / max(len(figures), 1):.0f}%; goal 100%)",
        f"precheck verdict agrees with the forced build: {agree}/{len(judged)} ({pct:.0f}%; "
        "goal >= 95%)",
        f"wrong output that the precheck passed: {wrong} (goal 0)",
    ]


def versions() -> dict[str, str]:
    return {"python": platform.python_version(), **installed(TOOLS)}


def select(patterns: str | None) -> list[str]:
    if not patterns:
        return list(FILES)
    chosen = [n for n in FILES if any(fnmatch.fnmatch(n, p) for p in patterns.split(","))]
    if not chosen:
        raise SystemExit(f"no file matches {patterns!r}; files: {', '.join(FILES)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--files", default=None, help="names or globs, comma-separated")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--jobs", type=int, default=2, help="builds at once")
    parser.add_argument("--work", type=Path, default=Path(".edgeflow/foreign"))
    parser.add_argument("--out", type=Path, default=Path("foreign.json"))
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # a build, in this process
    parser.add_argument("--overrides", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    work = args.work.resolve()
    if args.one:
        record = one(args.one, work / "cache", work / "build", json.loads(args.overrides))
        print(json.dumps(record, default=str))
        return 0
    names, targets = select(args.files), [t for t in args.targets.split(",") if t]
    for folder in ("files", "recipes"):
        (work / folder).mkdir(parents=True, exist_ok=True)
    ops: dict[str, set[str]] = {}
    meta: dict[str, dict[str, Any]] = {}
    for name in names:
        foreign = FILES[name]()
        model, data = write_inputs(foreign, work / "files")
        ops[name] = {n.op_type for n in foreign.model.graph.node}
        opset = next(o.version for o in foreign.model.opset_import if o.domain in ("", "ai.onnx"))
        meta[name] = {"style": foreign.style, "opset": opset, "ir": foreign.model.ir_version}
        for target in targets:
            text = recipe_text(foreign, target, model, data)
            (work / "recipes" / f"{name}__{target}.yaml").write_text(text, encoding="utf-8")
    start = time.perf_counter()
    jobs = [(n, t) for n in names for t in targets]
    rows: list[dict[str, Any]] = []
    partial = args.out.with_suffix(".partial.jsonl")  # the rows so far, should the run stop
    partial.write_text("", encoding="utf-8")
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(file_target, n, t, work, ops[n]) for n, t in jobs]
        for future in as_completed(futures):
            row = future.result()
            row.update(meta[row["file"]])
            rows.append(row)
            with partial.open("a", encoding="utf-8") as log:
                log.write(json.dumps({**row, "figures": verdict(row)}, default=str) + "\n")
            v, done = verdict(row), row["as_is"]
            print(f"{row['file']:<38} {row['target']:<18} ingest {v['ingested']!s:<5} "
                  f"precheck {row['precheck']!s:<7} as-is {done['status']:<12} "
                  f"forced {row.get('forced', {}).get('status', '-'):<12} "
                  f"suggested {row.get('with_suggested', {}).get('status', '-')}",
                  flush=True)  # fmt: skip
    wall = time.perf_counter() - start
    print("\n" + render(rows, targets) + "\n")
    for line in goals(rows):
        print(line)
    print(f"\n{len(names)} files x {len(targets)} targets, {args.jobs} jobs: {wall:.0f} s wall")
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "float_tolerance": FLOAT_TOLERANCE,
        "jobs": args.jobs,
        "cpus": os.cpu_count(),
        "wall_seconds": round(wall, 1),
        "versions": versions(),
        "goals": goals(rows),
        "rows": [{**r, "figures": verdict(r)} for r in rows],
    }
    rows.sort(key=lambda r: (names.index(r["file"]), targets.index(r["target"])))
    report["rows"] = [{**r, "figures": verdict(r)} for r in rows]
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    partial.unlink()
    print(f"rows: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
