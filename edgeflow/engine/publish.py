"""Publishing a build folder (build/<recipe>/<target>-<mode>/) without destroying anything
edgeflow did not write.

The folder is replaced as a whole by renames, under a lock per build. It records what edgeflow
wrote (`.edgeflow-build.json`: the recipe file, and each file's sha256), so a later publish can
tell its own files from the user's: files the user put there are carried into the new folder;
an edgeflow file the user changed, or a user file of the name edgeflow is about to write, stops
the publish (exit 2, naming the files). A build folder made from another recipe file of the same
stem (a/model.yaml and b/model.yaml) is refused, not replaced. The temporary and old folders a
killed publish leaves behind are removed (or, for an old folder, put back) by the next one:
they are holders (edgeflow/engine/owned.py), and a folder beside the build without edgeflow's
ownership marker is never touched, whatever its name.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from edgeflow.core.codehash import file_sha256
from edgeflow.core.errors import EdgeflowError
from edgeflow.engine import owned

RECORD = ".edgeflow-build.json"


def publish(build_dir: Path, files: dict[str, Path], recipe: Path) -> None:
    """Replace the build folder with copies of the published files (a file, or a folder's
    files, per slot) and the user's own files, atomically."""
    from edgeflow.engine.cache import ENVIRONMENT_ERRNOS

    try:
        _publish(build_dir, files, recipe)
    except OSError as exc:
        if exc.errno not in ENVIRONMENT_ERRNOS:
            raise
        raise EdgeflowError(
            f"cannot write the build folder {build_dir}: {exc.strerror} ({exc.filename})",
            "set build_dir=PATH to a writable folder with free space",
        ) from exc


def _publish(build_dir: Path, files: dict[str, Path], recipe: Path) -> None:
    parent = build_dir.parent
    _make_folder(parent)
    with owned.lock(parent / f".{build_dir.name}.lock"):
        _recover(build_dir)
        sources = {src.name: src for path in files.values() for src in _files(path)}
        keep = _foreign_files(build_dir, set(sources), recipe)
        holder = owned.make(parent, f".{build_dir.name}.tmp")
        tmp = holder / owned.CONTENT
        try:
            tmp.mkdir()
            for name, src in sources.items():
                shutil.copy2(src, tmp / name)
            for name in keep:  # the user's files go with the folder, as links: the originals
                _link(build_dir / name, tmp / name)  # stay where they are until the swap
            record = {
                "recipe": str(recipe),
                "files": {name: file_sha256(tmp / name) for name in sorted(sources)},
            }
            (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
            replace_folder(tmp, build_dir)
        finally:
            owned.remove(holder, parent)  # copies and links only, if the swap did not happen


def replace_file(build_dir: Path, name: str, text: str) -> Path:
    """Write one of edgeflow's files of a published build folder again (`edgeflow report`
    remaking report.html), atomically, its record updated so that the next publish still
    knows it as edgeflow's."""
    path = build_dir / name
    with owned.lock(build_dir.parent / f".{build_dir.name}.lock"):
        record = _read_record(build_dir)
        if path.exists() and (record is None or name not in record["files"]):
            raise EdgeflowError(
                f"{path} was not written by edgeflow; not replacing it",
                "move it out of the build folder",
            )
        fd, part = tempfile.mkstemp(prefix=f".{name}.tmp-", dir=build_dir)  # a new file
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(part, path)
        except BaseException:
            os.unlink(part)
            raise
        if record is not None:
            record["files"][name] = file_sha256(path)
            (build_dir / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def _link(src: Path, dst: Path) -> None:
    """Hard links of a file or folder tree (copies where the file system has no links)."""

    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True, copy_function=link)
    elif src.is_symlink():
        os.symlink(os.readlink(src), dst)
    else:
        link(str(src), str(dst))


def _files(path: Path) -> list[Path]:
    """A published slot's files: the file itself, or the files of its folder."""
    return sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]


