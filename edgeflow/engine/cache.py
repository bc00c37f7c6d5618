"""A content-addressed stage cache with atomic writes and one file lock per key.

An entry is the folder `<root>/<stage>/<key[:2]>/<key>/`. It appears by a single rename of a
fully written temporary folder, so its existence means it is complete; a failed stage leaves
nothing behind. Concurrent processes that need the same key serialise on `<root>/locks/<key>`:
the second one finds the finished entry after the first releases the lock.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
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
            self.stats.hits += 1
            return final, True
        (self.root / "locks").mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.root / "locks" / f"{key}.lock")):
            if final.is_dir():
                self.stats.hits += 1
                return final, True
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
        return final, False
