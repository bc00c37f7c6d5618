"""Exception types: user errors are EdgeflowError subclasses; anything else is a bug."""

from __future__ import annotations

from dataclasses import dataclass


class EdgeflowError(Exception):
    """A problem the user can fix; printed without a traceback, exit status 2."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        return self.message + (f"\nhint: {self.hint}" if self.hint else "")


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

    exit_code = 1

    def __init__(
        self, stage: str, reason: str, hint: str | None = None, exit_code: int = 1
    ) -> None:
        self.stage = stage
        self.reason = reason
        self.exit_code = exit_code  # 2 when the cause is the user's to fix (e.g. a missing tool)
        super().__init__(f"stage '{stage}' failed: {reason}", hint)


class VerificationFailed(EdgeflowError):
    """The artifact was built but misses one or more of the recipe's verify thresholds."""

    exit_code = 1


class ToolCrashed(EdgeflowError):
    """A native tool (a converter or runtime) crashed or aborted; reported with its own text."""

    exit_code = 1


class MissingDependency(EdgeflowError):
    """An optional tool is not installed."""

    def __init__(self, what: str, package: str, extra: str | None = None) -> None:
        how = f"pip install 'edgeflow[{extra}]'" if extra else f"pip install {package}"
        super().__init__(f"{what} needs {package}: install it with {how}")
