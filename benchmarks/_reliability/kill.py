"""The kill part: demo builds SIGKILLed at random moments on one cache, then a clean rerun."""

from __future__ import annotations

import random
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
    """SIGKILL cold builds at random moments on one cache; then a clean run must be right."""
    ref = reference(s)
    root = s.work / "kill"
    cache, build = root / "cache", root / "build"
    rng = random.Random(1)
    tags: set[str] = set()
    landed = 0
    for i in range(s.args.kills):
        delay = rng.uniform(0, ref.seconds)
        killed, tag = kill_at(s, demo_args(s, cache, build), root / f"run{i:03d}", delay)
        tags.add(tag)
        landed += killed
        say(f"kill {i + 1}/{s.args.kills}: at {delay:.1f} s, {'killed' if killed else 'done'}")
    time.sleep(1)
    survivors = reap_tagged(tags, "edgeflow")
    before = inspect_cache(cache, build)
    final = run_edgeflow(s, demo_args(s, cache, build), root / "final", s.args.timeout)
    time.sleep(1)
    after = inspect_cache(cache, build)
    left = reap_tagged({*tags, final.tag}, "edgeflow")
    return [kill_row(s, ref, final, before, after, landed, survivors + left)]


def kill_at(s: Settings, args: list[str], folder: Path, delay: float) -> tuple[bool, str]:
    """Start a build and SIGKILL its process group after `delay` s; (whether it was killed, tag)."""
    tag = new_tag()
    proc = start_edgeflow(s, args, folder, tag)
    return not wait_or_kill(proc, delay), tag


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
    size = f"{s.args.kills} kills ({landed} landed)"
    return Row("kill", size, figures, passed, below_acceptance("kills", s.args.kills), details)
