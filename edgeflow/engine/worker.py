"""Run one stage in a separate process: `python -m edgeflow.engine.worker JOB.pkl`.

Native converters and runtimes can abort the process (SIGABRT, SIGSEGV); isolating them turns
that into a reported stage failure instead of a dead pipeline. The worker dies with its parent
(a killed `edgeflow run` leaves no worker behind).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

from edgeflow.core.errors import EdgeflowError, InternalError, StageCrashed, StageFailed
from edgeflow.stages.base import StageContext

USER_ERROR_EXIT = 3
INTERNAL_ERROR_EXIT = 4
ERROR_FILE = ".error.json"
LOG_FILE = "worker.log"
PARENT_ENV = "EDGEFLOW_WORKER_PARENT"


def run_isolated(ctx: StageContext) -> None:
    """Run `ctx` in a worker process; raise StageFailed or InternalError if it fails."""
    from edgeflow.engine.tracebacks import write_traceback

    job = ctx.out_dir / ".job.pkl"
    job.write_bytes(pickle.dumps(ctx))
    proc = subprocess.run(  # killed by run() itself when this process is interrupted
        [sys.executable, "-m", "edgeflow.engine.worker", str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        check=False,
        env={**os.environ, PARENT_ENV: str(os.getpid())},
    )
    job.unlink(missing_ok=True)
    error_file = ctx.out_dir / ERROR_FILE
    if proc.returncode == 0:
        return
    where = f"stage '{ctx.stage.name}'"
    if proc.returncode == USER_ERROR_EXIT and error_file.is_file():
        error = json.loads(error_file.read_text())
        raise StageFailed(ctx.stage.name, error["message"], error.get("hint"), error["exit_code"])
    if proc.returncode == INTERNAL_ERROR_EXIT and error_file.is_file():
        error = json.loads(error_file.read_text())
        raise InternalError(error.get("where", where), error["cause"], ctx.out_dir)
    (ctx.out_dir / LOG_FILE).write_text(proc.stdout, encoding="utf-8")
    tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        raise StageCrashed(
            ctx.stage.name,
            f"the worker process was killed by {name} inside a native library; "
            f"its last output:\n{tail}",
            f"this is the tool's crash, not a Python error: see docs/debugging.md "
            f"(the whole output is in {LOG_FILE})",
        )
    write_traceback(ctx.out_dir, f"the worker exited with status {proc.returncode}:\n{tail}")
    raise InternalError(where, f"the worker exited with status {proc.returncode}", ctx.out_dir)


def _die_with_parent() -> None:
    """Ask Linux to kill this process when the `edgeflow` process that started it dies."""
    parent = os.environ.get(PARENT_ENV)
    if not sys.platform.startswith("linux") or not parent:
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != int(parent):  # the parent died before the request took effect
        os._exit(1)


def main(job_path: str) -> int:
    from edgeflow.engine.tracebacks import summary, write_traceback

    _die_with_parent()
    ctx: StageContext = pickle.loads(Path(job_path).read_bytes())  # our own file, just written
    try:
        ctx.stage.run(ctx)
    except EdgeflowError as exc:
        payload = {"message": exc.message, "hint": exc.hint, "exit_code": exc.exit_code}
        (ctx.out_dir / ERROR_FILE).write_text(json.dumps(payload))
        return USER_ERROR_EXIT
    except Exception as exc:
        write_traceback(ctx.out_dir)
        error = {"cause": summary(exc)}
        if isinstance(exc, InternalError):
            error = {"where": exc.where, "cause": exc.cause}
        (ctx.out_dir / ERROR_FILE).write_text(json.dumps(error))
        return INTERNAL_ERROR_EXIT
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
