"""A content-addressed stage cache: atomic, checked entries and one lock per key stripe.

An entry is the folder `<root>/<stage>/<key[:2]>/<key>/`. It appears by a single rename of a
fully written temporary folder (`<root>/tmp/`), and records the size and sha256 of each of its
files in `.edgeflow-entry.json`. Every hit checks them: an entry with a file missing, truncated,
changed or added is discarded with a warning and computed again, never served.

Concurrent processes that need the same key serialise on `<root>/locks/<key[:2]>.lock` (256
lock files at most, never deleted, so no lock can go stale: the operating system releases
the lock of a killed process). The same lock tells whether a temporary folder is still being
written; those of dead processes are removed by the next run (`sweep`).

A stage that fails with a bug in edgeflow (an InternalError) or a native crash leaves its
partial output and the full traceback in `<root>/failed/<stage>-<key[:16]>/`.

Every lookup is also appended to `<root>/events.jsonl` (one short line, written with
O_APPEND, so processes sharing the cache do not interleave), so that what a sweep ran and
reused can be counted afterwards from the cache itself (`Cache.events`). A read-only cache
(a team's shared one) serves hits and logs nothing; a miss there is a clear error.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from edgeflow.core.errors import EdgeflowError, InternalError, StageCrashed

DEFAULT_ROOT = Path(".edgeflow/cache")
ENTRY_FILE = ".edgeflow-entry.json"
# Write errors that are the machine's state, not a bug: reported with the folder's name.
ENVIRONMENT_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    ran: list[str] = field(default_factory=list)
    discarded: list[str] = field(default_factory=list)


def _stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


class Cache:
    def __init__(self, root: Path = DEFAULT_ROOT, warn: Callable[[str], None] = _stderr) -> None:
        self.root = Path(root)
        self.stats = CacheStats()
        self.warn = warn

    def entry(self, stage: str, key: str) -> Path:
        return self.root / stage / key[:2] / key

    def writable(self) -> bool:
        """Whether new entries can be written: the root (or its nearest existing parent)."""
        path = self.root.absolute()
        while not path.exists() and path != path.parent:
            path = path.parent
        return os.access(path, os.W_OK)

    def get_or_create(
        self, stage: str, key: str, produce: Callable[[Path], None], meta: dict[str, object]
    ) -> tuple[Path, bool]:
        """The entry for `key`, made by `produce(tmp_dir)` if absent or damaged; returns
        (dir, was_cached)."""
        final = self.entry(stage, key)
        damage = check_entry(final) if final.is_dir() else None
        if final.is_dir() and damage is None:
            return self._hit(stage, key, final)
        if not self.writable():
            what = f"a damaged entry ({damage})" if damage else "no entry"
            raise EdgeflowError(
                f"the cache {self.root} is read-only and has {what} for stage '{stage}'",
                f"run with a writable cache (cache_dir=PATH); {self.root} itself stays as it is",
            )
        try:
            with self._lock(key):
                if final.is_dir():
                    damage = check_entry(final)
                    if damage is None:
                        return self._hit(stage, key, final)
                    self.warn(
                        f"cache entry {final} of stage '{stage}' is damaged ({damage}): "
                        "discarded and computed again"
                    )
                    self.stats.discarded.append(stage)
                    self._log(stage, key, "discarded")
                    self._discard(final, stage, key)
                self._produce(stage, key, produce, meta, final)
        except OSError as exc:
            if exc.errno not in ENVIRONMENT_ERRNOS:
                raise
            raise EdgeflowError(
                f"cannot write the cache {self.root}: {exc.strerror} ({exc.filename})",
                "point cache_dir at a writable folder with free space",
            ) from exc
        self.stats.misses += 1
        self.stats.ran.append(stage)
        self._log(stage, key, "ran")
        return final, False

    def _produce(
        self,
        stage: str,
        key: str,
        produce: Callable[[Path], None],
        meta: dict[str, object],
        final: Path,
    ) -> None:
        tmp = self.root / "tmp" / f"{stage}-{key[:16]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            start = time.perf_counter()
            produce(tmp)
            meta = {**meta, "stage": stage, "key": key, "seconds": time.perf_counter() - start}
            meta["files"] = file_manifest(tmp)
            (tmp / ENTRY_FILE).write_text(json.dumps(meta, indent=2) + "\n")
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, final)
            except OSError as exc:  # another machine, where locks do not hold, was first
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or check_entry(final):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except (InternalError, StageCrashed) as exc:
            exc.details = self._keep_failed(tmp, stage, key)
            raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _keep_failed(self, tmp: Path, stage: str, key: str) -> Path:
        """Move a failed stage's folder to failed/ (the newest failure per stage and key)."""
        kept = self.root / "failed" / f"{stage}-{key[:16]}"
        kept.parent.mkdir(parents=True, exist_ok=True)
        if kept.exists():
            self._discard(kept, stage, key)
        os.rename(tmp, kept)
        return kept

    def _discard(self, folder: Path, stage: str, key: str) -> None:
        """Remove a folder by first renaming it into tmp/ (so a kill midway leaves only a
        temporary folder, which `sweep` removes)."""
        name = f"{stage}-{key[:16]}-{os.getpid()}-discard{uuid.uuid4().hex[:8]}"
        trash = self.root / "tmp" / name
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.rename(folder, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def _lock(self, key: str, timeout: float = -1) -> FileLock:
        (self.root / "locks").mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / "locks" / f"{key[:2]}.lock"), timeout=timeout)

    def sweep(self) -> list[Path]:
        """Remove temporary folders no live process is writing (left by a killed run): a
        folder is being written only while its writer holds the lock of its key's stripe."""
        tmp_root = self.root / "tmp"
        if not tmp_root.is_dir() or not self.writable():
            return []
        removed = []
        for folder in sorted(tmp_root.iterdir()):
            parts = folder.name.split("-")
            if len(parts) < 4 or parts[-2] == str(os.getpid()):
                continue  # not ours to judge, or this process's own
            key16 = parts[-3]
            try:
                with self._lock(key16, timeout=0):
                    shutil.rmtree(folder, ignore_errors=True)
            except Timeout:
                continue  # a live process holds the stripe: it may be writing this folder
            removed.append(folder)
        return removed

    def _hit(self, stage: str, key: str, final: Path) -> tuple[Path, bool]:
        self.stats.hits += 1
        self._log(stage, key, "hit")
        return final, True

    def _log(self, stage: str, key: str, event: str) -> None:
        if not self.writable():
            return  # a read-only (shared) cache: nothing to count into
        line = json.dumps({"stage": stage, "key": key[:16], "event": event, "pid": os.getpid()})
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def events(self) -> Counter[tuple[str, str]]:
        """(stage, "ran" | "hit" | "discarded") -> how often, over every process that used
        this cache."""
        path = self.root / "events.jsonl"
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
        return Counter((e["stage"], e["event"]) for e in map(json.loads, lines))


