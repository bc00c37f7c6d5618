"""The foreign files, by name: `FILES[name]()` builds one (common.py says what a file holds)."""

from __future__ import annotations

from . import early, recent
from .common import FILES, Foreign, Input

__all__ = ["FILES", "Foreign", "Input", "early", "recent"]
