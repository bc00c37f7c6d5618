"""Publishing a build folder never destroys what edgeflow did not write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgeflow.core.errors import EdgeflowError
from edgeflow.engine.publish import RECORD, publish


@pytest.fixture
def outputs(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "entry"
    (folder / "artifact").mkdir(parents=True)
    (folder / "artifact" / "model.ort").write_bytes(b"model")
    (folder / "metrics.json").write_text("{}")
    return {"artifact": folder / "artifact", "metrics": folder / "metrics.json"}


def test_the_users_own_files_stay_in_the_build_folder(tmp_path: Path, outputs) -> None:
    build, recipe = tmp_path / "build" / "r" / "t-none", tmp_path / "r.yaml"
    publish(build, outputs, recipe)
    (build / "my_results.csv").write_text("mine")
    (build / "notes").mkdir()
    publish(build, outputs, recipe)
    assert (build / "my_results.csv").read_text() == "mine" and (build / "notes").is_dir()
    assert sorted(p.name for p in build.iterdir()) == [
        RECORD, "metrics.json", "model.ort", "my_results.csv", "notes"
    ]  # fmt: skip


def test_a_changed_or_clashing_user_file_stops_the_publish(tmp_path: Path, outputs) -> None:
    build, recipe = tmp_path / "build" / "r" / "t-none", tmp_path / "r.yaml"
    publish(build, outputs, recipe)
    (build / "metrics.json").write_text('{"mine": true}')  # edited by the user
    with pytest.raises(EdgeflowError, match=r"edgeflow did not write.*: metrics\.json"):
        publish(build, outputs, recipe)
    assert (build / "metrics.json").read_text() == '{"mine": true}'


def test_two_recipes_of_one_stem_do_not_replace_each_others_builds(tmp_path: Path, outputs) -> None:
    build = tmp_path / "build" / "model" / "t-none"
    first, second = tmp_path / "a" / "model.yaml", tmp_path / "b" / "model.yaml"
    for path in (first, second):
        path.parent.mkdir()
        path.write_text("")
    publish(build, outputs, first)
    with pytest.raises(EdgeflowError) as info:
        publish(build, outputs, second)
    assert f"holds the build of {first}, another recipe file with the same name" in str(info.value)
    first.unlink()  # the other recipe is gone: its build may be replaced
    publish(build, outputs, second)


def test_a_build_dir_that_is_a_file_is_a_clear_error(tmp_path: Path, outputs) -> None:
    (tmp_path / "build").write_text("not a folder")
    with pytest.raises(EdgeflowError, match="is a file, not a folder"):
        publish(tmp_path / "build" / "r" / "t-none", outputs, tmp_path / "r.yaml")


def test_a_killed_publishs_folders_are_cleaned_or_put_back(tmp_path: Path, outputs) -> None:
    from tests.engine.killed import holder_of_a_dead_process

    build, recipe = tmp_path / "build" / "r" / "t-none", tmp_path / "r.yaml"
    publish(build, outputs, recipe)
    (build / "my_results.csv").write_text("mine")
    # killed between its two renames: the build is in an .old- holder, a half copy in a .tmp-
    old = holder_of_a_dead_process(build.parent, ".t-none.old")
    os.rename(build, old / "content")
    tmp = holder_of_a_dead_process(build.parent, ".t-none.tmp")
    (tmp / "content").mkdir()
    (tmp / "content" / "model.ort").write_bytes(b"half")
    publish(build, outputs, recipe)
    assert (build / "my_results.csv").read_text() == "mine"
    assert sorted(p.name for p in build.parent.iterdir()) == [".t-none.lock", "t-none"]


def test_a_publish_interrupted_at_the_swap_loses_no_file_of_the_users(
    tmp_path: Path, outputs, monkeypatch
) -> None:
    from edgeflow.engine import publish as module

    build, recipe = tmp_path / "build" / "r" / "t-none", tmp_path / "r.yaml"
    publish(build, outputs, recipe)
    (build / "my_results.csv").write_text("mine")
    renames, real_rename = [], os.rename

    def rename(src: object, dst: object) -> None:
        renames.append(dst)
        if len(renames) == 2:
            raise KeyboardInterrupt  # Ctrl-C between the two renames of the swap
        real_rename(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(module.os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        publish(build, outputs, recipe)
    monkeypatch.undo()
    assert renames[0].name == "content" and renames[1] == build  # it was at the swap
    assert (build / "my_results.csv").read_text() == "mine"  # the old folder is put back
    assert sorted(p.name for p in build.parent.iterdir()) == [".t-none.lock", "t-none"]
    publish(build, outputs, recipe)
    assert (build / "my_results.csv").read_text() == "mine"
