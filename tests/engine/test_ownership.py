"""edgeflow removes only what it can prove it made: user files of every name shape beside the
cache's and the build's own folders survive runs, sweeps and kills; no link is followed out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgeflow.core.errors import EdgeflowError, InternalError
from edgeflow.engine import owned
from edgeflow.engine.cache import Cache
from edgeflow.engine.dvcstage import _sweep_work_folders
from edgeflow.engine.publish import publish
from tests.engine.killed import holder_of_a_dead_process

KEY = "ab" + "c" * 62
# names a user might give, and names shaped exactly as edgeflow's own (a dead pid in them)
USER_NAMES = [
    "my-photos-2023-summer",
    f"export-{KEY[:16]}-999999-deadbeef",
    f"s-{KEY[:16]}",  # what failed/ names a failure of stage s
    f"s-{KEY[:16]}-4194303-discard0",
    "x.tmp-123",
    ".name.old-999999",
    ".name.work-1-abc",
    ".t-none.tmp-12345",
    ".t-none.old-999999",
    ".t-none.old-999999-deadbeef",
    ".t-none.work-1-abcdef",
    "ab.lock",
]


def _user_things(folder: Path, names: list[str] = USER_NAMES) -> dict[Path, str]:
    """A folder (with a file in it) and a file of every name shape in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    made = {}
    for name in names:
        (folder / name).mkdir()
        (folder / name / "precious.txt").write_text(f"mine: {name}")
        made[folder / name / "precious.txt"] = f"mine: {name}"
        (folder / f"{name}.txt").write_text(name)
        made[folder / f"{name}.txt"] = name
    return made


def _intact(made: dict[Path, str]) -> None:
    lost = [str(p) for p, text in made.items() if not p.is_file() or p.read_text() != text]
    assert lost == []


def _write(text: str):
    def produce(out: Path) -> None:
        (out / "result.txt").write_text(text)

    return produce


def _fails(out: Path) -> None:
    (out / "partial.txt").write_text("half")
    raise InternalError("stage 's'", "ValueError: boom")


def test_a_marker_proves_only_the_folder_it_names(tmp_path: Path) -> None:
    holder = owned.make(tmp_path, "s-x", stripe="ab")
    owner = owned.read(holder)
    assert owner is not None and owner.mine() and not owner.dead() and owner.stripe == "ab"
    assert holder.name == f"s-x-{os.getpid()}-{owner.token[:8]}"
    copy = tmp_path / "my-copy"
    shutil.copytree(holder, copy)  # the marker copied along names another folder
    assert owned.read(copy) is None and not owned.remove(copy, tmp_path) and copy.is_dir()
    link = tmp_path / "link"
    link.symlink_to(holder)
    assert owned.read(link) is None and not owned.remove(link, tmp_path)
    (copy / owned.MARKER).unlink()
    (copy / owned.MARKER).symlink_to(holder / owned.MARKER)  # a marker that is a link
    assert owned.read(copy) is None
    (copy / owned.MARKER).unlink()
    (copy / owned.MARKER).write_text('{"pid": 1, "names": ["my-copy"]}')  # no token
    assert owned.read(copy) is None
    assert owned.remove(holder, tmp_path) and not holder.exists() and link.is_symlink()


def test_user_folders_in_the_caches_own_folders_survive_runs_failures_and_sweeps(
    tmp_path: Path,
) -> None:
    cache = Cache(tmp_path / "cache")
    made = {}
    for name in ("tmp", "failed"):
        made.update(_user_things(tmp_path / "cache" / name))
    made |= _user_things(tmp_path / "cache" / "locks", [n for n in USER_NAMES if n != "ab.lock"])
    (tmp_path / "cache" / "locks" / "ab.lock").write_text("a file of that name is used as is")
    made[tmp_path / "cache" / "locks" / "ab.lock"] = "a file of that name is used as is"
    for _ in range(3):
        cache.sweep()
        entry, _ = cache.get_or_create("t", KEY, _write("good"), {})
        (entry / "result.txt").write_text("changed")  # damaged: discarded, computed again
        for key in (KEY, "ab" + "d" * 62):
            with pytest.raises(InternalError) as info:
                cache.get_or_create("s", key, _fails, {})
            assert (info.value.details / "partial.txt").read_text() == "half"
    _intact(made)
    # a failure of KEY cannot take its usual name (a user's folder has it): it takes its own
    kept = [p.name for p in (tmp_path / "cache" / "failed").iterdir() if p.is_dir()]
    assert sorted(n for n in kept if n not in USER_NAMES) == sorted(
        [
            f"s-{'ab' + 'd' * 14}",
            *(n for n in kept if n.startswith(f"s-{KEY[:16]}-") and n not in USER_NAMES),
        ]
    )
    assert sum(n.startswith(f"s-{KEY[:16]}-") and n not in USER_NAMES for n in kept) == 3
    leftovers = [p.name for p in (tmp_path / "cache" / "tmp").iterdir()]
    assert sorted(leftovers) == sorted([*USER_NAMES, *(f"{n}.txt" for n in USER_NAMES)])


