"""What `edgeflow run` and `edgeflow diff` show while they work, in one of three modes.

- live: stdout is a terminal (and CI is not set, TERM is not dumb). While a stage runs,
  rich draws a line for it and one for each progress task inside it (edgeflow.core.progress):
  what runs, a bar and a count where it is countable, and the elapsed time; the lines go when
  the stage ends, and the stage's own line (`  verify         ran        1.21 s`) stays, as
  in plain mode. A sweep adds a line for its jobs (done/total). When a launcher runs the
  jobs in other processes (joblib, Ray), which print to the same terminal, nothing is
  redrawn: the `edgeflow` process prints a line as each job ends (`  sweep  1/4 jobs`).
- plain: the build's lines only, one per stage, no carriage returns or escape sequences: a
  file, a pipe, CI, and Hydra jobs run in another process than the `edgeflow` one (the
  joblib and Ray launchers), whose output would interleave with a live display.
- quiet (`--quiet`): only what a build ends with: its `  -> build/...: figures` line, the
  verified / not verified / error lines, a sweep's table, and what must not go unsaid (the
  stages' warnings, the per-layer diff's or bisection's finding).

Errors go to stderr in every mode.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Literal, get_args

from edgeflow.core import progress

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

Mode = Literal["live", "plain", "quiet"]
ENV = "EDGEFLOW_CONSOLE"  # "<mode> <pid>": the run's mode and the process that started it
REFRESH_PER_SECOND = 8
NAME_WIDTH = 14  # the stage column of the build's lines (edgeflow.engine.runner)


def choose(quiet: bool) -> Mode:
    """The mode of a run started in this process."""
    if quiet:
        return "quiet"
    ci = os.environ.get("CI", "").lower() not in ("", "0", "false")
    dumb = os.environ.get("TERM") == "dumb"
    return "live" if sys.stdout.isatty() and not ci and not dumb else "plain"


@contextlib.contextmanager
def session(mode: Mode, jobs_elsewhere: bool = False) -> Iterator[None]:
    """A run in `mode`: its Hydra jobs find it (`job_mode`), and in live mode the progress
    tasks are drawn on the terminal; as lines where `jobs_elsewhere` (a launcher's processes
    print to the same terminal)."""
    before = os.environ.get(ENV)
    os.environ[ENV] = f"{mode} {os.getpid()}"
    try:
        if mode != "live":
            yield
            return
        if jobs_elsewhere:
            with progress.installed(Counts(say)):
                yield
            return
        live = Live(sys.stdout, redirect_stderr=sys.stderr.isatty())
        try:
            with progress.installed(live):
                yield
        finally:
            live.close()
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def job_mode() -> Mode:
    """The mode of a Hydra job: its run's, in the process that started the run; plain (or
    quiet) in a process a launcher started; plain outside a run."""
    mode, _, pid = os.environ.get(ENV, "").partition(" ")
    if mode not in get_args(Mode):
        return "plain"
    if pid == str(os.getpid()):
        return mode  # type: ignore[return-value]
    return "quiet" if mode == "quiet" else "plain"


# A line of a build as a rerun of it shows it (edgeflow.engine.runner records them; the
# up-to-date stamp, edgeflow/engine/uptodate.py, replays them): ("line", text) for the
# build's header; ("stage", name) for a stage's line, which a rerun shows as cached;
# ("all_cached", count) where a rerun says that it has nothing to do; ("notice", text) for
# a warning or a finding.
Event = tuple[Literal["line", "stage", "all_cached", "notice"], str]


def stage_line(stage: str, status: str, seconds: float) -> str:
    return f"  {stage:<{NAME_WIDTH}} {status:<7} {seconds:7.2f} s"


def all_cached(count: int) -> str:
    return f"  nothing to do: all {count} stages cached"


def say(line: str) -> None:
    """Print a line now (a pipe holds unflushed lines back until the process ends)."""
    print(line, flush=True)


def lines(mode: Mode) -> Callable[[str], None]:
    """Where a build's lines go (run_build's `echo`): nowhere in quiet mode."""
    return _silent if mode == "quiet" else say


def _silent(line: str) -> None:
    pass


class Counts:
    """A progress sink that draws nothing: a line each time a top-level task counts a step
    (`  sweep          3/4 jobs`), for a terminal that other processes print to as well."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self._echo = echo
        self._lock = threading.Lock()
        self._open: dict[str, progress.Event] = {}  # by task: its start
        self._done: dict[str, int] = {}

    def __call__(self, event: progress.Event) -> None:
        with self._lock:
            if event.kind == "start" and event.parent is None:
                self._open[event.task], self._done[event.task] = event, 0
            elif event.kind == "end":
                self._open.pop(event.task, None)
                self._done.pop(event.task, None)
            elif event.task in self._open:
                start = self._open[event.task]
                self._done[event.task] += event.steps
                count = f"{self._done[event.task]}"
                count += f"/{start.total}" if start.total is not None else ""
                self._echo(f"  {start.name:<{NAME_WIDTH}} {count} {start.unit}".rstrip())


