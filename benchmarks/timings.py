"""Print the demo's cold and warm run times, `edgeflow --help`, and edgeflow's CPU time
against hand-written scripts that make the same tool calls in one process.

Figures, each from the real CLI in a subprocess (median of several runs):
- cold run of the demo (fresh cache), warm re-run (nothing changed: answered by the
  up-to-date stamp, edgeflow/engine/uptodate.py), `edgeflow --help`; goals (issues 2, 16
  and 36): warm under 2 s and at most 5% of the cold run, --help under 0.2 s; and, for
  comparison, the warm re-run that goes the whole way (its stamp removed: Hydra, the recipe,
  the stage keys and every cache hit's check);
- CPU seconds (user + system of the process and all its children, from getrusage in this
  parent) of a cold edgeflow build against its reference script (benchmarks/_reference/),
  runs alternating, and their ratio; goal (issue 16): at most 1.3. Two cases:
  the demo through onnxruntime_micro int8 (recipes/digits_cnn.yaml), and a coverage model
  (benchmarks/coverage_models.py, 128x128) through tflite_micro int8, which needs torchvision
  (run this script in the coverage environment, docs/coverage.md; without it the case is
  skipped);
- a per-stage CPU breakdown of one more cold build of each case (benchmarks/_stage_cpu.py),
  with the page's (html stage's) share of it.

    python benchmarks/timings.py [--cold-runs 3] [--warm-runs 5] [--help-runs 5]
        [--rounds 3] [--cases digits,coverage] [--coverage-model resnet18]

CPU time is what the figures compare because this 2-core machine's wall clock depends on
what else runs. A busy second core inflates CPU time too: torch's OpenMP threads spin while
they wait for one another at every small op, and a script that takes 5 s of CPU took 28 s
while another test suite ran. Compare figures taken in one run of this script, on a quiet
machine, or with --omp-passive (OMP_WAIT_POLICY=PASSIVE for both sides).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"
RUN = ["run", "recipe=digits_cnn", "target=onnxruntime_micro", "quantization=int8"]
GOAL_RATIO = 1.3


ENV = dict(os.environ)  # --omp-passive adds OMP_WAIT_POLICY=PASSIVE for every command


def measured(command: list[str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and all its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    run = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False, env=ENV)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode != 0:
        print(run.stdout[-3000:], run.stderr[-3000:], sep="\n")
        raise SystemExit(f"{' '.join(command)} failed ({run.returncode})")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def edgeflow(args: list[str], cwd: Path = REPO) -> tuple[float, float]:
    return measured([sys.executable, "-m", "edgeflow", *args], cwd)


def stage_breakdown(args: list[str], cwd: Path) -> dict:
    """One more cold build, in benchmarks/_stage_cpu.py: CPU seconds per stage."""
    command = [sys.executable, str(BENCH / "_stage_cpu.py"), *args]
    run = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False, env=ENV)
    line = [ln for ln in run.stdout.splitlines() if ln.startswith("STAGE-CPU ")]
    if run.returncode != 0 or not line:
        print(run.stdout[-3000:], run.stderr[-3000:], sep="\n")
        raise SystemExit(f"the per-stage run failed ({run.returncode})")
    return json.loads(line[-1].removeprefix("STAGE-CPU "))


def print_breakdown(title: str, data: dict) -> None:
    print(f"\n{title}: CPU seconds per stage (this process + its worker)")
    total = 0.0
    for row in data["stages"]:
        cpu = row["parent"] + row["worker"]
        total += cpu
        print(f"  {row['stage']:<15} {cpu:6.2f}")
    rest = {
        "edgeflow process outside the stages (imports, Hydra, recipe, keys, cache, publish)": (
            data["parent_outside_stages"]
        ),
        "worker process outside its stages (start-up: interpreter, imports)": (
            data["worker_outside_jobs"]
        ),
    }
    for what, cpu in rest.items():
        total += cpu
        print(f"  {cpu:6.2f}  {what}")
    print(f"  {total:6.2f}  in all")
    html = sum(r["parent"] + r["worker"] for r in data["stages"] if r["stage"] == "html")
    print(f"  the page (html stage): {html:.2f} s, {html / total:.1%} of the build's CPU")


def compare(
    name: str,
    rounds: int,
    edgeflow_command: list[str],
    reference_command: list[str],
    cwd: Path,
    fresh: dict[str, Path],
) -> dict[str, list[float]]:
    """Cold edgeflow builds and reference runs, alternating; each in fresh folders."""
    figures: dict[str, list[float]] = {"edgeflow": [], "reference": [], "edgeflow_wall": []}
    for i in range(rounds):
        cache, build, out = (fresh[k] / f"{name}{i}" for k in ("cache", "build", "out"))
        wall, cpu = measured([*edgeflow_command, f"cache_dir={cache}", f"build_dir={build}"], cwd)
        figures["edgeflow"].append(cpu)
        figures["edgeflow_wall"].append(wall)
        figures["reference"].append(measured([*reference_command, str(out)], cwd)[1])
        print(
            f"  {name} round {i + 1}/{rounds}: edgeflow {cpu:.2f} s CPU, "
            f"reference {figures['reference'][-1]:.2f} s CPU",
            flush=True,
        )
    return figures


def coverage_work(folder: Path, model: str) -> Path:
    """A work folder with the coverage benchmark's recipe for `model`, as int8 with no
    threshold (as benchmarks/coverage.py runs int8), and its 8 MiB tflite_micro board."""
    sys.path.insert(0, str(BENCH))
    from coverage import BOARD, recipe_text

    text = recipe_text(model, 128)
    text = text.replace("quantization: {mode: none}", "quantization: {mode: int8}")
    text = text.replace("target: tflite\n", "target: tflite_micro\n")
    text = text.replace("  max_relative_diff: 0.001\n", "")
    folder.mkdir(parents=True)
    (folder / "targets").mkdir()
    (folder / "targets" / "tflite_micro.yaml").write_text(BOARD)
    recipe = folder / f"{model}.yaml"
    recipe.write_text(text)
    return recipe


def summarize(name: str, figures: dict[str, list[float]]) -> bool:
    e, r = statistics.median(figures["edgeflow"]), statistics.median(figures["reference"])
    ratio = e / r
    n = len(figures["edgeflow"])
    print(
        f"{name:<40}: edgeflow {e:6.2f} s CPU, reference {r:6.2f} s CPU, "
        f"ratio {ratio:.2f} (medians of {n}; goal <= {GOAL_RATIO})"
    )
    return ratio <= GOAL_RATIO


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold-runs", type=int, default=3)
    parser.add_argument("--warm-runs", type=int, default=5)
    parser.add_argument("--help-runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="reference comparisons per case")
    parser.add_argument("--cases", default="digits,coverage")
    parser.add_argument("--coverage-model", default="resnet18")
    parser.add_argument("--no-breakdown", action="store_true")
    parser.add_argument(
        "--omp-passive",
        action="store_true",
        help="OMP_WAIT_POLICY=PASSIVE for edgeflow and the references alike: on a machine "
        "whose other core is busy, torch's OpenMP threads otherwise spin at every small op "
        "(the same script took 5 s or 28 s of CPU here)",
    )
    args = parser.parse_args()
    if args.omp_passive:
        ENV["OMP_WAIT_POLICY"] = "PASSIVE"
    cases = set(args.cases.split(","))
    goals: dict[str, bool] = {}
    results: list[tuple[str, dict[str, list[float]]]] = []
    breakdowns: list[tuple[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="edgeflow-timings-") as tmp:
        root = Path(tmp)
        fresh = {k: root / k for k in ("cache", "build", "out")}
        build = f"build_dir={root}/build"
        cold = [
            edgeflow([*RUN, f"cache_dir={root}/cold{i}", build])[0] for i in range(args.cold_runs)
        ]
        warm_cache = f"cache_dir={root}/cold0"
        warm = [edgeflow([*RUN, warm_cache, build])[0] for _ in range(args.warm_runs)]
        whole = []
        for _ in range(args.warm_runs):
            for stamp in (root / "cold0" / "runs").glob("*.json"):
                stamp.unlink()
            whole.append(edgeflow([*RUN, warm_cache, build])[0])
        helps = [edgeflow(["--help"])[0] for _ in range(args.help_runs)]
        if "digits" in cases:
            name = "digits_cnn, onnxruntime_micro int8"
            reference = [sys.executable, str(BENCH / "_reference" / "digits_ort_int8.py")]
            command = [sys.executable, "-m", "edgeflow", *RUN]
            results.append((name, compare("digits", args.rounds, command, reference, REPO, fresh)))
            if not args.no_breakdown:
                extra = [f"cache_dir={root}/stages-digits", f"build_dir={root}/stages-build"]
                breakdowns.append((name, stage_breakdown([*RUN, *extra], REPO)))
        if "coverage" in cases and importlib.util.find_spec("torchvision") is None:
            print("coverage case skipped: torchvision is not installed (see docs/coverage.md)")
        elif "coverage" in cases:
            model = args.coverage_model
            name = f"{model} 128x128, tflite_micro int8"
            work = root / "coverage"
            recipe = coverage_work(work, model)
            run = ["run", f"recipe={recipe.name}"]
            reference = [sys.executable, str(BENCH / "_reference" / "coverage_tflm_int8.py")]
            reference_model = [*reference, "--model", model]
            command = [sys.executable, "-m", "edgeflow", *run]
            results.append(
                (name, compare("coverage", args.rounds, command, reference_model, work, fresh))
            )
            if not args.no_breakdown:
                extra = [f"cache_dir={root}/stages-cov", f"build_dir={root}/stages-build"]
                breakdowns.append((name, stage_breakdown([*run, *extra], work)))
    c, w, h = statistics.median(cold), statistics.median(warm), statistics.median(helps)
    wh = statistics.median(whole)
    print()
    print(f"cold run of the demo     : {c:6.2f} s  (median of {len(cold)})")
    print(f"warm (cached) re-run     : {w:6.2f} s  (median of {len(warm)}; {w / c:.1%} of cold)")
    print(f"  without its stamp      : {wh:6.2f} s  (median of {len(whole)}; {wh / c:.1%} of cold)")
    print(f"edgeflow --help          : {h:6.2f} s  (median of {len(helps)})")
    goals.update(
        {"warm < 2 s": w < 2.0, "warm <= 5% of cold": w <= 0.05 * c, "--help < 0.2 s": h < 0.2}
    )
    print()
    for name, figures in results:
        goals[f"CPU ratio <= {GOAL_RATIO}: {name}"] = summarize(name, figures)
    for name, data in breakdowns:
        print_breakdown(name, data)
    print()
    for goal, met in goals.items():
        print(f"goal {goal:<55}: {'met' if met else 'MISSED'}")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
