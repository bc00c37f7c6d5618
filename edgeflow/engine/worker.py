"""Run stages in a worker process: `python -m edgeflow.engine.worker LABEL FD`.

Native converters and runtimes can abort the process (SIGABRT, SIGSEGV); isolating them turns
that into a reported stage failure instead of a dead pipeline. One worker is started when the
first isolated stage of a build runs and is reused by the stages after it (it imports torch,
onnxruntime, TensorFlow once, not once per stage): the parent sends it the path of a pickled
StageContext over a socket and gets the outcome back. A worker that dies is replaced by a new
one for the next stage. The worker dies with its parent (a killed `edgeflow run` leaves no
worker behind), and everything the stage's tools print goes to a log that the parent keeps
only when the worker died (worker.log beside the stage's output): the worker writes there,
unbuffered, which stage it runs, and at a fatal signal Python's faulthandler adds every
thread's stack, so a crash inside a native library leaves its last words in the log. What
the stage reports of its progress (edgeflow.core.progress) comes back over the same socket
when a sink listens in the parent (the job's message says so), as events the parent hands
on to its own sink until the stage's outcome arrives.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from edgeflow.core import progress
from edgeflow.core.errors import EdgeflowError, InternalError, StageCrashed, StageFailed
from edgeflow.core.loader import relocated
from edgeflow.stages.base import StageContext

JOB_FILE = ".job.pkl"
LOG_FILE = "worker.log"
PARENT_ENV = "EDGEFLOW_WORKER_PARENT"
PROGRESS = "progress"  # the `kind` of a message that carries a progress event, not an outcome


class Worker:
    """A warm worker process, started on first use; `run` raises what the stage raised
    (StageFailed for a user error, InternalError for a bug, StageCrashed for a native crash).

    `label` appears on the worker's command line (the cache folder it works for), so that
    `pgrep -f` finds it."""

    def __init__(self, label: Path | str) -> None:
        self.label = str(label)
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Any = None
        self._log: IO[bytes] | None = None
        self._context: tuple[str, dict[str, str]] | None = None  # cwd and environment
        self.started = 0  # how many processes this worker has started (a crash restarts it)
        self.cpu_seconds: list[tuple[str, float]] = []  # per stage run, for benchmarks

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, ctx: StageContext) -> None:
        """Run `ctx` in the worker process; raise StageFailed or InternalError if it fails."""
        from edgeflow.engine.tracebacks import write_traceback

        job = ctx.out_dir / JOB_FILE
        job.write_bytes(pickle.dumps(ctx))
        try:
            conn = self._ready()
            assert self._log is not None
            os.ftruncate(self._log.fileno(), 0)  # this stage's output only
            try:
                conn.send({"job": str(job), "progress": progress.enabled()})
                reply = conn.recv()
                while reply["kind"] == PROGRESS:  # the stage's progress, then its outcome
                    progress.relay(progress.Event.from_dict(reply["event"]))
                    reply = conn.recv()
            except (EOFError, OSError):  # the worker died
                reply = None
        except BaseException:  # Ctrl-C, SIGTERM: the stage's tools stop with this process
            self._kill()
            raise
        finally:
            job.unlink(missing_ok=True)
        if reply is not None:
            self.cpu_seconds.append((ctx.stage.name, reply["cpu_seconds"]))
            _raise_reply(reply, ctx)
            return
        code, output = self._died()
        (ctx.out_dir / LOG_FILE).write_text(output, encoding="utf-8")
        tail = "\n".join(output.strip().splitlines()[-15:])
        if code < 0:
            name = signal.Signals(-code).name
            raise StageCrashed(
                ctx.stage.name,
                f"the worker process was killed by {name} inside a native library; "
                f"its last output:\n{tail}",
                f"this is the tool's crash, not a Python error: see docs/debugging.md "
                f"(the whole output is in {LOG_FILE})",
            )
        where = f"stage '{ctx.stage.name}'"
        write_traceback(ctx.out_dir, f"the worker exited with status {code}:\n{tail}")
        raise InternalError(where, f"the worker exited with status {code}", ctx.out_dir)

    def close(self) -> None:
        """Stop the worker (it exits when its socket closes) and wait for it."""
        proc, self._proc = self._proc, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _ready(self) -> Any:
        """The connection to a live worker that sees this process's working folder and
        environment (a new one when they changed, as a new process would see them)."""
        context = (os.getcwd(), dict(os.environ))
        if self._proc is not None and (self._proc.poll() is not None or context != self._context):
            self.close()
        if self._proc is None:
            self._start(context)
        return self._conn

    def _start(self, context: tuple[str, dict[str, str]]) -> None:
        import socket
        from multiprocessing.connection import Connection

        ours, theirs = socket.socketpair()
        env = {**os.environ, PARENT_ENV: str(os.getpid())}
        self._log = tempfile.TemporaryFile(prefix="edgeflow-worker-")  # noqa: SIM115 (closed by close())
        flags = fcntl.fcntl(self._log.fileno(), fcntl.F_GETFL)
        fcntl.fcntl(self._log.fileno(), fcntl.F_SETFL, flags | os.O_APPEND)  # shared with it
        try:
            self._proc = subprocess.Popen(
                # -u: what the stage printed is in the log before a crash, not in a buffer
                [
                    sys.executable,
                    "-u",
                    "-m",
                    "edgeflow.engine.worker",
                    self.label,
                    str(theirs.fileno()),
                ],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                pass_fds=[theirs.fileno()],
                env=env,
            )
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        self._context = context
        self.started += 1

    def _kill(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.kill()
        self.close()

    def _died(self) -> tuple[int, str]:
        """The dead worker's exit status and output; the next stage starts a new one."""
        assert self._proc is not None and self._log is not None
        code = self._proc.wait()
        size = os.fstat(self._log.fileno()).st_size
        output = os.pread(self._log.fileno(), size, 0).decode("utf-8", errors="replace")
        self.close()
        return code, output


