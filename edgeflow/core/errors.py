"""Exception types: user errors are EdgeflowError subclasses; InternalError is a bug.

Exit statuses of `edgeflow`: 0 verified (or nothing to verify), 1 a threshold missed, a tool
crashed or a bug in edgeflow, 2 a problem that is the user's to fix, 3 built but NOT VERIFIED
(the runtime is absent here) unless `verify.allow_unverified` is set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EXIT_FAILED = 1
EXIT_USER = 2
EXIT_NOT_VERIFIED = 3


def first_line(exc: BaseException) -> str:
    """An exception's first line of text (a third-party tool's errors run to pages), or its
    type when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class EdgeflowError(Exception):
    """A problem the user can fix; printed without a traceback, exit status 2."""

    exit_code = EXIT_USER

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        return self.message + (f"\nhint: {self.hint}" if self.hint else "")


class AtRecipeKey(EdgeflowError):
    """A recipe value only a stage can judge (it takes the model's outputs), at the dotted
    key that sets it: the engine prints it at that key's place in the recipe file."""

    def __init__(self, key: str, message: str, hint: str | None = None) -> None:
        super().__init__(f"{key}: {message}", hint)
        self.key, self.problem = key, message


@dataclass(frozen=True)
class Problem:
    """One located problem in a YAML file: `file:line:col: key: message (got value)`."""

    file: str
    line: int
    col: int
    key: str
    message: str
    hint: str | None = None

    def render(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}" if self.line else self.file
        text = f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"
        return text + (f"\n  hint: {self.hint}" if self.hint else "")


class RecipeError(EdgeflowError):
    """A recipe (or target profile) failed validation; carries every problem found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(p.render() for p in problems))

    def render(self) -> str:
        n = len(self.problems)
        return self.message + f"\n{n} problem{'s' if n != 1 else ''} found."


class StageFailed(EdgeflowError):
    """A pipeline stage raised or its worker crashed; nothing of it was cached."""

    exit_code = EXIT_FAILED

    def __init__(
        self, stage: str, reason: str, hint: str | None = None, exit_code: int = EXIT_FAILED
    ) -> None:
        self.stage = stage
        self.reason = reason
        self.exit_code = exit_code  # 2 when the cause is the user's to fix (e.g. a missing tool)
        super().__init__(f"stage '{stage}' failed: {reason}", hint)


class StageCrashed(StageFailed):
    """A stage's worker process died inside a native library (SIGABRT, SIGSEGV, ...)."""

    details: Path | None = None  # where the stage's partial output and log were kept

    def render(self) -> str:
        kept = f"\n  the stage's output and log: {self.details}" if self.details else ""
        return super().render() + kept


class ToolCrashed(EdgeflowError):
    """A native tool (a converter or runtime) crashed or aborted; reported with its own text."""

    exit_code = 1


class MissingDependency(EdgeflowError):
    """An optional tool is not installed."""

    def __init__(self, what: str, package: str, extra: str | None = None) -> None:
        how = f"pip install 'edgeflow[{extra}]'" if extra else f"pip install {package}"
        super().__init__(f"{what} needs {package}: install it with {how}")


class InternalError(Exception):
    """An unexpected exception inside edgeflow: a bug, never the user's mistake (exit 1).

    `where` names the stage or rule; `details` is the folder holding the full chained
    traceback (traceback.txt) and whatever the stage had written when it failed.
    """

    exit_code = EXIT_FAILED

    def __init__(self, where: str, cause: str, details: Path | None = None) -> None:
        super().__init__(f"internal error in {where} (a bug in edgeflow): {cause}")
        self.where, self.cause, self.details = where, cause, details

    def render(self) -> str:
        text = str(self)
        if self.details is not None:
            text += f"\n  full traceback: {self.details / TRACEBACK_FILE}"
        return text + "\nhint: please report it with that file"


TRACEBACK_FILE = "traceback.txt"


class Interrupted(BaseException):
    """SIGTERM or Ctrl-C: unwinds like KeyboardInterrupt, so every stage cleans up after it."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name
