"""The fuzz part run: each case through `edgeflow validate` in a worker, classified, tallied."""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import re
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import EXAMPLES, Row, Settings, below_acceptance, exception_line, first_lines, say
from .fuzz import Case, control_cases, generate_cases, onnx_base, shipped_bases
from .mutations import CLASSES, Mutator
from .mutations_keys import NEW_KEY_CLASSES

Result = tuple[int | None, str, str]  # exit status or None, output, an escaped traceback


def _serve(conn: Any, cwd: str, repo: str, memory_mb: int) -> None:
    """The worker's loop: run `edgeflow.cli.main(argv)` per request, output captured."""
    import resource

    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.path.insert(0, repo)
    os.chdir(cwd)
    from edgeflow.cli import main

    while True:
        try:
            argv = conn.recv()
        except EOFError:
            return
        conn.send(_call(main, argv))


def _call(main: Callable[[list[str]], int], argv: list[str]) -> Result:
    """(exit status or None, stdout + stderr, the traceback of an exception escaping main)."""
    out = io.StringIO()
    escaped = ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code: int | None = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            code = None
            try:
                escaped = clipped(traceback.format_exc(), 3000)
            except BaseException:
                escaped = "Traceback: (could not be formatted)"
    return code, clipped(out.getvalue()), escaped


def clipped(text: str, keep: int = 8000) -> str:
    """A long output's head and tail (a RecursionError's traceback runs to megabytes)."""
    if len(text) <= 2 * keep:
        return text
    return f"{text[:keep]}\n[... {len(text) - 2 * keep:,} characters ...]\n{text[-keep:]}"


def edgeflow_frame(text: str) -> str:
    """The deepest frame of a traceback inside edgeflow: `edgeflow/core/loader.py:36 in f`."""
    frames = re.findall(r'File "[^"]*?/(edgeflow/[^"]+)", line (\d+), in (\w+)', text)
    return f"{frames[-1][0]}:{frames[-1][1]} in {frames[-1][2]}" if frames else ""


def shown_output(text: str) -> str:
    """What an example prints of a case's output: its first lines, or for a traceback the
    exception and the deepest edgeflow frame."""
    exc = exception_line(text)
    if "Traceback" not in text or not exc:
        return first_lines(text, 3)
    where = edgeflow_frame(text)
    head = next((line for line in text.splitlines() if line.startswith("error:")), "")
    return "\n".join(x for x in (head[:200], exc + (f"  (at {where})" if where else "")) if x)


class Worker:
    """A long-lived process that validates recipes in-process; restarted after a hang."""

    def __init__(self, cwd: Path, repo: Path, memory_mb: int) -> None:
        self.cwd, self.repo, self.memory_mb = cwd, repo, memory_mb
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        """Spawn a fresh worker process and the pipe to it."""
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        args = (child, str(self.cwd), str(self.repo), self.memory_mb)
        self.proc = ctx.Process(target=_serve, args=args, daemon=True)
        self.proc.start()
        child.close()

    def restart(self) -> None:
        """Kill the worker (hung, or dead) and start another."""
        self.proc.kill()
        self.proc.join()
        self.conn.close()
        self.restarts += 1
        self._start()

    def validate(self, path: Path, timeout: float) -> Result | None:
        """The result of `edgeflow validate PATH`; None when it ran past `timeout` (a hang)."""
        self.conn.send(["validate", str(path)])
        if not self.conn.poll(timeout):
            self.restart()
            return None
        try:
            return self.conn.recv()
        except EOFError:  # the worker died (a crash in native code, or out of memory)
            self.proc.join()
            code = self.proc.exitcode
            self.restart()
            return None, "", f"Traceback: the worker process died (exit status {code})"

    def close(self) -> None:
        """Stop the worker."""
        self.proc.kill()
        self.proc.join()


def located(case: Case, text: str) -> bool:
    """The message names the recipe file with line:col, or the file at fault."""
    if re.search(re.escape(case.path.name) + r":\d+:\d+", text):
        return True
    return case.fault is not None and case.fault.name != "" and case.fault.name in text


def classify(case: Case, result: Result | None) -> str:
    """traceback | hang | invalid accepted | unlocated | bad exit status | ok."""
    if result is None:
        return "hang"
    code, text, escaped = result
    case.code, case.output = code, escaped or text
    if escaped or "Traceback" in text or "internal error" in text:
        return "traceback"
    if case.klass == "control":
        return "ok" if code == 0 else "control refused"
    if code == 0:
        return "invalid accepted" if case.must_refuse else "ok"
    if code != 2:
        return "bad exit status"
    return "ok" if located(case, text) else "unlocated"


