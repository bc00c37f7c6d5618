"""Autopilot: from a model file to a verified build with no hand edit, on every target.

For each foreign ONNX file of benchmarks/foreign.py (as older and other exporters write
them, built in code) it runs `edgeflow init FILE` (the recipe and the random-data data.py it
writes, untouched), then per target `edgeflow run recipe=... target=T` as written and again
with `+rewrites=[auto]`. The shipped demo and development recipes (DEMOS) are run the same
two ways. `--no-target-rewrites` builds both ways with `target_rewrites=false`: what the
profiles' default rules do for every model, can `auto` find by itself? One process per build,
`--jobs` at once, one stage cache:

    python benchmarks/autopilot.py [--files 'lstm*,gru_op7_ir3'] [--demos digits_cnn]
        [--targets tflite,armnn] [--no-target-rewrites] [--jobs 2]
        [--work .edgeflow/autopilot] [--out docs/autopilot.json]

Per build it records the exit status (0 verified, 1 a threshold missed or a tool crash,
2 refused, 3 not verified), the first error line, the rules `auto` chose and the seconds.
It prints per target the share verified with and without `auto` and the rules chosen, and
the issue's goal: every build that some sequence of edgeflow's rules makes verify (here:
verified as written, with `auto`, or with the precheck's suggestions applied as printed in
docs/foreign.json, foreign.py's last run) verifies with `auto`.
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
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _foreign.build import write_inputs
from _foreign.files import FILES
from _versions import installed

TARGETS = ("onnxruntime_micro", "tflite", "tflite_micro", "armnn")
# Shipped recipes: the demo and the development models of benchmarks/coverage.py --dev.
DEMOS = (
    "digits_cnn",
    "digits_keras",
    "digits_jax",
    "digits_prelu",
    "digits_paddle_style",
    "speech_lstm_encoder",
    "streaming_keywords",
)
TOOLS = ("onnx", "onnxruntime", "onnx2tf", "tensorflow", "ai-edge-litert", "tflite-micro", "torch")
REPO = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT = 900  # s per build
STATUS = {0: "verified", 1: "failed", 2: "refused", 3: "not_verified"}


def edgeflow(args: list[str], cwd: Path | None = None) -> tuple[int, str, float]:
    """`python -m edgeflow ARGS` in a process of its own: (exit status, output, seconds)."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    start = time.perf_counter()
    try:
        command = [sys.executable, "-m", "edgeflow", *args]
        run = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT,
                             env=env, cwd=cwd, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return 124, f"no result in {BUILD_TIMEOUT} s", BUILD_TIMEOUT
    return run.returncode, run.stdout + run.stderr, round(time.perf_counter() - start, 1)


def build(recipe: str, target: str, work: Path, auto: bool, extra: list[str]) -> dict[str, Any]:
    args = [f"recipe={recipe}", f"target={target}", "-q", *extra,
            f"cache_dir={work / 'cache'}", f"build_dir={work / 'build'}"]  # fmt: skip
    if auto:
        args.append("+rewrites=[auto]")
    code, output, seconds = edgeflow(["run", *args])
    lines = output.splitlines()
    rules = next((ln.split("auto rewrites:", 1)[1].strip() for ln in lines
                  if ln.strip().startswith("auto rewrites:")), "")  # fmt: skip
    error = next((ln for ln in lines if ln.startswith(("error:", "NOT VERIFIED"))), "")
    return {
        "status": STATUS.get(code, "crashed"),
        "exit": code,
        "seconds": seconds,
        "rules": [] if rules in ("", "none needed") else _split(rules),
        "error": error[:300],
    }


def _split(text: str) -> list[str]:
    """`a, {rule: b, ops: [X, Y]}, c` -> its entries (commas inside braces kept)."""
    found, depth, part = [], 0, ""
    for char in text:
        depth += 1 if char in "{[" else -1 if char in "}]" else 0
        if char == "," and depth == 0:
            found.append(part.strip())
            part = ""
        else:
            part += char
    return [*found, part.strip()] if part.strip() else found


def init_file(name: str, work: Path) -> dict[str, Any]:
    """The foreign file written, and `edgeflow init` run on it: its own folder, so that each
    file's data.py stands beside its recipe."""
    folder = work / "models" / name
    folder.mkdir(parents=True, exist_ok=True)
    recipe = folder / f"{name}.yaml"
    if recipe.exists():  # a second run of the benchmark: init refuses to overwrite
        return {"recipe": str(recipe), "init": "kept from an earlier run"}
    model, data = write_inputs(FILES[name](), folder)
    data.unlink()  # init writes its own data.py
    code, output, seconds = edgeflow(["init", str(model), "--output", str(recipe)], cwd=folder)
    return {"recipe": str(recipe), "init": "written" if code == 0 else output.strip()[-300:],
            "init_seconds": seconds}  # fmt: skip


def row(
    source: str, kind: str, recipe: str | None, target: str, work: Path, extra: list[str]
) -> dict[str, Any]:
    found: dict[str, Any] = {"source": source, "kind": kind, "target": target}
    if recipe is None:
        found["as_written"] = found["auto"] = {"status": "no_recipe", "exit": None,
                                               "seconds": 0, "rules": [], "error": ""}  # fmt: skip
        return found
    found["as_written"] = build(recipe, target, work, False, extra)
    found["auto"] = build(recipe, target, work, True, extra)
    return found


