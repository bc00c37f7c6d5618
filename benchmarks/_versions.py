"""The installed versions of the tools a benchmark's figures depend on, for its JSON."""

from __future__ import annotations

from collections.abc import Iterable
from importlib import metadata


def installed(dists: Iterable[str]) -> dict[str, str]:
    """Each distribution's installed version, or "not installed"."""
    found = {}
    for dist in dists:
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = "not installed"
    return found
