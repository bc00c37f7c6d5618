"""The ownership part: user folders and files beside the cache's and the build's own must
survive any number of runs, kills and sweeps; a symlinked cache_dir touches nothing else."""

from __future__ import annotations

import hashlib
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

from .common import (
    Row,
    Settings,
    error_line,
    new_tag,
    reap_tagged,
    run_edgeflow,
    say,
    start_edgeflow,
    wait_or_kill,
)
from .demo import DEMO_BUILD, demo_args, reference

KEY16 = "0123456789abcdef"
# (folder relative to the part's root, name, "dir" | "file"): a user's things beside edgeflow's
# own, named like them where that is the trap. `build` is build_dir; the build folder itself is
# build/digits_cnn/onnxruntime_micro-int8, its parent build/digits_cnn.
PLANTED: tuple[tuple[str, str, str], ...] = (
    ("cache/tmp", "my-photos-2023-summer", "dir"),
    ("cache/tmp", f"load-{KEY16}-999999-deadbeef", "dir"),  # a temp folder's shape, dead pid
    ("cache/tmp", f"export-{KEY16}-1-abcdef12", "dir"),  # pid 1: alive, not edgeflow
    ("cache/tmp", f"quantize-{KEY16}-999998-discard0badf00d", "dir"),  # a discard's shape
    ("cache/tmp", "a-b-c-d-e-f", "dir"),
    ("cache/tmp", "notes-2023-06-01.txt", "file"),
    ("cache/tmp", "plain", "dir"),
    ("cache/failed", f"export-{KEY16}", "dir"),  # a kept failure's shape
    ("cache/failed", "my-failed-experiments", "dir"),
    ("cache/failed", "README.txt", "file"),
    ("cache/locks", "mine.lock", "file"),
    ("cache/locks", f"{KEY16}.lock", "file"),
    ("cache/locks", "my-locks", "dir"),
    ("cache", "my-notes", "dir"),
    ("cache", "notes.txt", "file"),
    ("build", ".digits_cnn.tmp-1", "dir"),
    ("build", ".digits_cnn.tmp-999999", "dir"),
    ("build", ".digits_cnn.old-99999", "dir"),
    ("build", "notes.txt", "file"),
    ("build/digits_cnn", ".onnxruntime_micro-int8.old-99999", "dir"),
    ("build/digits_cnn", ".onnxruntime_micro-int8.tmp-99999", "dir"),
    ("build/digits_cnn", ".x.work-1-abc", "dir"),
    ("build/digits_cnn", "my-results.txt", "file"),
    ("build/digits_cnn", "onnxruntime_micro-fp16-mine", "dir"),
    (".", ".build.tmp-1", "dir"),  # beside build_dir itself
    (".", ".build.old-42", "dir"),
)
# symlinks to the outside folder, named like edgeflow's own (a sweep must not follow them)
LINKS: tuple[tuple[str, str], ...] = (
    ("cache/tmp", f"rewrite-{KEY16}-999997-0badf00d"),
    ("cache/tmp", "link-to-my-data"),
    ("cache/failed", f"load-{KEY16}"),
    ("build/digits_cnn", ".onnxruntime_micro-int8.old-99998"),
    ("build", ".digits_cnn.tmp-999998"),
)


def plant(root: Path) -> dict[Path, str]:
    """Create the user's things (a file with unique content in each folder); their paths and
    contents, to find again."""
    planted: dict[Path, str] = {}
    for where, name, kind in PLANTED:
        path = root / where / name
        path.parent.mkdir(parents=True, exist_ok=True)
        content = f"user data {where}/{name} {random.random()}\n"
        if kind == "dir":
            path.mkdir()
            path = path / "photo.jpg"
        path.write_text(content)
        planted[path] = content
    return planted


def make_outside(root: Path) -> dict[Path, str]:
    """A folder outside the cache and the build, with files: the symlinks point to it."""
    outside = root / "outside"
    (outside / "deep").mkdir(parents=True)
    files = {outside / "a.txt": "outside a\n", outside / "deep" / "b.txt": "outside b\n"}
    for path, content in files.items():
        path.write_text(content)
    for where, name in LINKS:
        (root / where).mkdir(parents=True, exist_ok=True)
        (root / where / name).symlink_to(outside, target_is_directory=True)
    return files


def lost(files: dict[Path, str]) -> list[Path]:
    """The files gone or changed."""
    return [p for p, text in files.items() if not p.is_file() or p.read_text() != text]


