"""The concurrent part: builds started at once on one fresh cache, then a cached rerun."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .common import (
    EXAMPLES,
    Ran,
    Row,
    Settings,
    below_acceptance,
    collect,
    edgeflow_env,
    error_line,
    first_lines,
    new_tag,
    reap_tagged,
    run_edgeflow,
    say,
    start_edgeflow,
    wait_or_kill,
)
from .demo import demo_args, inspect_cache, read_events


def tflite_available(s: Settings) -> bool:
    """Whether the TFLite toolchain (onnx2tf, ai_edge_litert) imports here."""
    code = "import onnx2tf, ai_edge_litert"
    env = edgeflow_env(s.repo, new_tag())
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, timeout=300, check=False
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def concurrent_jobs(count: int, tflite: bool) -> list[tuple[str, str]]:
    """(target, quantization) per process: several on the demo build, the rest different."""
    tflite_jobs = [("tflite", "int8"), ("tflite", "none")] if tflite else []
    others = [("onnxruntime_micro", "none"), *tflite_jobs[:1], ("onnxruntime_micro", "fp16")]
    others += [("onnxruntime_micro", "int8_per_tensor"), *tflite_jobs[1:]]
    others += [] if tflite else [("onnxruntime_micro", "int8_symmetric")]
    same = max(2, count - len(others))
    return [("onnxruntime_micro", "int8")] * same + others[: max(0, count - same)]


def part_concurrent(s: Settings) -> list[Row]:
    """Builds started at once on one fresh cache: each upstream stage computed once."""
    root = s.work / "concurrent"
    cache, build = root / "cache", root / "build"
    jobs = concurrent_jobs(s.args.concurrent, tflite_available(s))
    say(f"concurrent: {len(jobs)} builds at once: {jobs}")
    started = []
    for i, (target, preset) in enumerate(jobs):
        tag = new_tag()
        args = demo_args(s, cache, build, (f"target={target}", f"quantization={preset}"))
        folder = root / f"job{i}"
        started.append((start_edgeflow(s, args, folder, tag), folder, tag, time.perf_counter()))
    results = [wait_for(s, *job) for job in started]
    time.sleep(1)
    left = reap_tagged({r.tag for r in results}, "edgeflow")
    rerun = run_edgeflow(s, demo_args(s, cache, build), root / "rerun", s.args.timeout)
    return [concurrent_row(s, jobs, results, rerun, cache, build, left)]


def wait_for(s: Settings, proc: subprocess.Popen[str], folder: Path, tag: str, start: float) -> Ran:
    """Wait for one of the concurrent builds (killed at the timeout)."""
    wait_or_kill(proc, max(1.0, s.args.timeout - (time.perf_counter() - start)))
    return collect(proc, folder, start, tag)


def concurrent_row(
    s: Settings,
    jobs: list[tuple[str, str]],
    results: list[Ran],
    rerun: Ran,
    cache: Path,
    build: Path,
    left: int,
) -> Row:
    """The concurrent line: exits, how often load/rewrite/export ran, entries, the rerun."""
    events = read_events(cache)
    ran = Counter(e.get("stage") for e in events if e.get("event") == "ran")
    per_key = Counter((e.get("stage"), e.get("key")) for e in events if e.get("event") == "ran")
    duplicates = sum(n - 1 for n in per_key.values() if n > 1)
    state = inspect_cache(cache, build)
    cached = rerun.code == 0 and "nothing to do" in rerun.out and "verified" in rerun.out
    failed = [(job, r) for job, r in zip(jobs, results, strict=True) if r.code != 0]
    figures: dict[str, Any] = {
        "exit 0": f"{len(results) - len(failed)}/{len(results)}",
        **{f"{stage} ran": ran[stage] for stage in ("load", "rewrite", "export")},
        "stage keys computed twice": duplicates,
        "entries without metadata": state["entries without metadata"],
        "temporary left": state["temporary folders"],
        "rerun cached+verified": cached,
        "processes left": left,
    }
    for job, r in failed[:EXAMPLES]:
        say(f"  concurrent {job}: exit {r.code}: {error_line(r)}")
    if not cached:
        say(f"  concurrent rerun (exit {rerun.code}):\n    {first_lines(rerun.text, 14)}")
    passed = (
        not failed
        and all(ran[stage] == 1 for stage in ("load", "rewrite", "export"))
        and state["entries without metadata"] == 0
        and cached
        and left == 0
    )
    details = {
        "jobs": [f"{t} {q}" for t, q in jobs],
        "exits": [r.code for r in results],
        "ran_per_stage": dict(ran),
        "processes_left": left,
        "seconds": max((r.seconds for r in results), default=0.0),
    }
    size = f"{len(jobs)} builds at once"
    return Row(
        "concurrent", size, figures, passed, below_acceptance("concurrent", len(jobs)), details
    )