def file_manifest(folder: Path) -> dict[str, dict[str, object]]:
    """Relative path -> {size, sha256} of every file under `folder` but the entry record."""
    files = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and rel != ENTRY_FILE:
            files[rel] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    return files


def slot_digest(entry: Path, name: str) -> str:
    """A content hash of one output of an entry (a file, or a folder's files) from its record:
    what the next stage's key holds, so an identical output lets the rest stay cached."""
    record = json.loads((entry / ENTRY_FILE).read_text(encoding="utf-8"))
    files = {
        rel: info["sha256"]
        for rel, info in record["files"].items()
        if rel == name or rel.startswith(name + "/")
    }
    text = json.dumps(files, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def check_entry(folder: Path) -> str | None:
    """What is wrong with a cache entry (None: every file is as it was written)."""
    try:
        record = json.loads((folder / ENTRY_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{ENTRY_FILE} is missing"
    except (OSError, ValueError) as exc:
        return f"{ENTRY_FILE} is unreadable ({type(exc).__name__})"
    expected = record.get("files") if isinstance(record, dict) else None
    if not isinstance(expected, dict):
        return f"{ENTRY_FILE} has no file list (an older edgeflow wrote it)"
    for rel, want in expected.items():
        path = folder / rel
        if not path.is_file():
            return f"{rel} is missing"
        size = path.stat().st_size
        if size != want["size"]:
            return f"{rel} has {size:,} bytes, {want['size']:,} were written"
        if _sha256(path) != want["sha256"]:
            return f"{rel} was changed after it was written"
    extra = [
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.relative_to(folder).as_posix() not in (*expected, ENTRY_FILE)
    ]
    return f"{extra[0]} was added after it was written" if extra else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
