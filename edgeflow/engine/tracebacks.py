"""Full tracebacks of bugs, kept in files beside the failed stage's output."""

from __future__ import annotations

import traceback
from pathlib import Path

from edgeflow.core.errors import TRACEBACK_FILE


def write_traceback(folder: Path, text: str | None = None) -> Path:
    """Write the exception being handled (with its chain), or `text`, to folder/traceback.txt."""
    path = folder / TRACEBACK_FILE
    path.write_text(text if text is not None else traceback.format_exc(), encoding="utf-8")
    return path


def summary(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