def tree_digest(folder: Path) -> str:
    """Names and contents of everything under a folder (to tell it was not touched)."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        h.update(str(p.relative_to(folder)).encode())
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    return h.hexdigest()


def forget_stage_entries(cache: Path) -> None:
    """Delete the cache's stage folders (those holding `xx` key folders) so the next build is
    cold; the user's folders and the cache's own folders stay."""
    for child in cache.iterdir() if cache.is_dir() else []:
        stage = child.is_dir() and not child.is_symlink()
        if stage and any(re.fullmatch(r"[0-9a-f]{2}", c.name) for c in child.iterdir()):
            shutil.rmtree(child)


def part_ownership(s: Settings) -> list[Row]:
    """Plant user things, run the demo `--ownership` times on that cache (every third run
    SIGKILLed at a random moment of a cold build), count what was lost; then a cache_dir
    that is a symlink."""
    ref = reference(s)
    root = s.work / "ownership"
    root.mkdir(parents=True)
    planted = plant(root)
    outside = make_outside(root)
    outside_digest = tree_digest(root / "outside")
    cache, build = root / "cache", root / "build"
    rng = random.Random(3)
    tags: set[str] = set()
    codes: list[int | None] = []
    kills = 0
    for i in range(s.args.ownership):
        if i % 3 == 2:
            forget_stage_entries(cache)
            tag = new_tag()
            proc = start_edgeflow(s, demo_args(s, cache, build), root / f"run{i:02d}", tag)
            tags.add(tag)
            finished = wait_or_kill(proc, rng.uniform(0.2, ref.seconds))
            kills += not finished
            say(f"ownership run {i + 1}: {'killed' if not finished else 'finished'}")
            continue
        ran = run_edgeflow(s, demo_args(s, cache, build), root / f"run{i:02d}", s.args.timeout)
        codes.append(ran.code)
        say(
            f"ownership run {i + 1}: exit {ran.code} ({ran.seconds:.1f} s), user files lost "
            f"{len(lost(planted))}"
        )
        if ran.code != 0:
            say(f"  {error_line(ran)}")
    time.sleep(0.5)
    reap_tagged(tags, "edgeflow")
    gone = lost(planted)
    touched = len(lost(outside)) + (tree_digest(root / "outside") != outside_digest)
    inside = inside_build_folder(s, root)
    symlinked = symlinked_cache(s, root)
    return [ownership_row(s, planted, gone, touched, codes, kills, inside), symlinked]


def inside_build_folder(s: Settings, root: Path) -> bool:
    """A user file put inside the published build folder, then a cached rerun: whether it is
    still there (reported, not judged: a publish replaces the build folder whole)."""
    folder = root / "build" / Path(*DEMO_BUILD)
    mine = folder / "my-own-notes.txt"
    if not folder.is_dir():
        return False
    mine.write_text("mine\n")
    run_edgeflow(s, demo_args(s, root / "cache", root / "build"), root / "inside", s.args.timeout)
    return mine.is_file()


def ownership_row(
    s: Settings,
    planted: dict[Path, str],
    gone: list[Path],
    touched: int,
    codes: list[int | None],
    kills: int,
    inside: bool,
) -> Row:
    """The ownership line: user things lost, outside files touched, runs that failed."""
    root = s.work / "ownership"
    for path in gone:
        say(f"  ownership: LOST {path.relative_to(root)}")
    figures: dict[str, Any] = {
        "user things lost": f"{len(gone)}/{len(planted)}",
        "outside files touched": touched,
        "runs exit 0": f"{sum(c == 0 for c in codes)}/{len(codes)}",
        "kills landed": kills,
        "user file inside the build folder kept": inside,
    }
    passed = not gone and touched == 0 and all(c == 0 for c in codes)
    details = {"lost": [str(p.relative_to(root)) for p in gone], "links": len(LINKS)}
    size = f"{len(planted)} user things + {len(LINKS)} links, {s.args.ownership} runs"
    note = "quick size, acceptance is 9" if s.args.ownership < 9 else ""
    return Row("ownership", size, figures, passed, note, details)


def symlinked_cache(s: Settings, root: Path) -> Row:
    """cache_dir a symlink to a folder holding user things (a tmp/ among them): exit 0 with
    nothing of it lost, or exit 2 with a message about the cache folder."""
    target = root / "symlink-target"
    things = {
        target / "tmp" / "my-photos-2023-summer" / "photo.jpg": "photo\n",
        target / "tmp" / f"load-{KEY16}-999999-deadbeef" / "x.txt": "x\n",
        target / "tmp" / "notes.txt": "notes\n",
        target / "important.txt": "important\n",
    }
    for path, text in things.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    link = root / "cache-link"
    link.symlink_to(target, target_is_directory=True)
    ran = run_edgeflow(s, demo_args(s, link, root / "build-link"), root / "link", s.args.timeout)
    gone = lost(things)
    clear = ran.code == 2 and ("cache" in ran.text and "symlink" in ran.text.lower())
    outcome = "followed" if ran.code == 0 and not gone else "refused" if clear else "wrong"
    for path in gone:
        say(f"  ownership (symlinked cache_dir): LOST {path.relative_to(root)}")
    if outcome == "wrong":
        say(f"  ownership (symlinked cache_dir): exit {ran.code}: {error_line(ran)}")
    figures = {"exit": ran.code, "user files lost": f"{len(gone)}/{len(things)}", "way": outcome}
    details = {"message": error_line(ran)}
    return Row("ownership symlinked cache_dir", "1 run", figures, outcome != "wrong", "", details)
