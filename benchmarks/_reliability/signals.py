"""The signals part: SIGTERM to a cold build, SIGINT to its process group, at random moments."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .common import (
    EXAMPLES,
    Row,
    Settings,
    below_acceptance,
    collect,
    exception_line,
    new_tag,
    reap_tagged,
    say,
    start_edgeflow,
    wait_or_kill,
)
from .demo import demo_args, reference, temporary_folders

WORKER = "edgeflow.engine.worker"


@dataclass
class SignalRun:
    """One signalled build: how it ended and what it left behind."""

    delay: float
    code: int | None
    finished_first: bool = False
    exit_seconds: float = 0.0
    slow: bool = False
    traceback: bool = False
    workers_left: int = 0
    temporary: list[str] = field(default_factory=list)
    message: str = ""

    @property
    def failures(self) -> list[str]:
        """The requirements this build broke."""
        broken = {
            "slow exit": self.slow,
            "traceback": self.traceback,
            "worker left": bool(self.workers_left),
            "temporary left": bool(self.temporary),
        }
        return [what for what, bad in broken.items() if bad]


def part_signals(s: Settings) -> list[Row]:
    """SIGTERM to the process, SIGINT to its group, at random moments of cold builds."""
    ref = reference(s)
    rows = []
    for name, group, seed in (("SIGTERM", False, 2), ("SIGINT", True, 3)):
        rng = random.Random(seed)
        runs = []
        for i in range(s.args.signals):
            delay = rng.uniform(0.05, 0.85) * ref.seconds  # inside the build, not after it
            runs.append(signal_until_hit(s, s.work / "signals" / f"{name}-{i}", name, group, delay))
            say(f"signals {name} {i + 1}/{s.args.signals}: {describe_signal_run(runs[-1])}")
        rows.append(signal_row(s, name, group, runs))
    return rows


def signal_until_hit(s: Settings, folder: Path, name: str, group: bool, delay: float) -> SignalRun:
    """A signalled build; a build that finished before its signal is tried again, earlier."""
    for attempt in range(3):
        run = signal_run(s, folder / f"try{attempt}", name, group, delay)
        if not run.finished_first:
            break
        delay *= 0.6
    return run


def signal_run(s: Settings, folder: Path, name: str, group: bool, delay: float) -> SignalRun:
    """Start a cold build, signal it after `delay` s, check how it exits and what is left."""
    cache, build = folder / "cache", folder / "build"
    tag, start = new_tag(), time.perf_counter()
    proc = start_edgeflow(s, demo_args(s, cache, build), folder, tag)
    run = SignalRun(delay, None)
    try:
        proc.wait(delay)
        run.finished_first = True
    except subprocess.TimeoutExpired:
        send = os.killpg if group else os.kill  # the group, as Ctrl-C in a terminal does
        send(proc.pid, getattr(signal, name))
        sent = time.perf_counter()
        run.slow = not wait_or_kill(proc, 10)
        run.exit_seconds = time.perf_counter() - sent
    ran = collect(proc, folder, start, tag)
    time.sleep(1)
    run.code, run.workers_left = proc.returncode, reap_tagged({tag}, WORKER)
    run.traceback = "Traceback" in ran.err
    run.temporary = [str(p.relative_to(folder)) for p in temporary_folders(cache, build)]
    last = [line for line in ran.err.splitlines() if line.strip()][-1:] or ["(no error output)"]
    run.message = exception_line(ran.err) or last[0][:200]
    return run


def describe_signal_run(run: SignalRun) -> str:
    """One line per signalled build, for the progress log."""
    if run.finished_first:
        return f"finished before the signal at {run.delay:.1f} s (exit {run.code})"
    failures = ", ".join(run.failures) or "clean"
    return f"at {run.delay:.1f} s, exit {run.code} after {run.exit_seconds:.1f} s: {failures}" + (
        f"; left {run.temporary[:2]}" if run.temporary else ""
    )


def signal_row(s: Settings, name: str, group: bool, runs: list[SignalRun]) -> Row:
    """The line of one signal: counts of each failure kind over the signalled builds."""
    hit = [r for r in runs if not r.finished_first]
    counts = Counter(f for r in hit for f in r.failures)
    figures = {
        "slow exit": counts["slow exit"],
        "traceback": counts["traceback"],
        "worker left": counts["worker left"],
        "temporary left": counts["temporary left"],
    }
    failing = [r for r in hit if r.failures]
    for r in failing[:EXAMPLES]:
        say(
            f"  {name} at {r.delay:.1f} s: exit {r.code}, {', '.join(r.failures)}; "
            f"left {r.temporary[:3]}; {r.message}"
        )
    target = "its process group" if group else "the process"
    details = {"runs": [r.__dict__ | {"failures": r.failures} for r in runs]}
    return Row(
        f"signals {name}",
        f"{len(hit)} of {len(runs)} builds signalled ({target})",
        figures,
        bool(hit) and not failing,
        below_acceptance("signals", len(runs)) or ("" if hit else "no build was signalled"),
        details,
    )