def suggested_reference() -> dict[tuple[str, str], bool]:
    """(file, target) -> verified with the precheck's suggestions as printed, from the last
    run of benchmarks/foreign.py (docs/foreign.json)."""
    path = REPO / "docs" / "foreign.json"
    if not path.is_file():
        return {}
    rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    return {
        (r["file"], r["target"]): (r.get("with_suggested") or {}).get("status") == "verified"
        for r in rows
    }


def render(rows: list[dict[str, Any]], targets: list[str]) -> str:
    head = ("| target | builds | verified as written | verified with auto | auto chose rules in "
            "| median s (as written / auto) | rules chosen |")  # fmt: skip
    out = [head, "|---" * 7 + "|"]
    for target in targets:
        mine = [r for r in rows if r["target"] == target]
        if not mine:
            continue
        n = len(mine)

        def share(key: str, mine: list[dict[str, Any]] = mine) -> str:
            k = sum(r[key]["status"] == "verified" for r in mine)
            return f"{k} ({100 * k / len(mine):.0f}%)"

        chose = sum(bool(r["auto"]["rules"]) for r in mine)
        rules = Counter(e.split(",")[0].strip("{").removeprefix("rule: ")
                        for r in mine for e in r["auto"]["rules"])  # fmt: skip
        median = [sorted(r[k]["seconds"] for r in mine)[n // 2] for k in ("as_written", "auto")]
        top = ", ".join(f"{name} x{count}" for name, count in rules.most_common(6)) or "none"
        out.append(f"| {target} | {n} | {share('as_written')} | {share('auto')} | {chose} | "
                   f"{median[0]:.1f} / {median[1]:.1f} | {top} |")  # fmt: skip
    return "\n".join(out)


def goal(rows: list[dict[str, Any]], reference: dict[tuple[str, str], bool]) -> list[str]:
    """Every build some sequence of rules makes verify, `auto` makes verify."""
    reachable = [
        r
        for r in rows
        if r["as_written"]["status"] == "verified"
        or r["auto"]["status"] == "verified"
        or reference.get((r["source"], r["target"]), False)
    ]
    missed = [r for r in reachable if r["auto"]["status"] != "verified"]
    lines = [
        f"verified with auto: {len(reachable) - len(missed)}/{len(reachable)} of the builds "
        "that some sequence of edgeflow's rules makes verify (goal: all)"
    ]
    lines += [f"  missed: {r['source']} on {r['target']}: {r['auto']['error']}" for r in missed]
    lost = [r for r in rows if r["as_written"]["status"] == "verified"
            and r["auto"]["status"] != "verified"]  # fmt: skip
    lines.append(f"verified as written but not with auto: {len(lost)} (goal 0)")
    return lines


def select(patterns: str | None, names: Any) -> list[str]:
    if patterns is None:
        return list(names)
    if patterns == "":
        return []
    chosen = [n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns.split(","))]
    if not chosen:
        raise SystemExit(f"nothing matches {patterns!r}; choose from: {', '.join(names)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--files", default=None, help="foreign files (names or globs); '' none")
    parser.add_argument("--demos", default=None, help="shipped recipes (names or globs); '' none")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--jobs", type=int, default=2, help="builds at once")
    parser.add_argument("--work", type=Path, default=Path(".edgeflow/autopilot"))
    parser.add_argument("--out", type=Path, default=Path("autopilot.json"))
    parser.add_argument(
        "--no-target-rewrites",
        action="store_true",
        help="build with target_rewrites=false: can auto find what the profiles' defaults do?",
    )
    args = parser.parse_args(argv)
    extra = ["target_rewrites=false"] if args.no_target_rewrites else []
    work = args.work.resolve()
    files, demos = select(args.files, FILES), select(args.demos, DEMOS)
    targets = [t for t in args.targets.split(",") if t]
    start = time.perf_counter()
    sources: list[tuple[str, str, str | None]] = []
    inits = {}
    for name in files:
        inits[name] = init_file(name, work)
        failed = inits[name]["init"] != "written" and "kept" not in inits[name]["init"]
        sources.append((name, "foreign", None if failed else inits[name]["recipe"]))
        if failed:
            print(f"init failed on {name}: {inits[name]['init']}", file=sys.stderr)
    sources += [(name, "demo", str(REPO / "recipes" / f"{name}.yaml")) for name in demos]
    rows = []
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [
            pool.submit(row, s, k, r, t, work, extra) for s, k, r in sources for t in targets
        ]
        for done in as_completed(futures):
            r = done.result()
            rows.append(r)
            written, auto = r["as_written"]["status"], r["auto"]["status"]
            rules = ", ".join(r["auto"]["rules"])
            print(f"{r['source']:<40} {r['target']:<18} as written {written:<12} "
                  f"auto {auto:<12} {rules}", flush=True)  # fmt: skip
    rows.sort(key=lambda r: (r["kind"], r["source"], targets.index(r["target"])))
    wall = time.perf_counter() - start
    table = render(rows, targets)
    lines = goal(rows, suggested_reference())
    print(f"\n{table}\n\n" + "\n".join(lines) + f"\n\n{len(rows)} rows in {wall:.0f} s")
    record = {
        "date": time.strftime("%Y-%m-%d"),
        "overrides": extra,
        "jobs": args.jobs,
        "cpus": os.cpu_count(),
        "wall_seconds": round(wall, 1),
        "versions": {"python": platform.python_version(), **installed(TOOLS)},
        "goal": lines,
        "inits": inits,
        "rows": rows,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
