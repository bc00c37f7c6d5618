"""`edgeflow run`'s up-to-date stamp: a rerun with nothing changed answers without Hydra,
the recipe schema or the stage keys, in a tenth of the time.

A run that ends with every stage run or cached writes a stamp, `<cache>/runs/<key>.json`,
where the key hashes the invocation: the arguments, the working folder, the interpreter
and its `sys.path`, the environment (but for the shell's own bookkeeping, VOLATILE) and
whether stdout and stderr are terminals. The stamp holds everything the run's decisions
read, each checked again by the next run with the same key before it trusts the stamp:

- edgeflow's own files (a hash of the package folder);
- every file and folder a stage key hashed (the recipe's model, weights, data, the user's
  code and what it imports: edgeflow.core.codehash.recording), by content;
- the recipe file, and every YAML file of the folders recipes, targets and pipelines are
  found in (the working folder's and the built-ins; a new file there can shadow one);
- the names in each folder on `sys.path` and in the folder of each hashed file (what an
  import would find: a new module can shadow one), and the `.pth` files that extend it;
- the version of every tool a stage key held (a distribution's, Debian's, a host fact);
- each cache entry the build used: its file record unchanged, and every file as recorded
  there (the check a cache hit makes);
- the build folder: every file in it, by content.

When all of them hold, the run prints what a rerun prints (each stage cached, the stages'
warnings and findings, the build's figures) and exits as the stamped run did. When one does
not hold, or the stamp is missing or unreadable, the run goes the whole way (and writes a
new stamp). A stamp is only ever an answer for the invocation that wrote it; it is never
read for a sweep (`-m`), a `hydra.` override, `edgeflow diff` or `edgeflow fix`.

Standard library only, with edgeflow's hashing and the cache's entry check: the point is
what this module does not import.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import edgeflow
from edgeflow.core import resources
from edgeflow.core.codehash import file_sha256, files_sha256, json_digest, tree_sha256
from edgeflow.engine import console

if TYPE_CHECKING:
    from edgeflow.engine.runner import BuildResult

FORMAT = 1
# Variables a shell changes between two commands that no run reads.
VOLATILE = ("_", "OLDPWD", "PWD", "SHLVL", "COLUMNS", "LINES", console.ENV)
CONFIG_KINDS: tuple[resources.Kind, ...] = ("recipes", "targets", "pipelines")
DEFAULT_CACHE = ".edgeflow/cache"  # hydra_app's cache_dir when the command line sets none
# Names in a folder on sys.path that an import or importlib.metadata can find.
IMPORTABLE = (".py", ".pyc", ".so", ".pyd", ".pth", ".egg-link", ".dist-info", ".egg-info")
PACKAGE = Path(edgeflow.__file__).resolve().parent


@dataclass(frozen=True)
class Invocation:
    """One `edgeflow run ARGS`, taken as it starts (a run may change its environment)."""

    args: tuple[str, ...]
    quiet: bool
    key: str
    stamp: Path

    @classmethod
    def of(cls, args: list[str], quiet: bool) -> Invocation | None:
        """The invocation, or None where no stamp may answer for it: a sweep, a flag, a
        `hydra.` override, a removed key."""
        for arg in args:
            head = arg.partition("=")[0].lstrip("+").split(".")[0].split("/")[0]
            if arg.startswith(("-", "~")) or "=" not in arg or head == "hydra":
                return None
        environment = {k: v for k, v in os.environ.items() if k not in VOLATILE}
        identity = {
            "format": FORMAT,
            "args": args,
            "quiet": quiet,
            "cwd": os.getcwd(),
            "python": [sys.executable, sys.version, sys.path],
            "environment": environment,
            "terminals": [_isatty(sys.stdout), _isatty(sys.stderr)],
        }
        key = json_digest(identity)
        return cls(tuple(args), quiet, key, _cache_root(args) / "runs" / f"{key}.json")

    def replay(self) -> int | None:
        """If the stamp holds, print what a rerun prints and return its exit status; None
        where the run must go the whole way."""
        try:
            stamp = json.loads(self.stamp.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not _readable(stamp) or stamp["key"] != self.key or not _holds(stamp):
            return None
        echo = console.lines("quiet" if self.quiet else "plain")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp["written"]))
        for kind, text in stamp["events"]:
            if kind == "line":
                echo(text)
            elif kind == "stage":
                echo(console.stage_line(text, "cached", 0.0))
            elif kind == "all_cached":
                echo(f"{console.all_cached(int(text))}, nothing changed since {when}")
            else:
                console.say(text)
        for stream, text in stamp["said"]:
            print(text, file=sys.stderr if stream == "err" else sys.stdout, flush=True)
        return int(stamp["exit"])

    def write(
        self, result: BuildResult, hashed: dict[str, str], said: list[tuple[str, str]], code: int
    ) -> None:
        """Stamp a build that ended with every stage run or cached. Nothing is written when
        a file a key hashed is gone or has changed since (the run read an older one)."""
        if any(o.status not in ("ran", "cached") for o in result.outcomes):
            return
        # Left out: edgeflow's own files and the build folder's (the package's hash and the
        # build's check have them), and the copies the run made and removed in the cache and
        # build folders (a stage's output being written, the build folder being published).
        roots = [_cache_root(list(self.args)).resolve(), result.build_dir.parents[1].resolve()]
        files = {
            path: digest
            for path, digest in hashed.items()
            if not any(_within(Path(path), f) for f in (PACKAGE, result.build_dir.resolve()))
            and not (any(_within(Path(path), r) for r in roots) and not os.path.lexists(path))
        }
        if _changed(files):
            return
        folders = set(_path_folders())
        for kind in CONFIG_KINDS:
            for folder in resources.candidate_dirs(kind):
                folders.add(str(folder))
                if folder.is_dir():
                    files.update({str(p): file_sha256(p) for p in sorted(folder.glob("*.yaml"))})
        for value in _argument_values(self.args):
            if value.is_file():
                files[str(value.resolve())] = file_sha256(value)
        files[str(result.loaded.path.resolve())] = file_sha256(result.loaded.path)
        for path_folder in _path_folders():
            for name in _names(Path(path_folder)) or []:
                if name.endswith(".pth") or name.startswith("__editable__"):
                    files[str(Path(path_folder, name))] = file_sha256(Path(path_folder, name))
        folders.update(str(Path(p).parent) for p in files)
        stamp = {
            "format": FORMAT,
            "key": self.key,
            "args": list(self.args),
            "written": time.time(),
            "code": _package_digest(),
            "files": files,
            "folders": {folder: _listing(Path(folder)) for folder in sorted(folders)},
            "versions": result.versions,
            "entries": {str(e): _entry_record(e) for e in result.entries},
            "build": {"folder": str(result.build_dir), "files": _build_files(result.build_dir)},
            "events": result.events,
            "said": said,
            "exit": code,
        }
        _write_atomically(self.stamp, json.dumps(stamp, indent=1))


# The stamp's parts and their JSON types: a stamp of another shape (another edgeflow's,
# an edited one) is not read.
SHAPE = {
    "format": int,
    "key": str,
    "written": float,
    "code": str,
    "files": dict,
    "folders": dict,
    "versions": dict,
    "entries": dict,
    "build": dict,
    "events": list,
    "said": list,
    "exit": int,
}


def _readable(stamp: Any) -> bool:
    return (
        isinstance(stamp, dict)
        and all(isinstance(stamp.get(k), t) for k, t in SHAPE.items())
        and stamp["format"] == FORMAT
        and isinstance(stamp["build"].get("folder"), str)
        and isinstance(stamp["build"].get("files"), dict)
        and all(
            isinstance(e, list) and len(e) == 2 and all(isinstance(t, str) for t in e)
            for e in (*stamp["events"], *stamp["said"])
        )
    )


def _holds(stamp: dict[str, Any]) -> bool:
    """Whether everything the stamped run read is as it was, cheapest checks first."""
    from edgeflow.core.versions import tool_version
    from edgeflow.engine.cache import check_entry

    if stamp["code"] != _package_digest():
        return False
    if any(_listing(Path(f)) != names for f, names in stamp["folders"].items()):
        return False
    if _changed(stamp["files"]):
        return False
    if any(tool_version(name) != found for name, found in stamp["versions"].items()):
        return False
    for entry, record in stamp["entries"].items():
        if _entry_record(Path(entry)) != record or check_entry(Path(entry)) is not None:
            return False
    build = stamp["build"]
    return bool(_build_files(Path(build["folder"])) == build["files"])


def _changed(files: dict[str, str]) -> bool:
    for path, digest in files.items():
        try:
            now = tree_sha256(Path(path)) if path.endswith("/") else file_sha256(Path(path))
        except OSError:
            return True
        if now != digest:
            return True
    return False


def _listing(folder: Path) -> str | None:
    """A hash of the names in a folder that an import or a YAML lookup could find; None
    where the folder is not there."""
    names = _names(folder)
    if names is None:
        return None
    found = sorted(n for n in names if n.isidentifier() or n.endswith((*IMPORTABLE, ".yaml")))
    return json_digest(found)


def _names(folder: Path) -> list[str] | None:
    try:
        return os.listdir(folder)
    except OSError:
        return None


def _path_folders() -> list[str]:
    return [str(Path(p or ".").resolve()) for p in sys.path if Path(p or ".").is_dir()]


def _argument_values(args: Iterable[str]) -> list[Path]:
    """Each value on the command line, split at commas, as a path (`recipe=my.yaml`)."""
    return [Path(v) for a in args for v in a.partition("=")[2].split(",") if v]


def _cache_root(args: list[str]) -> Path:
    given = [a.partition("=")[2] for a in args if a.partition("=")[0].lstrip("+") == "cache_dir"]
    return Path(given[-1] if given else DEFAULT_CACHE)


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _package_digest() -> str:
    """A hash of every file of edgeflow's own package (its data too) but compiled bytecode."""
    return json_digest(files_sha256(PACKAGE))


def _entry_record(entry: Path) -> str | None:
    from edgeflow.engine.cache import ENTRY_FILE

    try:
        return file_sha256(entry / ENTRY_FILE)
    except OSError:
        return None


def _build_files(folder: Path) -> dict[str, str]:
    if not folder.is_dir():
        return {}
    return {
        p.relative_to(folder).as_posix(): file_sha256(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _write_atomically(path: Path, text: str) -> None:
    """Write the stamp, or nothing: a cache folder this run cannot write to (a team's
    shared one) only means that the next run goes the whole way."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
