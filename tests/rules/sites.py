"""What rule tests compare in a result: each site's status and where, never a message's wording."""

from __future__ import annotations

import inspect
from typing import Any

from edgeflow.rules.base import RuleResult, Status


def outcomes(result: RuleResult[Any]) -> list[tuple[str, str]]:
    """(status, where) of each site, in order."""
    return [(site.status.value, site.where) for site in result.sites]


def wheres(result: RuleResult[Any], status: Status) -> list[str]:
    """Where the sites of one status are, in order."""
    return [site.where for site in result.sites_of(status)]


def line_of(obj: Any, text: str, nth: int = 0) -> str:
    """'file.py:N' of the `nth` line of obj's source that holds `text`: an ast site's where."""
    lines, first = inspect.getsourcelines(obj)
    found = [first + i for i, line in enumerate(lines) if text in line]
    return f"{inspect.getsourcefile(obj)}:{found[nth]}"