def _make_folder(folder: Path) -> None:
    for above in (folder.parent, folder):
        if above.exists() and not above.is_dir():
            raise EdgeflowError(
                f"cannot publish the build: {above} is a file, not a folder",
                "set build_dir=PATH to a folder, or move the file away",
            )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EdgeflowError(
            f"cannot create the build folder {folder}: {exc.strerror}",
            "set build_dir=PATH to a writable folder",
        ) from exc


def _recover(build_dir: Path) -> None:
    """Under the build's lock no publish is running: a temporary holder is a killed
    publish's, and an old holder without a build folder holds the build it had moved away.
    Only holders edgeflow can prove its own (and whose process is gone) are touched."""
    parent, name = build_dir.parent, build_dir.name
    for tmp in parent.glob(f".{name}.tmp-*"):
        if _left_behind(tmp):
            owned.remove(tmp, parent)
    olds = [old for old in parent.glob(f".{name}.old-*") if _left_behind(old)]
    olds.sort(key=lambda old: owned.read(old).created)  # type: ignore[union-attr]
    for old in reversed(olds):  # the newest old build first
        if not os.path.lexists(build_dir) and os.path.lexists(old / owned.CONTENT):
            os.rename(old / owned.CONTENT, build_dir)
        owned.remove(old, parent)


def _left_behind(folder: Path) -> bool:
    """Whether a folder is a holder of this process or of one that is gone."""
    owner = owned.read(folder)
    return owner is not None and (owner.mine() or owner.dead())


def _foreign_files(build_dir: Path, publishing: set[str], recipe: Path) -> list[str]:
    """The names of files in the build folder that edgeflow did not write (to keep), after
    checking that replacing the folder loses nothing of the user's."""
    if not build_dir.exists():
        return []
    if not build_dir.is_dir():
        raise EdgeflowError(
            f"cannot publish the build: {build_dir} is a file, not a folder",
            "move the file away",
        )
    record = _read_record(build_dir)
    ours: dict[str, str | None] = (
        record["files"] if record else {n: None for n in publishing}  # an older edgeflow's
    )
    check_owner(build_dir, recipe, record)
    names = sorted(p.name for p in build_dir.iterdir() if p.name != RECORD)
    changed = [
        n
        for n in names
        if n in ours
        and ours[n] is not None
        and (build_dir / n).is_file()
        and file_sha256(build_dir / n) != ours[n]
    ]
    clashing = [n for n in names if n not in ours and n in publishing]
    if changed or clashing:
        what = ", ".join(changed + clashing)
        raise EdgeflowError(
            f"{build_dir} holds files edgeflow did not write, which publishing would replace: "
            f"{what}",
            "move them out of the build folder (edgeflow keeps other files of yours there)",
        )
    return [n for n in names if n not in ours]


def check_owner(build_dir: Path, recipe: Path, record: dict | None = None) -> None:
    """Refuse a build folder made from another recipe file of the same stem that still
    exists (a/model.yaml and b/model.yaml both publish into build/model/)."""
    record = record if record is not None else _read_record(build_dir)
    if not record or record.get("recipe") in (None, str(recipe)):
        return
    other = Path(record["recipe"])
    if other.is_file():
        raise EdgeflowError(
            f"{build_dir} holds the build of {other}, another recipe file with the same name "
            f"as {recipe}; publishing would replace it",
            "rename one of the two recipe files (the build folder is named after the file), "
            "or set build_dir=PATH for one of them",
        )


def _read_record(build_dir: Path) -> dict | None:
    try:
        record = json.loads((build_dir / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("files"), dict) else None


def replace_folder(new: Path, final: Path) -> None:
    """Put the complete folder `new` at `final` by renames; the old one is moved into a
    holder first, and removed with it after."""
    if not os.path.lexists(final):
        os.rename(new, final)
        return
    old = owned.make(final.parent, f".{final.name}.old")
    try:
        os.rename(final, old / owned.CONTENT)
        os.rename(new, final)
    finally:
        if not os.path.lexists(final):  # interrupted between the renames: put it back
            os.rename(old / owned.CONTENT, final)
        owned.remove(old, final.parent)
