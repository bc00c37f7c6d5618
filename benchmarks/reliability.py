"""Measure whether edgeflow's cache, verdict and errors can be trusted, with the real CLI.

The acceptance benchmark of the issues "Trust the cache, the verdict and the errors" and "Never
delete what edgeflow did not create, never call what a recipe did not mean to call". Parts:

- fuzz: generated mutations of the shipped recipes (wrong types, booleans where numbers go,
  unknown keys, missing keys, extreme numbers, encodings, deep nesting, aliases, junk bytes,
  files, code references), each through `edgeflow validate` in a long-lived worker process.
  Required: 0 tracebacks, 0 hangs, 0 invalid recipes accepted (unlocated messages are counted).
- kill: cold demo builds SIGKILLed (the whole process group) at random moments on one shared
  cache until 50 kills have landed in a running build (each build is kept cold by deleting the
  complete entries before it, while everything killed builds leave stays), then the build run
  to completion there: exit 0, "verified", model.ort byte-identical to a clean build's, no
  partial or orphaned entry, temporary folder or lock file, no lock wait, no process left.
- signals: SIGTERM to the edgeflow process, SIGINT to its process group (Ctrl-C), at random
  moments of cold builds: exit within 10 s, no traceback, no worker and no temporary folder left.
- concurrent: builds started at once on one fresh cache: all exit 0, load, rewrite and export
  each ran once, every entry complete, a rerun fully cached and verified.
- untrusted: hostile or broken weights, datasets and ONNX files given to valid recipes: no code
  runs, exit status 2, the message names the file.
- ownership: user folders and files beside the cache's and build's own (named like them), and
  symlinks out: survive runs and kills (0 lost, 0 outside touched); a symlinked cache_dir.
- references: standard-library callables in every reference slot: nothing runs, located exit 2.
- savedmodels: SavedModels with I/O ops: no I/O runs, exit 2 naming the op.
- onnx: 33 malformed ONNX files through validate, precheck and run: no traceback, nothing read
  outside the model's folder, peak RSS under 3 GB, exit 2 naming the file.
- fuzzkeys: the fuzz of the recipe keys added since the last round (1,000 cases).

Prints one table (one row per check, pass/FAIL) and exits 1 if any check fails. The defaults
are the acceptance sizes (about 15 minutes on a 2-core machine, docs/reliability.md):

    python benchmarks/reliability.py [--only fuzz,kill,...,onnx,fuzzkeys]
        [--fuzz 1000] [--kills 50] [--signals 6] [--concurrent 8] [--untrusted N]
        [--ownership 9] [--references N] [--onnx N] [--fuzz-keys 1000]
        [--json PATH] [--keep DIR] [--repo PATH]

A quick run: --fuzz 60 --kills 3 --signals 2 --concurrent 3 --untrusted 10 --ownership 4
--references 10 --onnx 8 --fuzz-keys 100.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the _reliability package beside us

from _reliability.common import BenchError, Row, Settings, render_table, say
from _reliability.concurrent import part_concurrent
from _reliability.fuzz_run import part_fuzz, part_fuzz_keys
from _reliability.kill import part_kill
from _reliability.onnx_files import part_onnx
from _reliability.ownership import part_ownership
from _reliability.references import part_references
from _reliability.savedmodels import part_savedmodels
from _reliability.signals import part_signals
from _reliability.untrusted import part_untrusted

REPO = Path(__file__).resolve().parent.parent
PARTS = (
    "fuzz",
    "kill",
    "signals",
    "concurrent",
    "untrusted",
    "ownership",
    "references",
    "savedmodels",
    "onnx",
    "fuzzkeys",
)

RUNNERS: dict[str, Callable[[Settings], list[Row]]] = {
    "fuzz": part_fuzz,
    "kill": part_kill,
    "signals": part_signals,
    "concurrent": part_concurrent,
    "untrusted": part_untrusted,
    "ownership": part_ownership,
    "references": part_references,
    "savedmodels": part_savedmodels,
    "onnx": part_onnx,
    "fuzzkeys": part_fuzz_keys,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options; an unknown part is a usage error."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", default=",".join(PARTS), help="comma-separated parts")
    parser.add_argument("--fuzz", type=int, default=1000, help="generated recipes")
    parser.add_argument("--kills", type=int, default=50, help="SIGKILLed builds")
    parser.add_argument("--signals", type=int, default=6, help="builds per signal")
    parser.add_argument("--concurrent", type=int, default=8, help="builds started at once")
    parser.add_argument("--untrusted", type=int, default=0, help="untrusted cases (0: all)")
    parser.add_argument("--fuzz-keys", type=int, default=1000, help="recipes of the new keys")
    parser.add_argument("--ownership", type=int, default=9, help="demo runs beside user files")
    parser.add_argument("--references", type=int, default=0, help="reference cases (0: all)")
    parser.add_argument("--onnx", type=int, default=0, help="malformed ONNX kinds (0: all)")
    parser.add_argument("--onnx-timeout", type=float, default=120.0, help="s per ONNX command")
    parser.add_argument("--case-timeout", type=float, default=20.0, help="s per fuzz case")
    parser.add_argument("--timeout", type=float, default=1800.0, help="s per build")
    parser.add_argument("--untrusted-timeout", type=float, default=300.0, help="s per case")
    parser.add_argument("--fuzz-memory-mb", type=int, default=4096, help="fuzz worker limit")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    parser.add_argument("--keep", type=Path, help="keep the generated files in this folder")
    parser.add_argument("--repo", type=Path, default=REPO, help="the edgeflow checkout")
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    return args


def code_stamp(repo: Path) -> tuple[float, int]:
    """The newest modification time and the number of edgeflow's source files: when these
    change during a run, stage keys change with them and the cache figures are not valid."""
    files = list((repo / "edgeflow").rglob("*.py"))
    return max((f.stat().st_mtime for f in files), default=0.0), len(files)


def run_part(s: Settings, name: str) -> list[Row]:
    """Run one part; a set-up failure becomes a FAIL row instead of stopping the others."""
    say(f"\n== {name}")
    start = time.perf_counter()
    try:
        rows = RUNNERS[name](s)
    except BenchError as exc:
        say(f"{name}: cannot measure: {exc}")
        rows = [Row(name, "-", {"error": str(exc)}, False)]
    say(f"{name}: {time.perf_counter() - start:.0f} s")
    return rows


def write_json(path: Path, rows: list[Row], args: argparse.Namespace, changed: bool) -> None:
    """The figures, the verdicts and the failing examples, as JSON."""
    data = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "code_changed_during_run": changed,
        "passed": all(r.passed for r in rows),
        "checks": [
            {
                "check": r.check,
                "size": r.size,
                "figures": r.figures,
                "passed": r.passed,
                "note": r.note,
                "details": r.details,
            }
            for r in rows
        ],
    }
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Run the chosen parts, print the table (and write the JSON); 1 if any check fails."""
    args = parse_args(argv)
    args.repo = args.repo.resolve()
    sys.path.insert(0, str(args.repo))  # this checkout's edgeflow, here and in the fuzz worker
    parts = [p for p in PARTS if p in args.only.split(",")]
    with contextlib.ExitStack() as stack:
        if args.keep:
            work = args.keep.resolve()
            work.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix="reliability-", dir=work))
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="reliability-")))
        s = Settings(args.repo, work, args)
        stamp = code_stamp(args.repo)
        rows = [row for name in parts for row in run_part(s, name)]
        changed = code_stamp(args.repo) != stamp
        if changed:
            say(f"\nwarning: {args.repo}/edgeflow changed during the run: stage keys changed")
            say("  with it, so the kill and concurrent figures are not valid; run it again")
        if args.keep:
            say(f"\ngenerated files kept in {work}")
    print("\n" + render_table(rows))
    if args.json:
        write_json(args.json, rows, args, changed)
    return 0 if all(r.passed for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
