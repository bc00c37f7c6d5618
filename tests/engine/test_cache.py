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


def _damage(kind: str, entry: Path) -> None:
    """One way a cache entry's files get damaged after they were written."""
    target = entry / "result.txt"
    if kind == "flipped":
        data = bytearray(target.read_bytes())
        data[0] ^= 0xFF
        target.write_bytes(bytes(data))
    elif kind == "truncated":
        target.write_bytes(target.read_bytes()[:1])
    elif kind == "emptied":
        target.write_bytes(b"")
    elif kind == "deleted":
        target.unlink()
    elif kind == "every file deleted":
        for path in entry.rglob("*"):
            if path.is_file():
                path.unlink()
    elif kind == "record deleted":
        (entry / ".edgeflow-entry.json").unlink()
    elif kind == "file added":
        (entry / "extra.bin").write_bytes(b"x")


DAMAGES = [
    "flipped",
    "truncated",
    "emptied",
    "deleted",
    "every file deleted",
    "record deleted",
    "file added",
]


@pytest.mark.parametrize("kind", DAMAGES)
def test_a_damaged_entry_is_recomputed_with_a_warning_never_served(
    kind: str, tmp_path: Path
) -> None:
    warnings: list[str] = []
    cache = Cache(tmp_path, warn=warnings.append)
    entry, _ = cache.get_or_create("s", "d" * 64, _write("good"), {})
    _damage(kind, entry)
    again, cached = cache.get_or_create("s", "d" * 64, _write("good"), {})
    assert cached is False and again == entry
    assert (again / "result.txt").read_text() == "good"
    assert not (again / "extra.bin").exists()
    [warning] = warnings
    assert warning.startswith(f"cache entry {entry} of stage 's' is damaged (")
    assert warning.endswith("): discarded and computed again")
    assert cache.stats.discarded == ["s"] and cache.events()[("s", "discarded")] == 1
    assert cache.get_or_create("s", "d" * 64, _write("other"), {})[1] is True  # sound again


def test_a_killed_runs_temporary_folders_are_swept_a_live_ones_kept(tmp_path: Path) -> None:
    from tests.engine.killed import holder_of_a_dead_process

    cache = Cache(tmp_path)
    (tmp_path / "tmp").mkdir()
    dead = holder_of_a_dead_process(tmp_path / "tmp", f"export-{'a' * 16}", "aa")
    (dead / "content").mkdir()
    (dead / "content" / ".job.pkl").write_bytes(b"partial")
    live = holder_of_a_dead_process(tmp_path / "tmp", f"convert-{'b' * 16}", "bb")
    with cache._lock("b" * 64):  # a producer of that key stripe is still at work
        assert cache.sweep() == [dead]
    assert not dead.exists() and live.exists()


def _fails(out: Path) -> None:
    from edgeflow.core.errors import InternalError

    (out / "partial.txt").write_text("half")
    raise InternalError("stage 'probe'", "ValueError: boom")


def test_a_bug_keeps_the_stages_folder_for_inspection(tmp_path: Path) -> None:
    from edgeflow.core.errors import InternalError

    cache = Cache(tmp_path)
    with pytest.raises(InternalError) as info:
        cache.get_or_create("probe", "e" * 64, _fails, {})
    kept = tmp_path / "failed" / f"probe-{'e' * 16}"
    assert info.value.details == kept and (kept / "partial.txt").read_text() == "half"
    assert not cache.entry("probe", "e" * 64).exists()
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.fixture
def read_only(tmp_path: Path):
    """A folder mounted read-only (a team's shared cache); skipped where mounts are refused."""
    import subprocess

    source, mounted = tmp_path / "rw", tmp_path / "ro"
    source.mkdir()
    mounted.mkdir()

    def mount(*args: str) -> bool:
        return subprocess.run(["mount", *args], capture_output=True, check=False).returncode == 0

    if not mount("--bind", str(source), str(mounted)):
        pytest.skip("cannot bind-mount here (needs root)")
    if not mount("-o", "remount,bind,ro", str(mounted)):
        subprocess.run(["umount", str(mounted)], check=False)
        pytest.skip("cannot remount read-only here")
    yield source, mounted
    subprocess.run(["umount", str(mounted)], check=False)


def test_a_read_only_cache_serves_hits_and_refuses_misses_clearly(read_only) -> None:
    from edgeflow.core.errors import EdgeflowError

    source, mounted = read_only
    Cache(source).get_or_create("s", "f" * 64, _write("shared"), {})
    shared = Cache(mounted)
    entry, cached = shared.get_or_create("s", "f" * 64, _write("never"), {})
    assert cached is True and (entry / "result.txt").read_text() == "shared"
    assert shared.events()[("s", "hit")] == 0  # nothing could be logged, and nothing failed
    with pytest.raises(EdgeflowError) as info:
        shared.get_or_create("s", "0" * 64, _write("new"), {})
    assert info.value.exit_code == 2
    assert f"the cache {mounted} is read-only and has no entry for stage 's'" in info.value.message


def test_a_writer_beaten_by_another_machine_uses_the_winners_entry(tmp_path: Path) -> None:
    """Where locks do not hold across machines (some network file systems), two writers can
    make one entry; the second rename fails, and the second writer takes the first's entry."""
    import json

    from edgeflow.engine.cache import ENTRY_FILE, file_manifest

    cache = Cache(tmp_path)
    final = cache.entry("s", "9" * 64)

    def produce(out: Path) -> None:
        (out / "result.txt").write_text("mine")
        final.mkdir(parents=True)  # meanwhile, the other machine finished the same entry
        (final / "result.txt").write_text("theirs")
        (final / ENTRY_FILE).write_text(json.dumps({"files": file_manifest(final)}))

    entry, cached = cache.get_or_create("s", "9" * 64, produce, {})
    assert entry == final and (entry / "result.txt").read_text() == "theirs" and not cached
    assert list((tmp_path / "tmp").iterdir()) == []
