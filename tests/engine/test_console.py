"""What a run shows: live progress on a terminal, one line per stage when piped, the summary
with --quiet; a sweep's jobs counted."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from edgeflow.core.progress import Event
from edgeflow.engine import console
from edgeflow.hydra_app import sweep_jobs
from tests.conftest import REPO

ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
DEMO = ["recipe=digits_cnn", "target=onnxruntime_micro", "quantization=int8"]
STAGES = ["load", "rewrite", "export", "rewrite_onnx", "rewrite_target", "optimize"]
STAGES += ["precheck", "quantize", "convert", "verify", "report", "html"]
STAGE_LINE = re.compile(r"  (\w+) +(ran|cached) +\d+\.\d\d s")


def read_pty(fd: int) -> str:
    """What was written to the terminal so far (rows are redrawn meanwhile: a few reads)."""
    chunks = []
    for _ in range(5):
        if select.select([fd], [], [], 0.1)[0]:
            chunks.append(os.read(fd, 1 << 20))
    return b"".join(chunks).decode()


def test_the_live_renderer_draws_open_tasks_and_takes_them_away() -> None:
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    with open(child, "w", closefd=True) as terminal:
        live = console.Live(terminal, redirect_stderr=False)
        stage, latency = Event("start", "1.1", None, "verify"), "1.2"
        live(stage)
        live(Event("start", latency, stage.task, "latency", 5, "runs"))
        live(Event("start", "1.3", latency, "left open"))  # a worker died in it
        for _ in range(5):
            live(Event("advance", latency, steps=1))
        live(Event("advance", "1.9", steps=1))  # unknown: ignored
        drawn = ESCAPE.sub("", read_pty(main))
        assert "  verify" in drawn and "    latency" in drawn and "      left open" in drawn
        live(Event("end", latency))  # its last count is drawn before it goes
        assert "5/5 runs" in ESCAPE.sub("", read_pty(main))
        assert live._progress is not None and list(live._shown) == [stage.task]
        live(Event("end", stage.task))
        assert live._progress is None and live._shown == {}
        live.close()
    os.close(main)


def test_counts_prints_a_line_per_step_and_nothing_else() -> None:
    lines: list[str] = []
    counts = console.Counts(lines.append)
    counts(Event("start", "1.1", None, "sweep", 2, "jobs"))
    counts(Event("start", "1.2", None, "bisection", None, "prefixes converted"))
    counts(Event("start", "1.3", "1.2", "inside", 2, "steps"))
    counts(Event("advance", "1.3", steps=1))
    counts(Event("advance", "1.1", steps=1))
    counts(Event("advance", "1.2", steps=2))
    counts(Event("advance", "1.1", steps=1))
    counts(Event("end", "1.1"))
    counts(Event("advance", "1.1", steps=1))
    assert lines == [
        "  sweep          1/2 jobs",
        "  bisection      2 prefixes converted",
        "  sweep          2/2 jobs",
    ]


def test_a_hydra_job_in_another_process_prints_plain_lines(monkeypatch) -> None:
    monkeypatch.delenv(console.ENV, raising=False)
    assert console.job_mode() == "plain"
    with console.session("quiet"):
        assert console.job_mode() == "quiet"
    for mode, there in (("live", "plain"), ("plain", "plain"), ("quiet", "quiet")):
        monkeypatch.setenv(console.ENV, f"{mode} {os.getpid()}")
        assert console.job_mode() == mode
        monkeypatch.setenv(console.ENV, f"{mode} {os.getpid() + 1}")  # a launcher's process
        assert console.job_mode() == there


def test_ci_and_pipes_are_plain(monkeypatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    assert console.choose(quiet=True) == "quiet"
    assert console.choose(quiet=False) == "plain"  # pytest captures stdout
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert console.choose(quiet=False) == "live"
    monkeypatch.setenv("CI", "true")
    assert console.choose(quiet=False) == "plain"


@pytest.mark.parametrize(
    ("args", "jobs"),
    [
        (["-m", "quantization.mode=none,int8", "target=a,b"], 4),
        (["-m", "recipe=digits_cnn", "quantization=none,int8,fp16", "hydra/launcher=joblib"], 3),
        (["+recipe_overrides.verify.latency_runs=range(1,5)", "--cfg", "job"], 4),
        (["quantization=int8"], 1),
        (["target=glob(*)"], None),  # the group's options: Hydra's to list
    ],
)
def test_a_sweep_counts_its_jobs_from_its_overrides(args: list[str], jobs: int | None) -> None:
    assert sweep_jobs(args) == jobs


def environment(**extra: str) -> dict[str, str]:
    """This one, CI unset (a plain run must be plain for being piped), this checkout's code
    first, and `extra`."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *env.get("PYTHONPATH", "").split(os.pathsep)])
    return {**env, **extra}


