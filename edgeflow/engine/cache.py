"""A content-addressed stage cache: atomic, checked entries and one lock per key stripe.

An entry is the folder `<root>/<stage>/<key[:2]>/<key>/`. It appears by a single rename of a
fully written temporary folder (in a holder in `<root>/tmp/`, edgeflow/engine/owned.py), and
records the size and sha256 of each of its files in `.edgeflow-entry.json`. Every hit checks
them: an entry with a file missing, truncated, changed or added, or a file where the entry's
folder should be, is discarded with a warning and computed again, never served.

Concurrent processes that need the same key serialise on `<root>/locks/<key[:2]>.lock` (256
lock files at most, never deleted, so no lock can go stale: the operating system releases
the lock of a killed process). The same lock tells whether a temporary folder is still being
written; those of dead processes are removed by the next run (`sweep`), and only those: a
folder in `tmp/` without edgeflow's ownership marker is never removed, whatever its name. The
cache folder may be a symbolic link (followed); its `tmp/` and `failed/` folders, where
edgeflow removes things, must be real folders inside it (a link there is refused, exit 2).

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
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from edgeflow.core.errors import EdgeflowError, InternalError, StageCrashed
from edgeflow.engine import owned

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
        self,
        stage: str,
        key: str,
        produce: Callable[[Path], None],
        meta: dict[str, object],
        stale: Callable[[Path], str | None] = lambda entry: None,
    ) -> tuple[Path, bool]:
        """The entry for `key`, made by `produce(tmp_dir)` if absent or damaged; returns
        (dir, was_cached). `stale(entry)` says what is wrong with a sound entry's records
        (an older edgeflow's): such an entry counts as damaged, and is made again."""
        final = self.entry(stage, key)
        present, damage = _state(final, stale)
        if present and damage is None:
            return self._hit(stage, key, final)
        if not self.writable():
            what = f"a damaged entry ({damage})" if damage else "no entry"
            raise EdgeflowError(
                f"the cache {self.root} is read-only and has {what} for stage '{stage}'",
                f"run with a writable cache (cache_dir=PATH); {self.root} itself stays as it is",
            )
        try:
            with self._lock(key):
                present, damage = _state(final, stale)
                if present and damage is None:
                    return self._hit(stage, key, final)
                if present:
                    self.warn(
                        f"cache entry {final} of stage '{stage}' is damaged ({damage}): "
                        "discarded and computed again"
                    )
                    self.stats.discarded.append(stage)
                    self._log(stage, key, "discarded")
                    self._discard(self._inside(final), stage, key)
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
        holder = self._holder(stage, key)
        tmp = holder / owned.CONTENT
        try:
            tmp.mkdir()
            start = time.perf_counter()
            produce(tmp)
            meta = {**meta, "stage": stage, "key": key, "seconds": time.perf_counter() - start}
            meta["files"] = file_manifest(tmp)
            (tmp / ENTRY_FILE).write_text(json.dumps(meta, indent=2) + "\n")
            self._entry_parent(final, stage, key)
            try:
                os.rename(tmp, final)
            except OSError as exc:  # another machine, where locks do not hold, was first
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or check_entry(final):
                    raise
        except (InternalError, StageCrashed) as exc:
            exc.details = self._keep_failed(tmp, stage, key)
            raise
        finally:
            owned.remove(holder, holder.parent)  # what is left of it: nothing, or a half

    def _keep_failed(self, tmp: Path, stage: str, key: str) -> Path:
        """Move a failed stage's folder to failed/ (the newest failure per stage and key),
        marked as edgeflow's, so that the next failure may replace it; a folder of that name
        that is not provably edgeflow's stays, and the failure gets a name of its own."""
        failed = self._own_folder("failed")
        kept = failed / f"{stage}-{key[:16]}"
        if owned.read(kept) is not None:
            self._discard(kept, stage, key)
        elif os.path.lexists(kept):
            kept = failed / f"{stage}-{key[:16]}-{uuid.uuid4().hex[:8]}"
        owned.mark(tmp, new_name=kept.name)
        os.rename(tmp, kept)
        return kept

    def _discard(self, path: Path, stage: str, key: str) -> None:
        """Remove a damaged entry (or a replaced failed/ folder) by first renaming it into a
        holder in tmp/ (so a kill midway leaves only a holder, which `sweep` removes)."""
        trash = self._holder(stage, key)
        os.rename(path, trash / owned.CONTENT)
        owned.remove(trash, trash.parent)

    def _holder(self, stage: str, key: str) -> Path:
        """A new temporary folder in tmp/, marked as this process's, under the key's stripe."""
        return owned.make(self._own_folder("tmp"), f"{stage}-{key[:16]}", stripe=key[:2])

    def _own_folder(self, name: str) -> Path:
        """`<root>/<name>` (tmp/, failed/), made if absent: edgeflow removes folders there, so
        it must be a real folder inside the cache, not a link out of it."""
        folder = self.root / name
        if not os.path.lexists(folder):
            folder.mkdir(parents=True, exist_ok=True)
        if folder.is_symlink() or not folder.is_dir():
            what = f"a symbolic link to {os.readlink(folder)}" if folder.is_symlink() else "a file"
            raise EdgeflowError(
                f"the cache's {name}/ folder {folder} is {what}; edgeflow removes its own "
                f"temporary folders there, so it must be a real folder inside the cache",
                f"remove {folder} (edgeflow makes the folder again), or set cache_dir=PATH "
                "to another folder",
            )
        return folder

    def _inside(self, entry: Path) -> Path:
        """An entry path to discard, checked to lie in the cache itself: a stage folder that is
        a link out of the cache is written through, but nothing is removed there."""
        real = os.path.join(os.path.realpath(self.root), *entry.relative_to(self.root).parts)
        if os.path.realpath(entry.parent) != os.path.dirname(real):
            raise EdgeflowError(
                f"the damaged cache entry {entry} lies behind a symbolic link out of the cache "
                f"({os.path.realpath(entry.parent)}); edgeflow removes nothing there",
                f"delete {entry} yourself, or set cache_dir=PATH to a folder without links",
            )
        return entry

    def _entry_parent(self, final: Path, stage: str, key: str) -> None:
        """Make `<root>/<stage>/<key[:2]>/`; a file in place of the key prefix's folder is
        damage of the cache's own (discarded with a warning), one in place of the stage's
        folder is refused."""
        prefix, stage_dir = final.parent, final.parent.parent
        if os.path.lexists(stage_dir) and not stage_dir.is_dir():
            raise EdgeflowError(
                f"{stage_dir} is a file where the cache keeps the entries of stage '{stage}'",
                f"move {stage_dir} out of the cache folder",
            )
        if os.path.lexists(prefix) and not prefix.is_dir():
            self.warn(f"cache folder {prefix} is a file, not a folder: discarded")
            self._discard(self._inside(prefix), stage, key)
        prefix.mkdir(parents=True, exist_ok=True)

    def _lock(self, key: str, timeout: float = -1) -> FileLock:
        (self.root / "locks").mkdir(parents=True, exist_ok=True)
        return owned.lock(self.root / "locks" / f"{key[:2]}.lock", timeout=timeout)

    def sweep(self) -> list[Path]:
        """Remove temporary folders no live process is writing (left by a killed run): a
        folder is being written only while its writer holds the lock of its key's stripe."""
        tmp_root = self.root / "tmp"
        if not os.path.lexists(tmp_root) or not self.writable():
            return []
        tmp_root = self._own_folder("tmp")  # a link out of the cache is refused
        removed = []
        for folder in sorted(tmp_root.iterdir()):
            owner = owned.read(folder)
            if owner is None or owner.mine() or not owner.dead():
                continue  # not provably edgeflow's, this process's own, or its writer lives
            lock = self._lock(owner.stripe, timeout=0) if owner.stripe else nullcontext()
            try:
                with lock:
                    gone = owned.remove(folder, tmp_root)
            except Timeout:
                continue  # a live process holds the stripe: it may be writing this folder
            if gone:
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


def _state(
    entry: Path, stale: Callable[[Path], str | None] = lambda entry: None
) -> tuple[bool, str | None]:
    """Whether something is at an entry's path, and what is wrong with it (None: sound)."""
    if entry.is_dir():
        return True, check_entry(entry) or stale(entry)
    if os.path.lexists(entry):
        return True, "a file, not a folder" if entry.is_file() else "not a folder"
    return False, None


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
