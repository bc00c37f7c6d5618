"""Holders (edgeflow/engine/owned.py) made by a process that is gone: a killed writer's."""

from __future__ import annotations

import os
from pathlib import Path

from edgeflow.engine import owned


def holder_of_a_dead_process(parent: Path, prefix: str, stripe: str | None = None) -> Path:
    """A holder made by a child process that then exited (its pid is gone)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: make it, say its name, die without cleaning up
        try:
            os.write(write, str(owned.make(parent, prefix, stripe)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        name = f.read().decode()
    os.waitpid(pid, 0)
    assert name, "the child could not make the holder"
    return Path(name)