def edgeflow(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`edgeflow ARGS` in tmp_path (a sweep's folder, .edgeflow/multirun, goes there), piped."""
    return subprocess.run(
        [sys.executable, "-m", "edgeflow", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env=environment(),
    )


@pytest.mark.slow
def test_piped_output_is_one_plain_line_per_stage(tmp_path: Path, shared_cache: Path) -> None:
    done = edgeflow(tmp_path, "run", *DEMO, f"cache_dir={shared_cache}", "build_dir=b")
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stdout and "\x1b" not in done.stdout
    lines = done.stdout.splitlines()
    assert lines[0] == "edgeflow: digits_cnn -> onnxruntime_micro-int8 (pytorch pipeline)"
    assert [m[1] for m in map(STAGE_LINE.fullmatch, lines) if m] == STAGES
    assert lines[-2].startswith("  -> b/digits_cnn/onnxruntime_micro-int8: accuracy")
    assert lines[-1] == "  verified: every threshold in the recipe holds"


@pytest.mark.slow
def test_quiet_prints_only_the_summary(tmp_path: Path, shared_cache: Path) -> None:
    cache = f"cache_dir={shared_cache}"
    done = edgeflow(tmp_path, "run", "--quiet", *DEMO, cache, "build_dir=b")
    assert done.returncode == 0, done.stderr
    summary, verified = done.stdout.splitlines()
    assert summary.startswith("  -> b/digits_cnn/onnxruntime_micro-int8: accuracy")
    assert verified == "  verified: every threshold in the recipe holds"
    done = edgeflow(tmp_path, "run", "-q", "-m", *DEMO, "verify.latency_runs=20,30", cache)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert not any(STAGE_LINE.fullmatch(line) or "HYDRA" in line for line in lines), lines
    assert sum(line.startswith("  -> build/digits_cnn/") for line in lines) == 2
    assert any(line.startswith("sweep: 2 builds (") for line in lines)


@pytest.mark.slow
def test_a_terminal_shows_the_running_stage_and_its_counts(
    tmp_path: Path, shared_cache: Path
) -> None:
    """Under a pseudo-terminal: live rows for the stage that runs (verify, its latency runs
    counted: a latency_runs no other build asks for, so that verify runs), the stage lines
    as when piped."""
    args = [*DEMO, "verify.latency_runs=37", f"cache_dir={shared_cache}", "build_dir=b"]
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeflow", "run", *args],
        stdin=child,
        stdout=child,
        stderr=child,
        cwd=tmp_path,
        env=environment(COLUMNS="200", LINES="50", TERM="xterm-256color"),
    )
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # the child side closed: the process ended
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=60) == 0
    os.close(main)
    raw = b"".join(chunks).decode()
    shown = ESCAPE.sub("", raw)
    assert re.search(r"  verify +\S*.*\n +latency +\S+ 37/37 runs", shown.replace("\r", "")), shown
    assert re.search(r"\n +evaluation +\S+ (\d+)/\1 samples", shown.replace("\r", ""))
    assert "  verify         ran " in shown
    assert "\x1b[2K" in raw  # rows erased: the live region went away as the stage ended
