"""ast.* rules. RULES lists every built-in rule of this level, in catalogue order."""

from __future__ import annotations

from typing import Any

RULES: tuple[type[Any], ...] = ()
