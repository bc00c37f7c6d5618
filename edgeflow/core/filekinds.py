"""What kind of file a dataset or checkpoint is, from its first bytes (no numpy: the recipe's
checks read these when it loads, and a cached run imports nothing heavy)."""

from __future__ import annotations

from pathlib import Path

from edgeflow.core.errors import first_line

NPY_MAGIC, ZIP_MAGICS = b"\x93NUMPY", (b"PK\x03\x04", b"PK\x05\x06")


def file_problem(path: Path) -> str | None:
    """What makes a .npy / .npz dataset file unreadable, from its headers only (None: they
    are sound): another kind of file, an encrypted member or one of a compression numpy
    cannot read."""
    import zipfile

    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as exc:
        return f"cannot be opened: {exc.strerror or first_line(exc)}"
    if path.suffix == ".npy":
        if head.startswith(NPY_MAGIC):
            return None
        return f"is not a NumPy .npy file (those start with {NPY_MAGIC!r}): {what_file(head)}"
    if not head.startswith(ZIP_MAGICS):
        return f"is not a .npz file (a zip archive of .npy arrays): {what_file(head)}"
    readable = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.flag_bits & 0x1:
                    return (
                        f"is an encrypted archive (its member '{info.filename}' needs a password)"
                    )
                if info.compress_type not in readable:
                    return (
                        f"stores its member '{info.filename}' with zip compression method "
                        f"{info.compress_type}, which Python's zipfile cannot read"
                    )
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        return f"is a damaged zip archive: {first_line(exc)}"
    return None


def what_file(head: bytes) -> str:
    """What a file that starts with `head` (its first bytes) is, in words."""
    if not head:
        return "it is empty"
    if head.startswith(NPY_MAGIC):
        return "it is a NumPy .npy array"
    if head.startswith(ZIP_MAGICS):
        return "it is a zip archive"
    if head[:1] == b"\x80":
        return "it is a Python pickle (edgeflow loads no pickled data)"
    text = head.decode("utf-8", errors="replace")
    if "\ufffd" not in text[:-3] and all(c.isprintable() or c in "\t\r\n" for c in text[:-3]):
        return f"it is a text file (starting {text[:40]!r})"
    return f"it starts with the bytes {head[:8]!r}"
