"""Cache keys: a hash of a stage's inputs, its recipe slice, its code and its tools' versions."""

from __future__ import annotations

import functools
import platform
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import edgeflow
from edgeflow.core.codehash import files_sha256
from edgeflow.core.codehash import json_digest as digest
from edgeflow.core.refs import ImportRef, file_sha256, tree_sha256
from edgeflow.core.versions import tool_version
from edgeflow.recipe import LoadedRecipe
from edgeflow.stages.base import rules_of


def jsonable(value: Any) -> Any:
    """A recipe value as JSON, with files and code references replaced by content hashes."""
    if isinstance(value, BaseModel):
        return {name: jsonable(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, Path):
        if value.is_dir():  # a SavedModel folder: every file in it
            return {"folder": value.name, "sha256": tree_sha256(value)}
        return {"file": value.name, "sha256": file_sha256(value)}
    if isinstance(value, ImportRef) or hasattr(value, "fingerprint"):
        return value.fingerprint()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def recipe_slice(
    loaded: LoadedRecipe,
    reads: tuple[str, ...],
    rule_levels: tuple[str, ...] = ("ast", "fx", "onnx"),
    memo: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The recipe values a stage reads, as JSON (its `rewrites` only of its rule levels).
    `memo` (one per build) keeps the target's JSON for the next stage that reads it."""
    out: dict[str, Any] = {}
    for dotted in reads:
        if dotted == "target":
            memo = {} if memo is None else memo
            if "target" not in memo:
                # the profile's default rewrites by their code too, not only by name
                code = [s.fingerprint() for s in loaded.profile.rewrite_specs()]
                memo["target"] = (jsonable(loaded.profile), code)
            out[dotted], out["target_rewrite_code"] = memo["target"]  # read, never changed
            continue
        if dotted == "recipe_file":
            out[dotted] = loaded.stem
            continue
        value: Any = loaded.recipe
        for part in dotted.split("."):
            value = getattr(value, part)
        if dotted == "rewrites":
            value = rules_of(value, rule_levels)
        out[dotted] = jsonable(value)
    return out


def tool_versions(dists: tuple[str, ...], memo: dict[str, Any] | None = None) -> dict[str, str]:
    """Versions of Python, edgeflow and each tool (edgeflow.core.versions names them). `memo`
    (one per build) keeps each version for the next stage that names it."""
    found: dict[str, str] = {} if memo is None else memo.setdefault("versions", {})
    versions = {"python": platform.python_version()}
    for dist in ("edgeflow", *dists):
        if dist not in found:
            found[dist] = tool_version(dist)
        versions[dist] = found[dist]
    return versions


@functools.lru_cache(maxsize=1)
def edgeflow_code() -> str:
    """One hash of all of edgeflow's own modules: every stage's code key.

    Stages reach most of the package (the recipe schema, rules, targets) and a hand-kept list
    of the modules each one uses goes stale; hashing all of it costs ~5 ms per process."""
    return package_digest(Path(edgeflow.__file__).resolve().parent)


def package_digest(root: Path) -> str:
    """One hash of every .py file under `root`, by relative path and content."""
    return digest(files_sha256(root, "*.py"))