def test_a_failure_replaces_edgeflows_failed_folder_but_not_a_users(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    failed = tmp_path / "failed" / f"s-{KEY[:16]}"
    for _ in range(2):  # the second failure replaces the first's folder
        with pytest.raises(InternalError) as info:
            cache.get_or_create("s", KEY, _fails, {})
        assert info.value.details == failed
    assert [p.name for p in failed.parent.iterdir()] == [failed.name]
    shutil.rmtree(failed)
    failed.mkdir()  # the user's folder of that very name
    (failed / "notes.txt").write_text("mine")
    with pytest.raises(InternalError) as info:
        cache.get_or_create("s", KEY, _fails, {})
    assert info.value.details.name.startswith(f"{failed.name}-")
    assert (info.value.details / "partial.txt").read_text() == "half"
    assert sorted(p.name for p in failed.iterdir()) == ["notes.txt"]


def test_a_killed_writers_holder_is_swept_an_unmarked_one_never(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    (tmp_path / "tmp").mkdir()
    killed = holder_of_a_dead_process(tmp_path / "tmp", f"export-{KEY[:16]}", KEY[:2])
    (killed / "content").mkdir()
    (killed / "content" / "model.onnx").write_bytes(b"half")
    unmarked = tmp_path / "tmp" / f"export-{KEY[:16]}-999999-deadbeef"  # the same shape
    shutil.copytree(killed, unmarked)  # even with a (copied) marker that names another folder
    (unmarked / "content" / "model.onnx").write_bytes(b"mine")
    assert cache.sweep() == [killed]
    assert not killed.exists() and (unmarked / "content" / "model.onnx").read_bytes() == b"mine"
    assert cache.sweep() == []


def test_a_link_in_tmp_is_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "photos"
    made = _user_things(outside)
    dead = holder_of_a_dead_process(tmp_path, f"export-{KEY[:16]}", KEY[:2])
    (tmp_path / "cache" / "tmp").mkdir(parents=True)
    # a link named as a dead holder, to a folder with a marker that names the link
    link = tmp_path / "cache" / "tmp" / dead.name
    shutil.move(dead, outside / dead.name)
    link.symlink_to(outside / dead.name)
    (tmp_path / "cache" / "tmp" / "photos").symlink_to(outside)
    cache = Cache(tmp_path / "cache")
    assert cache.sweep() == []
    cache.get_or_create("s", KEY, _write("good"), {})
    _intact(made)
    assert (outside / dead.name / owned.MARKER).is_file() and link.is_symlink()


def test_a_cache_dir_that_is_a_link_is_followed_and_only_edgeflows_folders_go(
    tmp_path: Path,
) -> None:
    """cache_dir=/some/link -> /var: edgeflow writes there, and removes only its holders."""
    var = tmp_path / "var"
    made = _user_things(var / "tmp")
    killed = holder_of_a_dead_process(var / "tmp", f"export-{KEY[:16]}", KEY[:2])
    (tmp_path / "link").symlink_to(var)
    cache = Cache(tmp_path / "link")
    assert cache.sweep() == [tmp_path / "link" / "tmp" / killed.name]
    _, cached = cache.get_or_create("s", KEY, _write("good"), {})
    assert not cached and (var / "s" / KEY[:2] / KEY / "result.txt").read_text() == "good"
    _intact(made)


@pytest.mark.parametrize("inner", ["tmp", "failed"])
def test_a_tmp_or_failed_folder_that_is_a_link_is_refused(tmp_path: Path, inner: str) -> None:
    outside = tmp_path / "var-tmp"
    made = _user_things(outside)
    holder_of_a_dead_process(outside, f"export-{KEY[:16]}", KEY[:2])  # even edgeflow-made
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / inner).symlink_to(outside)
    cache = Cache(tmp_path / "cache")
    with pytest.raises(EdgeflowError) as info:
        cache.sweep()
        cache.get_or_create("s", KEY, _fails, {})
    assert info.value.exit_code == 2
    assert f"the cache's {inner}/ folder {tmp_path / 'cache' / inner} is a symbolic link" in (
        info.value.message
    )
    assert f"remove {tmp_path / 'cache' / inner}" in info.value.hint
    _intact(made)
    assert len(list(outside.iterdir())) == 2 * len(USER_NAMES) + 1


@pytest.mark.parametrize("level", ["entry", "prefix"])
def test_an_entry_replaced_by_a_file_is_computed_again(tmp_path: Path, level: str) -> None:
    warnings: list[str] = []
    cache = Cache(tmp_path, warn=warnings.append)
    entry, _ = cache.get_or_create("s", KEY, _write("good"), {})
    path = entry if level == "entry" else entry.parent
    shutil.rmtree(path)
    path.write_text("not a folder")
    again, cached = cache.get_or_create("s", KEY, _write("again"), {})
    assert again == entry and not cached and (entry / "result.txt").read_text() == "again"
    assert len(warnings) == 1 and str(path) in warnings[0]
    assert list((tmp_path / "tmp").iterdir()) == []
    assert cache.get_or_create("s", KEY, _write("other"), {})[1] is True


def test_a_damaged_entry_behind_a_link_out_of_the_cache_is_not_removed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    cache = Cache(tmp_path / "cache")
    cache.get_or_create("s", KEY, _write("good"), {})
    shutil.move(tmp_path / "cache" / "s", elsewhere)
    (tmp_path / "cache" / "s").symlink_to(elsewhere)
    (elsewhere / KEY[:2] / KEY / "result.txt").write_text("changed")
    with pytest.raises(EdgeflowError, match="lies behind a symbolic link out of the cache"):
        cache.get_or_create("s", KEY, _write("again"), {})
    assert (elsewhere / KEY[:2] / KEY / "result.txt").read_text() == "changed"


def test_user_folders_beside_and_in_the_build_folder_survive_publishes(tmp_path: Path) -> None:
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "metrics.json").write_text("{}")
    build, recipe = tmp_path / "build" / "r" / "t-none", tmp_path / "r.yaml"
    made = _user_things(build.parent) | _user_things(tmp_path / "build")
    publish(build, {"metrics": entry / "metrics.json"}, recipe)
    made |= _user_things(build)
    killed = holder_of_a_dead_process(build.parent, ".t-none.tmp")
    for _ in range(2):
        publish(build, {"metrics": entry / "metrics.json"}, recipe)
    _intact(made)
    assert not killed.exists()
    ours = {".t-none.lock", "t-none"}
    assert {p.name for p in build.parent.iterdir()} - ours == {
        *USER_NAMES,
        *(f"{n}.txt" for n in USER_NAMES),
    }


