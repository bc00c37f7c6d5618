"""The kill part: demo builds SIGKILLed at random moments on one cache, then a clean rerun."""

from __future__ import annotations

import random
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .common import (
    Ran,
    Reference,
    Row,
    Settings,
    below_acceptance,
    first_lines,
    new_tag,
    reap_tagged,
    run_edgeflow,
    say,
    start_edgeflow,
    wait_or_kill,
)
from .demo import (
    CACHE_FOLDERS,
    artifact_of,
    clean_builds_identical,
    demo_args,
    failed_folders,
    inspect_cache,
    read_events,
    reference,
    slowest_cached_stage,
)


def part_kill(s: Settings) -> list[Row]:
    """SIGKILL cold builds at random moments on one cache until `--kills` kills have landed
    while a build was running; then a clean run on that cache must be right.

    Each build is cold: the complete entries of the builds before it are deleted first (as
    deleting cache entries always may be), while everything a kill leaves behind stays: the
    temporary folders, the lock files, the failed/ folders, the events log, and the build
    folder. So every kill lands while stages are writing entries, on the debris of the kills
    before it."""
    ref = reference(s)
    root = s.work / "kill"
    cache, build = root / "cache", root / "build"
    rng = random.Random(1)
    tags: set[str] = set()
    landed = tries = 0
    while landed < s.args.kills and tries < 4 * s.args.kills:
        forget_entries(cache)
        delay = rng.uniform(0, ref.seconds)
        took, tag = kill_at(s, demo_args(s, cache, build), root / f"run{tries:03d}", delay)
        tags.add(tag)
        tries += 1
        landed += took is None
        what = "killed" if took is None else f"done after {took:.1f} s"
        say(f"kill {landed}/{s.args.kills} (try {tries}): at {delay:.1f} s, {what}")
    time.sleep(1)
    survivors = reap_tagged(tags, "edgeflow")
    before = inspect_cache(cache, build)
    final = run_edgeflow(s, demo_args(s, cache, build), root / "final", s.args.timeout)
    time.sleep(1)
    after = inspect_cache(cache, build)
    left = reap_tagged({*tags, final.tag}, "edgeflow")
    return [kill_row(s, ref, final, before, after, landed, survivors + left)]


def forget_entries(cache: Path) -> None:
    """Delete the cache's complete entries (the stage folders), keeping its own folders."""
    if not cache.is_dir():
        return
    for child in cache.iterdir():
        if child.is_dir() and child.name not in CACHE_FOLDERS:
            shutil.rmtree(child)


def kill_at(s: Settings, args: list[str], folder: Path, delay: float) -> tuple[float | None, str]:
    """Start a build and SIGKILL its process group after `delay` s: (None if it was killed,
    else the seconds it took; its tag)."""
    tag = new_tag()
    start = time.perf_counter()
    proc = start_edgeflow(s, args, folder, tag)
    finished = wait_or_kill(proc, delay)
    return (time.perf_counter() - start if finished else None), tag


def kill_row(
    s: Settings,
    ref: Reference,
    final: Ran,
    before: dict[str, int],
    after: dict[str, int],
    landed: int,
    left: int,
) -> Row:
    """The kill line: the clean rerun's verdict, its artifact, what is left in the cache."""
    artifact = artifact_of(s.work / "kill" / "build")
    same = artifact.is_file() and artifact.read_bytes() == ref.artifact
    waited = slowest_cached_stage(final.out)
    slow = final.seconds > 1.5 * ref.seconds + 10 or waited > 2.0
    figures: dict[str, Any] = {
        "rerun exit": final.code,
        "verified": final.code == 0 and "verified" in final.out,
        "model.ort identical": same,
        **({} if same else {"two clean builds identical": clean_builds_identical(s)}),
        **after,
        "lock wait": slow,
        "processes left": left,
    }
    passed = (
        final.code == 0
        and figures["verified"]
        and same
        and not any(after.values())
        and not slow
        and left == 0
    )
    if final.code != 0:
        say(f"\nkill: the clean rerun failed (exit {final.code}):\n  {first_lines(final.text, 8)}")
    say(f"\nkill: before the rerun: {before}; after: {after}")
    say(
        f"kill: rerun {final.seconds:.1f} s (cold {ref.seconds:.1f} s), slowest cached stage "
        f"{waited:.2f} s"
    )
    details = {
        "cold_seconds": ref.seconds,
        "rerun_seconds": final.seconds,
        "slowest_cached_stage_seconds": waited,
        "kills_landed": landed,
        "failed_stage_folders": failed_folders(s.work / "kill" / "cache"),
        "events": dict(Counter(e.get("event") for e in read_events(s.work / "kill" / "cache"))),
        "before_rerun": before,
        "rerun_output": first_lines(final.text, 20),
    }
    size = f"{landed} kills landed (of {s.args.kills} wanted)"
    return Row("kill", size, figures, passed, below_acceptance("kills", s.args.kills), details)