def _raise_reply(reply: dict[str, Any], ctx: StageContext) -> None:
    if reply["kind"] == "failed":
        raise StageFailed(reply["stage"], reply["reason"], reply["hint"], reply["exit_code"])
    if reply["kind"] == "internal":
        raise InternalError(reply["where"], reply["cause"], ctx.out_dir)


_session: Worker | None = None


@contextlib.contextmanager
def session() -> Iterator[None]:
    """One worker for every build run inside (the jobs of a sweep in one process); builds
    outside a session each start their own."""
    global _session
    if _session is not None:
        yield
        return
    _session = Worker("")
    try:
        yield
    finally:
        worker, _session = _session, None
        worker.close()


@contextlib.contextmanager
def for_build(label: Path | str) -> Iterator[Worker]:
    """The session's worker, or one for this build alone."""
    if _session is not None:
        _session.label = _session.label or str(label)  # the first build's cache names it
        yield _session
        return
    with Worker(label) as worker:
        yield worker


def run_isolated(ctx: StageContext) -> None:
    """Run `ctx` in a worker process of its own; raise StageFailed or InternalError if it fails."""
    with Worker(ctx.out_dir.parent) as worker:
        worker.run(ctx)


def _die_with_parent() -> None:
    """Ask Linux to kill this process when the `edgeflow` process that started it dies."""
    parent = os.environ.pop(PARENT_ENV, None)
    if not sys.platform.startswith("linux") or not parent:
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != int(parent):  # the parent died before the request took effect
        os._exit(1)


def _log_crashes() -> None:
    """At SIGSEGV, SIGABRT, SIGBUS, SIGFPE or SIGILL, write every thread's Python stack to the
    log (stderr) before the process dies of the signal; line-buffer the C library's stdout so
    that a native tool's last printed lines are there too."""
    import faulthandler

    faulthandler.enable(file=sys.stderr, all_threads=True)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None)
        line_buffered = 1  # _IOLBF
        libc.setvbuf(ctypes.c_void_p.in_dll(libc, "stdout"), None, line_buffered, 0)


def run_job(job_path: Path) -> dict[str, Any]:
    """Run one pickled StageContext; the outcome as the parent rebuilds it."""
    from edgeflow.engine.tracebacks import summary, write_traceback

    ctx: StageContext = pickle.loads(job_path.read_bytes())  # our own file, just written
    print(
        f"edgeflow worker {os.getpid()}: stage '{ctx.stage.name}' ({ctx.out_dir})", file=sys.stderr
    )
    try:
        ctx.stage.run(ctx)
    except StageFailed as exc:
        return {
            "kind": "failed",
            "stage": exc.stage,
            "reason": exc.reason,
            "hint": exc.hint,
            "exit_code": exc.exit_code,
        }
    except EdgeflowError as exc:
        exc = relocated(exc, ctx.loaded.path)
        return {
            "kind": "failed",
            "stage": ctx.stage.name,
            "reason": exc.message,
            "hint": exc.hint,
            "exit_code": exc.exit_code,
        }
    except Exception as exc:
        write_traceback(ctx.out_dir)
        if isinstance(exc, InternalError):
            return {"kind": "internal", "where": exc.where, "cause": exc.cause}
        return {"kind": "internal", "where": f"stage '{ctx.stage.name}'", "cause": summary(exc)}
    return {"kind": "ok"}


def _cpu_seconds() -> float:
    """User and system CPU time of this process and of its children that have ended."""
    import resource

    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(fd: int) -> None:
    """Serve jobs until the parent closes the socket. Each job runs in the working folder
    and environment the parent sent, as in a process of its own."""
    from multiprocessing.connection import Connection

    _die_with_parent()
    _log_crashes()
    _serve(Connection(fd))
    # Nothing is left to write: skip the interpreter's teardown of torch, TensorFlow, ...
    # (about half a second of CPU).
    os._exit(0)


class _Progress:
    """The worker's progress sink: each event to the parent over the job's socket, from any
    thread of this process (a process forked from it, which shares the socket, sends
    nothing: its messages would interleave with this one's)."""

    def __init__(self, conn: Any) -> None:
        self.conn, self.pid, self.lock = conn, os.getpid(), threading.Lock()

    def __call__(self, event: progress.Event) -> None:
        if os.getpid() != self.pid:
            return
        with self.lock:
            self.conn.send({"kind": PROGRESS, "event": event.to_dict()})


def _serve(conn: Any) -> None:
    """Run jobs until the parent closes the socket; their progress goes to the parent when
    a sink listens there."""
    home, environ, sink = os.getcwd(), dict(os.environ), _Progress(conn)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        start = _cpu_seconds()
        try:
            with progress.installed(sink) if message["progress"] else contextlib.nullcontext():
                reply = run_job(Path(message["job"]))
        except SystemExit as exc:  # a tool that exits the process: it ends here as it would
            sys.stdout.flush()
            sys.stderr.flush()
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
            os._exit(code)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            if os.getcwd() != home:
                os.chdir(home)
            if os.environ != environ:
                os.environ.clear()
                os.environ.update(environ)
        conn.send({**reply, "cpu_seconds": _cpu_seconds() - start})


if __name__ == "__main__":
    main(int(sys.argv[2]))
