"""Cache keys: a hash of a stage's inputs, its recipe slice, its code and its tools' versions."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import platform
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from edgeflow.recipe import LoadedRecipe
from edgeflow.recipe.refs import ImportRef, file_sha256


def jsonable(value: Any) -> Any:
    """A recipe value as JSON, with files and code references replaced by content hashes."""
    if isinstance(value, BaseModel):
        return {name: jsonable(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, Path):
        return {"file": value.name, "sha256": file_sha256(value)}
    if isinstance(value, ImportRef) or hasattr(value, "fingerprint"):
        return value.fingerprint()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def recipe_slice(loaded: LoadedRecipe, reads: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dotted in reads:
        if dotted == "target":
            out[dotted] = jsonable(loaded.profile)
            # the profile's default rewrites by their code too, not only by name
            out["target_rewrite_code"] = [s.fingerprint() for s in loaded.profile.rewrite_specs()]
            continue
        if dotted == "recipe_file":
            out[dotted] = loaded.stem
            continue
        value: Any = loaded.recipe
        for part in dotted.split("."):
            value = getattr(value, part)
        out[dotted] = jsonable(value)
    return out


def tool_versions(dists: tuple[str, ...]) -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for dist in dists:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    return versions


def code_digest(modules: tuple[str, ...]) -> dict[str, str]:
    digests = {}
    for module in sorted(set(modules)):
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise AssertionError(f"stage code module '{module}' not found")
        digests[module] = file_sha256(Path(spec.origin))
    return digests


def digest(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()