def test_a_folder_where_a_lock_file_goes_is_refused_and_kept(tmp_path: Path) -> None:
    made = _user_things(tmp_path / "cache" / "locks" / "ab.lock", ["photos"])
    with pytest.raises(EdgeflowError) as info:
        Cache(tmp_path / "cache").get_or_create("s", KEY, _write("good"), {})
    assert info.value.exit_code == 2
    lock = tmp_path / "cache" / "locks" / "ab.lock"
    assert info.value.message == f"{lock} is not a file, where edgeflow keeps a lock file"
    build = tmp_path / "build" / "r" / "t-none"
    made |= _user_things(build.parent / ".t-none.lock", ["photos"])
    entry = tmp_path / "metrics.json"
    entry.write_text("{}")
    with pytest.raises(EdgeflowError, match=r"\.t-none\.lock is not a file"):
        publish(build, {"metrics": entry}, tmp_path / "r.yaml")
    _intact(made)


def test_a_dvc_stages_sweep_removes_only_dead_holders(tmp_path: Path) -> None:
    out = tmp_path / "dvc" / "s"
    made = _user_things(out.parent)
    (out.parent / ".s.work-1-abc").mkdir()  # the exact shape of a dead process's, no marker
    killed = holder_of_a_dead_process(out.parent, ".s.work")
    live = owned.make(out.parent, ".s.work")  # this process's: at work
    _sweep_work_folders(out)
    _intact(made)
    assert not killed.exists() and live.is_dir() and (out.parent / ".s.work-1-abc").is_dir()


@pytest.mark.slow
def test_a_run_keeps_the_users_folder_in_the_caches_tmp(tmp_path: Path) -> None:
    """`mkdir -p D/cache/tmp/my-photos-2023-summer; edgeflow run ... cache_dir=D/cache`."""
    from tests.conftest import DEMO_RECIPE

    cache, build = tmp_path / "cache", tmp_path / "build"
    made = _user_things(cache / "tmp") | _user_things(build)
    killed = holder_of_a_dead_process(cache / "tmp", f"export-{KEY[:16]}", KEY[:2])
    cmd = [sys.executable, "-m", "edgeflow", "run", f"recipe={DEMO_RECIPE}"]
    cmd += ["target=onnxruntime_micro", f"cache_dir={cache}", f"build_dir={build}"]
    ran = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    assert ran.returncode == 0, ran.stderr
    assert "verified" in ran.stdout
    _intact(made)
    assert not killed.exists()
    assert (build / "digits_cnn" / "onnxruntime_micro-int8" / "model.ort").is_file()
    record = json.loads(
        (build / "digits_cnn" / "onnxruntime_micro-int8" / ".edgeflow-build.json").read_text()
    )
    assert "model.ort" in record["files"]
