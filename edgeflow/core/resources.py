"""Where built-in and user recipes, targets and pipelines live.

A user's working directory may hold `recipes/`, `targets/` and `pipelines/` folders; their
files shadow the built-ins of the same name. Built-ins sit in `edgeflow/_data/` inside an
installed wheel and at the repository root in a checkout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

Kind = Literal["recipes", "targets", "pipelines", "models"]

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the edgeflow package


def builtin_dir(kind: Kind) -> Path:
    installed = _PACKAGE_DIR / "_data" / kind
    if installed.is_dir():
        return installed
    return _PACKAGE_DIR.parent / kind


def candidate_dirs(kind: Kind, cwd: Path | None = None) -> list[Path]:
    """Where entries of `kind` are looked up, first wins, whether or not each folder is there
    (`edgeflow run`'s up-to-date stamp checks that none has appeared)."""
    return [(cwd or Path.cwd()).resolve() / kind, builtin_dir(kind)]


def search_dirs(kind: Kind, cwd: Path | None = None) -> list[Path]:
    unique: list[Path] = []
    for d in candidate_dirs(kind, cwd):
        if d.is_dir() and d not in unique:
            unique.append(d)
    return unique


def available(kind: Kind, cwd: Path | None = None) -> dict[str, Path]:
    """Name -> YAML file for every entry of `kind`; the working directory's win."""
    found: dict[str, Path] = {}
    for d in reversed(search_dirs(kind, cwd)):
        for path in sorted(d.glob("*.yaml")):
            found[path.stem] = path
    return dict(sorted(found.items()))
