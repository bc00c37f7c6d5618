"""Temporary folders edgeflow makes beside other people's files, and the proof they are its own.

Every temporary folder edgeflow makes (the cache's `tmp/` folders, a publish's `.tmp-` and
`.old-` folders, a DVC stage's `.work-` folder) is a *holder*: a new folder (never one that
already existed), into which `.edgeflow-owner.json` is written at once, atomically (a rename):
the creating process (pid and host), a random token, the time, and the folder's names. What a
holder carries lives in it under `content/`, moved in and out by renames, so the marker never
travels into a cache entry or a build folder.

edgeflow removes a folder only when it carries a valid marker that names that very folder, and
only where the folder is a real folder (not a symbolic link) directly inside the folder it was
looked for in; the marker goes last, so a removal cut short is finished by the next one. A
folder without a valid marker is left alone, whatever its name. Whether a holder's process is
gone is for the caller to judge (`Owner.dead`, and the cache's key locks); a holder of another
host is never judged dead.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from edgeflow.core.errors import EdgeflowError

MARKER = ".edgeflow-owner.json"
CONTENT = "content"
HOST = socket.gethostname()
_TOKEN = re.compile(r"[0-9a-f]{32}")
_STRIPE = re.compile(r"[0-9a-f]{2}")


@dataclass(frozen=True)
class Owner:
    """What a folder's marker says of the process that made it."""

    pid: int
    host: str
    token: str
    created: float
    names: tuple[str, ...]
    stripe: str | None  # the cache's key stripe whose lock its writer held, if any

    def mine(self) -> bool:
        return self.pid == os.getpid() and self.host == HOST

    def dead(self) -> bool:
        """Whether its process is provably gone (on this host, no process of its pid)."""
        return self.host == HOST and not alive(self.pid)


def make(parent: Path, prefix: str, stripe: str | None = None) -> Path:
    """A new holder `<parent>/<prefix>-<pid>-<token[:8]>`, its marker already written."""
    token = secrets.token_hex(16)
    folder = parent / f"{prefix}-{os.getpid()}-{token[:8]}"
    folder.mkdir()  # FileExistsError rather than taking over a folder that is there
    mark(folder, token=token, stripe=stripe)
    return folder


def mark(folder: Path, new_name: str | None = None, **fields: object) -> None:
    """Write the marker of a folder this process made, atomically; `new_name`: add the name
    the folder is about to be renamed to (the old name stays valid until the rename)."""
    found = read(folder)
    names = list(found.names) if found is not None else [folder.name]
    record: dict[str, object] = {
        "pid": os.getpid(),
        "host": HOST,
        "token": secrets.token_hex(16),
        "created": time.time(),
        "stripe": None,
    }
    if found is not None:
        record.update(pid=found.pid, host=found.host, token=found.token, created=found.created)
        record.update(stripe=found.stripe)
    record.update(fields)
    record["names"] = [*names, new_name] if new_name is not None else names
    part = folder / f"{MARKER}.{secrets.token_hex(4)}"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    os.replace(part, folder / MARKER)


def read(folder: Path) -> Owner | None:
    """The owner a folder's marker proves (None: a link, a file, or no valid marker)."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return None
        fd = os.open(folder / MARKER, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            record = json.loads(f.read(64 * 1024))
    except (OSError, ValueError):
        return None
    try:
        owner = Owner(
            pid=record["pid"],
            host=record["host"],
            token=record["token"],
            created=float(record["created"]),
            names=tuple(record["names"]),
            stripe=record.get("stripe"),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    valid = (
        isinstance(owner.pid, int)
        and owner.pid > 0
        and isinstance(owner.host, str)
        and isinstance(owner.token, str)
        and _TOKEN.fullmatch(owner.token) is not None
        and all(isinstance(n, str) for n in owner.names)
        and folder.name in owner.names
        and (owner.stripe is None or _STRIPE.fullmatch(str(owner.stripe)) is not None)
    )
    return owner if valid else None


def remove(folder: Path, within: Path) -> bool:
    """Remove `folder` if it is provably edgeflow's: a real folder directly inside `within`
    (no symbolic link on the way), with a valid marker. Returns whether it is gone; a folder
    that is not provably ours is left as it is."""
    if folder.parent != within or read(folder) is None:
        return False
    if os.path.realpath(folder) != os.path.join(os.path.realpath(within), folder.name):
        return False  # reached through a link: not ours to judge
    try:
        for child in os.scandir(folder):
            if child.name == MARKER:
                continue
            if child.is_dir(follow_symlinks=False):
                shutil.rmtree(child.path, ignore_errors=True)  # never follows a link inside
            else:
                os.unlink(child.path)
        if os.listdir(folder) != [MARKER]:
            return False  # something could not be removed: the marker stays for the next try
        os.unlink(folder / MARKER)
        os.rmdir(folder)
    except FileNotFoundError:  # another process removed it first
        pass
    except OSError:
        return False  # not removable here (permissions): left for whoever can
    return not os.path.lexists(folder)


def lock(path: Path, timeout: float = -1) -> FileLock:
    """A lock file at `path`; a folder or a link there (not edgeflow's) is refused, not used."""
    if os.path.islink(path) or (os.path.lexists(path) and not path.is_file()):
        what = "a symbolic link" if os.path.islink(path) else "not a file"
        raise EdgeflowError(
            f"{path} is {what}, where edgeflow keeps a lock file",
            f"move {path} away (edgeflow makes the file again)",
        )
    return FileLock(str(path), timeout=timeout)


def alive(pid: int) -> bool:
    """Whether a process of this pid exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
