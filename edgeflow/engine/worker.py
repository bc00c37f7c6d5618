"""Run one stage in a separate process: `python -m edgeflow.engine.worker JOB.pkl`.

Native converters and runtimes can abort the process (SIGABRT, SIGSEGV); isolating them turns
that into a reported stage failure instead of a dead pipeline.
"""

from __future__ import annotations

import json
import pickle
import signal
import subprocess
import sys
import traceback
from pathlib import Path

from edgeflow.engine.stage import StageContext
from edgeflow.errors import EdgeflowError, StageFailed

USER_ERROR_EXIT = 3


def run_isolated(ctx: StageContext) -> None:
    """Run `ctx` in a worker process; raise StageFailed with the reason if it fails."""
    job = ctx.out_dir / ".job.pkl"
    job.write_bytes(pickle.dumps(ctx))
    proc = subprocess.run(
        [sys.executable, "-m", "edgeflow.engine.worker", str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        check=False,
    )
    job.unlink(missing_ok=True)
    error_file = ctx.out_dir / ".error.json"
    if proc.returncode == 0:
        return
    if proc.returncode == USER_ERROR_EXIT and error_file.is_file():
        error = json.loads(error_file.read_text())
        raise StageFailed(ctx.stage.name, error["message"], error.get("hint"), error["exit_code"])
    tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        raise StageFailed(
            ctx.stage.name,
            f"the worker process was killed by {name} inside a native library; "
            f"its last output:\n{tail}",
            "this is the tool's crash, not a Python error: see docs/debugging.md",
        )
    raise StageFailed(ctx.stage.name, f"internal error (a bug, please report it):\n{tail}")


def main(job_path: str) -> int:
    ctx: StageContext = pickle.loads(Path(job_path).read_bytes())  # our own file, just written
    try:
        ctx.stage.run(ctx)
    except EdgeflowError as exc:
        payload = {"message": exc.message, "hint": exc.hint, "exit_code": exc.exit_code}
        (ctx.out_dir / ".error.json").write_text(json.dumps(payload))
        return USER_ERROR_EXIT
    except Exception:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
