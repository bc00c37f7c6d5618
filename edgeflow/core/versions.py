"""The version of one tool, as a stage key records it: a Python distribution's, a Debian
package pattern's (`debian:PATTERN`: Arm NN comes from Debian, not PyPI), or a fact of this
machine that changes what a runtime computes (`host:FACT`, edgeflow.core.host).

Standard library only: `edgeflow run`'s up-to-date check (edgeflow/engine/uptodate.py) asks
again for the versions a build's keys held without importing the engine.
"""

from __future__ import annotations

import functools
import importlib.metadata
import subprocess


def tool_version(name: str) -> str:
    if name.startswith("debian:"):
        return debian_versions(name.removeprefix("debian:"))
    if name.startswith("host:"):
        from edgeflow.core import host

        return host.fact(name.removeprefix("host:"))
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


@functools.cache
def debian_versions(pattern: str) -> str:
    """`package=version` of each installed Debian package matching the pattern."""
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f", "${db:Status-Abbrev}|${Package}|${Version}\\n", pattern],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no dpkg-query)"
    rows = [line.split("|") for line in out.splitlines()]
    installed = sorted(f"{r[1]}={r[2]}" for r in rows if len(r) == 3 and r[0].startswith("ii"))
    return ",".join(installed) or "not installed"
