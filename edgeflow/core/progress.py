"""What edgeflow is doing now, said by the code that does it and shown by whoever listens.

Work that takes a while opens a task, counted where it is countable:

    with progress.task("calibration", total=len(batches), unit="batches") as t:
        for batch in batches:
            ...
            t.advance()

    for feeds in progress.track(batches, "evaluation", unit="batches"): ...

Each start, advance and end is an Event handed to the one installed sink (`installed`): the
terminal's renderer (edgeflow.engine.console), or in a worker process the socket to its
parent, which hands the events on to its own (`relay`). With no sink (library use, tests)
a task costs a check and nothing is shown. Tasks nest: a task opened inside another's
`with` block is its child (a stage's task holds its calibration's).
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Event:
    kind: Literal["start", "advance", "end"]
    task: str  # "<pid>.<n>": unique across the processes of a run
    parent: str | None = None  # start: the task it runs inside (None: a top-level one)
    name: str = ""  # start: what runs ("latency", "onnx2tf conversion")
    total: int | None = None  # start: how many steps, where that is known
    unit: str = ""  # start: what a step is, as shown after the count ("runs")
    steps: int = 0  # advance: how many steps were just done
    detail: str = ""  # advance: what the last step found, when there is something to say

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        return cls(**data)


Sink = Callable[[Event], None]

_sink: Sink | None = None
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "edgeflow_progress_task", default=None
)
_numbers = itertools.count(1)


class Task:
    """A running task: `advance` counts its steps. A task opened with no sink installed
    (or after `with` ended) counts nothing."""

    __slots__ = ("_sink", "id")

    def __init__(self, sink: Sink | None, task_id: str) -> None:
        self._sink, self.id = sink, task_id

    def advance(self, steps: int = 1, detail: str = "") -> None:
        if self._sink is not None:
            self._sink(Event("advance", self.id, steps=steps, detail=detail))

    def _end(self) -> None:
        sink, self._sink = self._sink, None
        if sink is not None:
            sink(Event("end", self.id))


def _start(name: str, total: int | None, unit: str) -> Task:
    sink = _sink
    if sink is None:
        return Task(None, "")
    found = Task(sink, f"{os.getpid()}.{next(_numbers)}")
    sink(Event("start", found.id, _current.get(), name, total, unit))
    return found


@contextlib.contextmanager
def task(name: str, total: int | None = None, unit: str = "") -> Iterator[Task]:
    """A task for the `with` block: `total` steps of `unit` where countable (none: what runs
    and for how long is still shown); it ends when the block does, also on an exception."""
    found = _start(name, total, unit)
    token = _current.set(found.id or _current.get())
    try:
        yield found
    finally:
        _current.reset(token)
        found._end()


def track(items: Iterable[T], name: str, total: int | None = None, unit: str = "") -> Iterator[T]:
    """`items`, one step each, as a task (`total`: len(items) where it has one). The task
    ends when the items do, or when the loop over them stops early (the generator closes)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    found = _start(name, total, unit)  # not the current task: the loop body is the caller's
    try:
        for item in items:
            yield item
            found.advance()
    finally:
        found._end()


def enabled() -> bool:
    """Whether a sink listens (to skip work done only to report progress)."""
    return _sink is not None


@contextlib.contextmanager
def installed(sink: Sink) -> Iterator[None]:
    """Hand every event to `sink` inside the block (the sink before it is restored after).
    The sink is called from whichever thread opens or advances a task."""
    global _sink
    before, _sink = _sink, sink
    try:
        yield
    finally:
        _sink = before


def relay(event: Event) -> None:
    """Hand on an event of another process (a worker's): its top-level tasks become children
    of this process's current task (the stage that runs in the worker)."""
    sink = _sink
    if sink is None:
        return
    if event.kind == "start" and event.parent is None:
        event = replace(event, parent=_current.get())
    sink(event)
