"""A content-addressed stage cache with atomic writes and one file lock per key.

An entry is the folder `<root>/<stage>/<key[:2]>/<key>/`. It appears by a single rename of a
fully written temporary folder, so its existence means it is complete; a failed stage leaves
nothing behind. Concurrent processes that need the same key serialise on `<root>/locks/<key>`:
the second one finds the finished entry after the first releases the lock.

Every lookup is also appended to `<root>/events.jsonl` (one short line, written with
O_APPEND, so processes sharing the cache do not interleave), so that what a sweep ran and
reused can be counted afterwards from the cache itself (`Cache.events`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

DEFAULT_ROOT = Path(".edgeflow/cache")


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    ran: list[str] = field(default_factory=list)


class Cache:
    def __init__(self, root: Path = DEFAULT_ROOT) -> None:
        self.root = Path(root)
        self.stats = CacheStats()

    def entry(self, stage: str, key: str) -> Path:
        return self.root / stage / key[:2] / key

    def get_or_create(
        self, stage: str, key: str, produce: Callable[[Path], None], meta: dict[str, object]
    ) -> tuple[Path, bool]:
        """The entry for `key`, made by `produce(tmp_dir)` if absent; returns (dir, was_cached)."""
        final = self.entry(stage, key)
        if final.is_dir():
            return self._hit(stage, key, final)
        (self.root / "locks").mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.root / "locks" / f"{key}.lock")):
            if final.is_dir():
                return self._hit(stage, key, final)
            tmp = self.root / "tmp" / f"{stage}-{key[:16]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir(parents=True)
            try:
                start = time.perf_counter()
                produce(tmp)
                meta = {**meta, "stage": stage, "key": key, "seconds": time.perf_counter() - start}
                (tmp / ".edgeflow-entry.json").write_text(json.dumps(meta, indent=2) + "\n")
                final.parent.mkdir(parents=True, exist_ok=True)
                os.rename(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        self.stats.misses += 1
        self.stats.ran.append(stage)
        self._log(stage, key, "ran")
        return final, False

    def _hit(self, stage: str, key: str, final: Path) -> tuple[Path, bool]:
        self.stats.hits += 1
        self._log(stage, key, "hit")
        return final, True

    def _log(self, stage: str, key: str, event: str) -> None:
        line = json.dumps({"stage": stage, "key": key[:16], "event": event, "pid": os.getpid()})
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def events(self) -> Counter[tuple[str, str]]:
        """(stage, "ran" | "hit") -> how often, over every process that used this cache."""
        path = self.root / "events.jsonl"
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
        return Counter((e["stage"], e["event"]) for e in map(json.loads, lines))
