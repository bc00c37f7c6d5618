"""The digits demo build (one cold reference of it) and what builds leave in a cache."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .common import BenchError, Reference, Settings, error_line, run_args, run_edgeflow, say

DEMO = ("target=onnxruntime_micro", "quantization=int8")
DEMO_BUILD = ("digits_cnn", "onnxruntime_micro-int8")
CACHE_FOLDERS = ("tmp", "locks", "failed")  # the cache's own folders beside the stages


def demo_args(s: Settings, cache: Path, build: Path, extra: tuple[str, ...] = DEMO) -> list[str]:
    """`edgeflow run` of the digits demo (by path, so any working directory works)."""
    return run_args(s.repo / "recipes" / "digits_cnn.yaml", cache, build, extra)


def artifact_of(build: Path) -> Path:
    """The demo build's model.ort under a build_dir."""
    return build.joinpath(*DEMO_BUILD, "model.ort")


def reference(s: Settings) -> Reference:
    """One cold build of the demo in a fresh cache (made once per invocation)."""
    if s.reference is None:
        folder = s.work / "reference"
        say("reference: one cold build of the demo in a fresh cache ...")
        args = demo_args(s, folder / "cache", folder / "build")
        ran = run_edgeflow(s, args, folder, s.args.timeout)
        if ran.code != 0 or "verified" not in ran.out:
            raise BenchError(f"the reference build failed (exit {ran.code}): {error_line(ran)}")
        s.reference = Reference(ran.seconds, artifact_of(folder / "build").read_bytes())
        say(f"reference: cold build {ran.seconds:.1f} s")
    return s.reference


def clean_builds_identical(s: Settings) -> bool:
    """Whether a second cold build in a fresh cache gives the reference's model.ort again
    (if not, the conversion is not deterministic and no rerun can be byte-identical)."""
    folder = s.work / "reference2"
    ran = run_edgeflow(s, demo_args(s, folder / "cache", folder / "build"), folder, s.args.timeout)
    artifact = artifact_of(folder / "build")
    return ran.code == 0 and artifact.is_file() and artifact.read_bytes() == reference(s).artifact


# --------------------------------------------------------------------------- cache contents


def temporary_folders(cache: Path, build: Path) -> list[Path]:
    """Left-over temporary folders: CACHE/tmp/* and build .tmp-*/.old-* folders."""
    tmp = cache / "tmp"
    found = sorted(tmp.iterdir()) if tmp.is_dir() else []
    if build.is_dir():
        found += sorted(p for p in build.rglob(".*") if re.search(r"\.(tmp|old)-", p.name))
    return found


def cache_entries(cache: Path) -> Iterator[Path]:
    """Every entry folder `CACHE/<stage>/<xx>/<key>` (a key starting with its folder's xx)."""
    if not cache.is_dir():
        return
    for stage in sorted(p for p in cache.iterdir() if p.is_dir()):
        if stage.name in CACHE_FOLDERS:
            continue
        for prefix in sorted(p for p in stage.iterdir() if re.fullmatch(r"[0-9a-f]{2}", p.name)):
            yield from sorted(p for p in prefix.iterdir() if p.name.startswith(prefix.name))


def orphan_locks(cache: Path, complete: set[str]) -> int:
    """Lock files beyond the fixed set: a lock is a stripe (`xx.lock`, 256 at most) or the
    lock of a key whose entry is complete; any other lock file (or one elsewhere) is orphaned."""
    locks = sorted((cache / "locks").glob("*")) if (cache / "locks").is_dir() else []
    stems = [p.name.removesuffix(".lock") for p in locks]
    orphans = sum(not re.fullmatch(r"[0-9a-f]{2}", s) and s not in complete for s in stems)
    return orphans + sum(p.parent.name != "locks" for p in cache.rglob("*.lock"))


def inspect_cache(cache: Path, build: Path) -> dict[str, int]:
    """Counts of partial or orphaned things in a cache and a build folder."""
    entries = list(cache_entries(cache))
    complete = {e.name for e in entries if (e / ".edgeflow-entry.json").is_file()}
    build_locks = sorted(build.rglob(".*.lock")) if build.is_dir() else []
    return {
        "temporary folders": len(temporary_folders(cache, build)),
        "entries without metadata": len(entries) - len(complete),
        "orphan cache locks": orphan_locks(cache, complete),
        "orphan build locks": sum(
            not (p.parent / p.name[1:].removesuffix(".lock")).is_dir() for p in build_locks
        ),
        "corrupt event lines": corrupt_events(cache),
    }


def failed_folders(cache: Path) -> int:
    """Folders the cache keeps for failed stages (CACHE/failed/*): reported, not judged."""
    failed = cache / "failed"
    return sum(1 for _ in failed.iterdir()) if failed.is_dir() else 0


def read_events(cache: Path) -> list[dict[str, Any]]:
    """The cache's events log (one JSON object per lookup); unreadable lines are skipped."""
    path = cache / "events.jsonl"
    events = []
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return events


def corrupt_events(cache: Path) -> int:
    """Lines of the events log that are not one JSON object (a write cut short)."""
    path = cache / "events.jsonl"
    if not path.is_file():
        return 0
    lines = path.read_text(errors="replace").splitlines()
    return len(lines) - len(read_events(cache))


def slowest_cached_stage(out: str) -> float:
    """The longest time a stage reported as `cached` took: a cached stage waiting is a lock."""
    times = [float(m[1]) for m in re.finditer(r"^\s+\w+\s+cached\s+([\d.]+) s", out, re.M)]
    return max(times, default=0.0)