@dataclass
class _Shown:
    row: TaskID
    parent: str | None
    counted: bool


class Live:
    """A progress sink that draws the open tasks under the printed lines, with rich: one row
    each, indented under the task it runs in, from the first task's start to the last one's
    end. Meanwhile, what is printed to stdout (and to stderr when it is a terminal too) goes
    above the rows, through rich's console."""

    def __init__(self, file: IO[str], redirect_stderr: bool) -> None:
        from rich.console import Console

        self._console = Console(file=file, highlight=False, soft_wrap=True)  # lines as printed
        self._redirect_stderr = redirect_stderr
        self._lock = threading.RLock()  # events come from the sweep's thread too
        self._pid = os.getpid()
        self._shown: dict[str, _Shown] = {}
        self._progress: Progress | None = None

    def __call__(self, event: progress.Event) -> None:
        if os.getpid() != self._pid:  # a forked child's events: its parent shows its own
            return
        with self._lock:
            if event.kind == "start":
                self._start(event)
                return
            shown = self._shown.get(event.task)
            if shown is None or self._progress is None:  # ended with the task it ran in
                return
            if event.kind == "advance":
                self._progress.update(shown.row, advance=event.steps)
                if event.detail:
                    self._progress.update(shown.row, detail=event.detail)
            else:
                self._end(event.task)

    def close(self) -> None:
        """Take the rows away (an interrupted run ends its tasks unwinding; this is the rest)."""
        with self._lock:
            self._shown.clear()
            if self._progress is not None:
                self._progress.stop()
                self._progress = None

    def _start(self, event: progress.Event) -> None:
        if self._progress is None:
            self._progress = self._new_progress()
            self._progress.start()
        depth, parent = 0, self._shown.get(event.parent or "")
        while parent is not None:
            depth += 1
            parent = self._shown.get(parent.parent or "")
        row = self._progress.add_task(
            f"{'  ' * (depth + 1)}{event.name:<{NAME_WIDTH}}",  # a stage's, as its line has it
            total=event.total,
            unit=event.unit,
            detail="",
        )
        self._shown[event.task] = _Shown(row, event.parent, event.total is not None)
        self._progress.refresh()  # before a line printed meanwhile redraws the rows as they were

    def _end(self, task: str) -> None:
        assert self._progress is not None
        if self._shown[task].counted:
            self._progress.refresh()  # its last count is drawn, however fast it ran
        ended = {task}
        for other, shown in list(self._shown.items()):  # the tasks it ran, left open
            parent = shown.parent
            while parent is not None and parent not in ended and parent in self._shown:
                parent = self._shown[parent].parent
            if parent in ended:
                ended.add(other)
        for other in ended:
            self._progress.remove_task(self._shown.pop(other).row)
        if self._shown:
            self._progress.refresh()
        else:
            self._progress.stop()
            self._progress = None

    def _new_progress(self) -> Progress:
        from rich.progress import Progress

        return Progress(
            *_columns(),
            console=self._console,
            transient=True,
            redirect_stdout=True,
            redirect_stderr=self._redirect_stderr,
            refresh_per_second=REFRESH_PER_SECOND,
        )


def _columns() -> list[Any]:
    """A row: what runs; a bar where it has a total; its count (`37/100 runs`, or
    `3 prefixes converted` without a total, nothing before the first step); the time it
    has run; what its last step found."""
    from rich.progress import BarColumn, ProgressColumn, Task, TextColumn, TimeElapsedColumn
    from rich.text import Text

    class Bar(ProgressColumn):
        def __init__(self) -> None:
            super().__init__()
            self.bar = BarColumn(bar_width=30)

        def render(self, task: Task) -> Any:
            return self.bar.render(task) if task.total is not None else Text("")

    class Count(ProgressColumn):
        def render(self, task: Task) -> Text:
            done, unit = int(task.completed), task.fields["unit"]
            if task.total is None:
                return Text(f"{done} {unit}".strip() if done else "")
            return Text(f"{done}/{int(task.total)} {unit}".strip())

    class Detail(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text(task.fields["detail"], style="dim")

    what = TextColumn("{task.description}", markup=False)
    return [what, Bar(), Count(), TimeElapsedColumn(), Detail()]