FUZZ_FAILURES = ("traceback", "hang", "invalid accepted", "control refused")
FUZZ_OUTCOMES = ("ok", *FUZZ_FAILURES, "unlocated", "bad exit status")


def part_fuzz(s: Settings) -> list[Row]:
    """Run generated recipes through `edgeflow validate`; count each outcome per class."""
    return fuzz_classes(s, "fuzz", s.args.fuzz, CLASSES)


def part_fuzz_keys(s: Settings) -> list[Row]:
    """The same, for the class of the recipe keys added since the last round alone."""
    return fuzz_classes(s, "fuzzkeys", s.args.fuzz_keys, NEW_KEY_CLASSES)


def fuzz_classes(s: Settings, name: str, count: int, classes: dict[str, Mutator]) -> list[Row]:
    """`count` cases of `classes` (and the controls) through the validate worker."""
    root = s.work / name
    cases_dir = root / "cases"
    cases_dir.mkdir(parents=True)
    bases = [*shipped_bases(s.repo, root), onnx_base(root)]
    controls = control_cases(bases, cases_dir)
    cases = generate_cases(count, bases, cases_dir, classes)
    say(f"{name}: {len(cases):,} cases and {len(controls)} controls in {cases_dir}")
    worker = Worker(root, s.repo, s.args.fuzz_memory_mb)
    start = time.perf_counter()
    try:
        for i, case in enumerate([*controls, *cases]):
            case.outcome = classify(case, worker.validate(case.path, s.args.case_timeout))
            if (i + 1) % 100 == 0:
                say(f"{name}: {i + 1:,} run, {time.perf_counter() - start:.0f} s")
    finally:
        worker.close()
    report_fuzz(cases, controls, classes)
    return [fuzz_row(name, cases, controls, worker.restarts, classes)]


def report_fuzz(cases: list[Case], controls: list[Case], classes: dict[str, Mutator]) -> None:
    """Counts per class and outcome, and up to EXAMPLES failing examples per outcome."""
    say("\nfuzz: outcomes per class (MUST = cases that must be refused)")
    header = f"  {'class':<16} {'cases':>5} {'MUST':>5} " + " ".join(
        f"{o:>{max(len(o), 5)}}" for o in FUZZ_OUTCOMES
    )
    say(header)
    for klass in [*classes, "control"]:
        chosen = [c for c in [*cases, *controls] if c.klass == klass]
        counts = Counter(c.outcome for c in chosen)
        cells = " ".join(f"{counts[o]:>{max(len(o), 5)}}" for o in FUZZ_OUTCOMES)
        must = sum(c.must_refuse for c in chosen)
        say(f"  {klass:<16} {len(chosen):>5} {must:>5} {cells}")
    for outcome in (*FUZZ_FAILURES, "unlocated", "bad exit status"):
        failing = [c for c in [*controls, *cases] if c.outcome == outcome]
        if failing:
            say(f"\nfuzz: {outcome}: {len(failing)} (up to {EXAMPLES} shown)")
        for case in failing[:EXAMPLES]:
            label = "MUST refuse" if case.must_refuse else "may accept"
            say(f"  {case.ident} [{case.klass}, {label}] {case.path.name}: {case.mutation}")
            output = shown_output(case.output) if outcome != "hang" else "(no answer)"
            say(f"    exit {case.code}: " + output.replace("\n", "\n      "))


def fuzz_row(
    name: str, cases: list[Case], controls: list[Case], restarts: int, classes: dict[str, Mutator]
) -> Row:
    """The fuzz line of the table: tracebacks, hangs, invalid accepted, unlocated."""
    counts = Counter(c.outcome for c in [*cases, *controls])
    figures = {
        "tracebacks": counts["traceback"],
        "hangs": counts["hang"],
        "invalid accepted": counts["invalid accepted"],
        "unlocated": counts["unlocated"],
        "bad exit status": counts["bad exit status"],
        "controls accepted": f"{sum(c.outcome == 'ok' for c in controls)}/{len(controls)}",
    }
    passed = not any(counts[o] for o in FUZZ_FAILURES)
    details = {
        "must_refuse": sum(c.must_refuse for c in cases),
        "worker_restarts": restarts,
        "per_class": {k: dict(Counter(c.outcome for c in cases if c.klass == k)) for k in classes},
        "failures": [
            {
                "id": c.ident,
                "class": c.klass,
                "base": c.base,
                "mutation": c.mutation,
                "must_refuse": c.must_refuse,
                "outcome": c.outcome,
                "exit": c.code,
                "output": shown_output(c.output),
            }
            for c in [*controls, *cases]
            if c.outcome not in ("ok",)
        ],
    }
    size = f"{len(cases):,} recipes"
    return Row(name, size, figures, passed, below_acceptance(name, len(cases)), details)
