"""What every part shares: the result row and table, started edgeflow processes, messages."""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TAG = "EDGEFLOW_RELIABILITY_TAG"  # in the environment of every process this script starts
ACCEPTANCE = {
    "fuzz": 1000,
    "fuzzkeys": 1000,
    "kills": 50,
    "signals": 6,
    "concurrent": 8,
    "untrusted": 57,
}
EXAMPLES = 10  # failing examples printed per outcome


class BenchError(Exception):
    """The benchmark cannot measure a part (its own set-up failed); the part is reported FAIL."""


# --------------------------------------------------------------------------- results


@dataclass
class Row:
    """One line of the final table: a check, its size, the measured figures and the verdict."""

    check: str
    size: str
    figures: dict[str, Any]
    passed: bool
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def shown(self) -> str:
        """The figures in words: `tracebacks 0, hangs 0, ...`."""
        text = ", ".join(f"{k} {_number(v)}" for k, v in self.figures.items())
        return f"{text} ({self.note})" if self.note else text


def _number(value: Any) -> str:
    """A figure as the table shows it: yes/no, 1,000, 1.5."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def render_table(rows: list[Row]) -> str:
    """The one table the benchmark prints: check | size | figures | pass/FAIL."""
    cells = [("check", "size", "figures", "verdict")]
    cells += [(r.check, r.size, r.shown(), "pass" if r.passed else "FAIL") for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    lines = [" | ".join(c[i].ljust(widths[i]) for i in range(4)).rstrip() for c in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def below_acceptance(name: str, size: int) -> str:
    """A note for the table when a part ran smaller than its acceptance size."""
    needed = ACCEPTANCE[name]
    return f"quick size, acceptance is {needed:,}" if size < needed else ""


def say(text: str) -> None:
    """Progress and examples, printed as they happen (the table comes at the end)."""
    print(text, flush=True)


# --------------------------------------------------------------------------- processes


@dataclass
class Reference:
    """A cold build of the demo in its own cache: its wall time and its artifact."""

    seconds: float
    artifact: bytes


@dataclass
class Settings:
    """What every part needs: the checkout, a work folder, the options, one cold reference."""

    repo: Path
    work: Path
    args: argparse.Namespace
    reference: Reference | None = None


@dataclass
class Ran:
    """A finished edgeflow process: exit status (None: we killed it), output, wall time."""

    code: int | None
    out: str
    err: str
    seconds: float
    tag: str

    @property
    def text(self) -> str:
        """stdout and stderr together."""
        return self.out + self.err


def edgeflow_env(repo: Path, tag: str) -> dict[str, str]:
    """The environment of a started edgeflow: this checkout first on the path, our tag set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env[TAG] = tag
    return env


def new_tag() -> str:
    """A unique mark for one started process tree, found again in /proc/<pid>/environ."""
    return f"{os.getpid()}-{time.time_ns()}-{random.SystemRandom().randrange(1 << 30)}"


def run_args(recipe: Path, cache: Path, build: Path, overrides: tuple[str, ...] = ()) -> list[str]:
    """`edgeflow run` of a recipe (by path, so any working directory works) on a cache."""
    return ["run", f"recipe={recipe}", *overrides, f"cache_dir={cache}", f"build_dir={build}"]


def start_edgeflow(s: Settings, args: list[str], folder: Path, tag: str) -> subprocess.Popen[str]:
    """`python -m edgeflow ARGS` in `folder`, in its own session; output to files there."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "stdout.txt", "w") as out, open(folder / "stderr.txt", "w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "edgeflow", *args],
            cwd=folder,
            env=edgeflow_env(s.repo, tag),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            text=True,
            start_new_session=True,
        )


def collect(proc: subprocess.Popen[str], folder: Path, start: float, tag: str) -> Ran:
    """The finished process's exit status and output."""
    read = lambda name: (folder / name).read_text(errors="replace")  # noqa: E731
    code = proc.returncode
    return Ran(code, read("stdout.txt"), read("stderr.txt"), time.perf_counter() - start, tag)


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the process group of a process we started (it leads its own session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_or_kill(proc: subprocess.Popen[str], timeout: float) -> bool:
    """Wait up to `timeout` s for a process; past it, SIGKILL its group. Whether it finished."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return False
    return True


def run_edgeflow(s: Settings, args: list[str], folder: Path, timeout: float) -> Ran:
    """Run edgeflow to completion (or kill it at `timeout`: code None)."""
    tag, start = new_tag(), time.perf_counter()
    proc = start_edgeflow(s, args, folder, tag)
    finished = wait_or_kill(proc, timeout)
    ran = collect(proc, folder, start, tag)
    if not finished:
        ran.code = None
    return ran


def reap_tagged(tags: set[str], pattern: str) -> int:
    """SIGKILL live processes matching `pattern` (pgrep -f) that carry one of our tags: ones
    we started that outlived their build. How many there were."""
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
    pids = [int(p) for p in found.stdout.split() if _tag_of(int(p)) in tags]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def _tag_of(pid: int) -> str | None:
    """The tag in a process's environment (None: untagged, or gone)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in environ.split(b"\0"):
        if item.startswith(f"{TAG}=".encode()):
            return item.split(b"=", 1)[1].decode()
    return None


# --------------------------------------------------------------------------- messages


def first_lines(text: str, n: int = 3) -> str:
    """The first non-empty lines of a message, for examples in the report."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return "\n".join(line[:300] for line in lines[:n]) or "(no output)"


def error_line(ran: Ran) -> str:
    """The first line of the error a run printed (an `error:` line, else any line)."""
    for line in ran.text.splitlines():
        if line.startswith("error:") or "Traceback" in line:
            return line.strip()[:300]
    return first_lines(ran.err or ran.out, 1)


def exception_line(text: str) -> str:
    """The exception a traceback ends with (`UnicodeDecodeError: ...`), if there is one."""
    pattern = r"^\s*((?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt|Exit)\b.*)$"
    found = re.findall(pattern, text, re.M)
    return found[-1].strip()[:240] if found else ""
