"""The stage cache: hits, atomic entries, failures that leave nothing, one producer per key."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from edgeflow.engine.cache import Cache


def _write(text: str):
    def produce(out: Path) -> None:
        (out / "result.txt").write_text(text)

    return produce


def test_second_lookup_is_a_hit(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    first, cached1 = cache.get_or_create("s", "k" * 64, _write("a"), {})
    second, cached2 = cache.get_or_create("s", "k" * 64, _write("b"), {})
    assert (cached1, cached2) == (False, True)
    assert first == second and (second / "result.txt").read_text() == "a"
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)


def test_failed_stage_leaves_nothing(tmp_path: Path) -> None:
    cache = Cache(tmp_path)

    def boom(out: Path) -> None:
        (out / "half-written").write_text("x")
        raise RuntimeError("tool crashed")

    with pytest.raises(RuntimeError):
        cache.get_or_create("s", "f" * 64, boom, {})
    assert not cache.entry("s", "f" * 64).exists()
    assert list((tmp_path / "tmp").iterdir()) == []
    _, cached = cache.get_or_create("s", "f" * 64, _write("ok"), {})
    assert cached is False


def _worker(root: str, log: str, barrier) -> None:
    def produce(out: Path) -> None:
        with open(log, "a") as f:
            f.write("produced\n")
        time.sleep(1.0)  # a slow stage: the other process must wait, not read a partial entry
        (out / "result.txt").write_text("done")

    barrier.wait()
    entry, _ = Cache(Path(root)).get_or_create("s", "c" * 64, produce, {})
    assert (entry / "result.txt").read_text() == "done"


def test_two_processes_one_key_produce_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    log = tmp_path / "log.txt"
    procs = [
        ctx.Process(target=_worker, args=(str(tmp_path / "c"), str(log), barrier)) for _ in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert log.read_text() == "produced\n"
