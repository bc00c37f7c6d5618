"""The worker process: what it reports of a stage's progress reaches the parent; a worker
killed by a signal leaves its last output in worker.log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgeflow.core import progress
from edgeflow.core.errors import StageCrashed, StageFailed
from edgeflow.core.progress import Event
from edgeflow.engine.worker import Worker
from edgeflow.recipe import load_recipe
from edgeflow.stages.base import Stage, StageContext
from tests.conftest import DEMO_RECIPE


def _counting(ctx: StageContext) -> None:
    with progress.task("counting", total=3, unit="things") as task:
        for _ in range(3):
            task.advance()
    with progress.task("crossing"):
        pass


def _dies_counting(ctx: StageContext) -> None:
    with progress.task("counting", total=3, unit="things") as task:
        task.advance()
        os.abort()


def test_a_worker_stage_reports_its_progress_to_the_parent(tmp_path: Path) -> None:
    """The events cross the worker's socket to the parent's sink, under the parent's task; a
    worker that dies mid-task sends no end (a renderer drops the task with its stage's)."""
    loaded = load_recipe(DEMO_RECIPE)
    events: list[Event] = []
    with progress.installed(events.append), Worker(tmp_path) as worker:
        with progress.task("counter") as stage:
            (tmp_path / "a").mkdir()
            counting = Stage(name="counter", description="counts", run=_counting, isolated=True)
            worker.run(StageContext(counting, loaded, {}, tmp_path / "a"))
        theirs = [e for e in events if e.task != stage.id]
        assert [(e.kind, e.name, e.steps) for e in theirs] == [
            ("start", "counting", 0),
            *[("advance", "", 1)] * 3,
            ("end", "", 0),
            ("start", "crossing", 0),
            ("end", "", 0),
        ]
        assert {e.parent for e in theirs if e.kind == "start"} == {stage.id}
        assert all(not e.task.startswith(f"{os.getpid()}.") for e in theirs)  # the worker's ids

        events.clear()
        (tmp_path / "b").mkdir()
        dies = Stage(name="dies", description="aborts", run=_dies_counting, isolated=True)
        with pytest.raises(StageFailed, match="SIGABRT"):
            worker.run(StageContext(dies, loaded, {}, tmp_path / "b"))
        assert [e.kind for e in events] == ["start", "advance"]


def test_without_a_sink_in_the_parent_the_worker_sends_no_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    relayed: list[Event] = []
    monkeypatch.setattr(progress, "relay", relayed.append)
    counting = Stage(name="counter", description="counts", run=_counting, isolated=True)
    with Worker(tmp_path) as worker:
        worker.run(StageContext(counting, load_recipe(DEMO_RECIPE), {}, tmp_path))
        assert relayed == []
        with progress.installed(lambda event: None):
            worker.run(StageContext(counting, load_recipe(DEMO_RECIPE), {}, tmp_path))
        assert len(relayed) == 7 and worker.started == 1


def _segfaults(ctx: StageContext) -> None:
    import ctypes

    print("loading the native library")  # a buffered write unless the worker runs with -u
    ctypes.string_at(0)  # a read of address 0: SIGSEGV, as a native library's bug would be


def test_a_worker_killed_by_a_signal_leaves_its_last_output_in_worker_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log the hint points to holds the stage's name, what it printed, and Python's
    faulthandler report of every thread's stack at the crash."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # as in a user's shell
    crashes = Stage(name="segfaulter", description="crashes", run=_segfaults, isolated=True)
    with Worker(tmp_path) as worker, pytest.raises(StageCrashed) as info:
        worker.run(StageContext(crashes, load_recipe(DEMO_RECIPE), {}, tmp_path))
    assert "killed by SIGSEGV" in info.value.message
    assert "worker.log" in (info.value.hint or "")
    log = (tmp_path / "worker.log").read_text()
    assert "stage 'segfaulter'" in log
    assert "loading the native library" in log
    assert "Fatal Python error: Segmentation fault" in log
    assert "in _segfaults" in log  # the crashing thread's Python stack
    assert "Fatal Python error: Segmentation fault" in info.value.message  # the tail shown
