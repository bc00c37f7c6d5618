"""Progress tasks: the events a sink gets, nesting, and nothing at all without a sink."""

from __future__ import annotations

import pytest

from edgeflow.core import progress
from edgeflow.core.progress import Event


def recorded() -> tuple[list[Event], progress.Sink]:
    events: list[Event] = []
    return events, events.append


def test_a_task_reports_its_start_steps_and_end() -> None:
    events, sink = recorded()
    with progress.installed(sink), progress.task("latency", total=3, unit="runs") as task:
        for _ in range(3):
            task.advance()
        task.advance(0, detail="all done")
    start, *steps, end = events
    assert (start.kind, start.name, start.total, start.unit, start.parent) == (
        "start",
        "latency",
        3,
        "runs",
        None,
    )
    assert [(e.kind, e.steps, e.detail) for e in steps] == [("advance", 1, "")] * 3 + [
        ("advance", 0, "all done")
    ]
    assert end == Event("end", start.task)
    assert {e.task for e in events} == {start.task}


def test_tasks_nest_and_end_on_an_exception() -> None:
    events, sink = recorded()
    with progress.installed(sink), pytest.raises(RuntimeError):  # noqa: SIM117
        with progress.task("verify") as stage:
            with progress.task("evaluation", total=2):
                pass
            with progress.task("latency"):
                raise RuntimeError("the runtime failed")
    starts = {e.name: e for e in events if e.kind == "start"}
    assert starts["verify"].parent is None
    assert starts["evaluation"].parent == starts["latency"].parent == stage.id
    assert [e.kind for e in events] == ["start", "start", "end", "start", "end", "end"]
    with progress.installed(sink), progress.task("next") as after:
        pass
    assert events[-2].parent is None and after.id not in (stage.id, starts["latency"].task)


def test_track_counts_items_and_ends_when_the_loop_stops_early() -> None:
    events, sink = recorded()
    with progress.installed(sink):
        assert list(progress.track([1, 2, 3], "calibration", unit="batches")) == [1, 2, 3]
        for item in progress.track(iter(range(10)), "probe graphs", total=10):
            if item == 1:
                break
    first, second = events[0], next(e for e in events[1:] if e.kind == "start")
    assert first.total == 3 and first.unit == "batches"  # len() of a list
    assert sum(e.steps for e in events if e.task == first.task and e.kind == "advance") == 3
    assert [e.kind for e in events if e.task == second.task] == ["start", "advance", "end"]


def test_without_a_sink_nothing_is_reported_and_tasks_still_work() -> None:
    assert not progress.enabled()
    with progress.task("quiet", total=2) as task:
        task.advance()
    assert list(progress.track(range(3), "quiet")) == [0, 1, 2]
    events, sink = recorded()
    with progress.installed(sink):
        assert progress.enabled()
        task.advance()  # a task opened before the sink: it stays silent
    assert events == [] and not progress.enabled()


def test_relayed_events_hang_under_the_current_task() -> None:
    """A worker's top-level task becomes a child of the stage that runs in the worker."""
    events, sink = recorded()
    theirs = [
        Event("start", "999.1", None, "onnx2tf conversion"),
        Event("start", "999.2", "999.1", "calibration", 4, "batches"),
        Event("advance", "999.2", steps=4),
    ]
    with progress.installed(sink), progress.task("convert") as stage:
        for event in theirs:
            progress.relay(Event.from_dict(event.to_dict()))  # as it crosses the socket
    assert events[1] == Event("start", "999.1", stage.id, "onnx2tf conversion")
    assert events[2:4] == theirs[1:]
    progress.relay(theirs[0])  # no sink: dropped
