"""Targets: profiles as data (targets/*.yaml) and one package per target family, each
registering its Backend (edgeflow/targets/registry.py)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from edgeflow.core import resources
from edgeflow.core.errors import EdgeflowError
from edgeflow.core.loader import plain, read_yaml, validate
from edgeflow.core.suggest import did_you_mean
from edgeflow.targets.profile import TargetProfile, operator_list


def load_profile(name: str, cwd: Path | None = None) -> TargetProfile:
    """A target profile by name, from ./targets/ or the built-ins, validated with locations."""
    known = resources.available("targets", cwd)
    if name not in known:
        raise EdgeflowError(f"unknown target '{name}'", did_you_mean(name, known))
    path = known[name]
    fast = builtin_data(path)
    tree = read_yaml(path) if fast is None else None
    data = _extended(name, path, plain(tree) if fast is None else fast, cwd, [path])
    try:
        profile = TargetProfile.model_validate(data)
    except ValidationError:  # parsed (again) with positions, to locate every problem
        profile = validate(TargetProfile, tree or read_yaml(path), path, data=data)
    if profile.name != name:
        raise EdgeflowError(
            f"{path}: name: '{profile.name}' does not match the file name '{name}'",
            f"rename the file or set name: {name}",
        )
    return profile


def builtin_data(path: Path) -> dict[str, Any] | None:
    """A built-in profile's data, parsed with libyaml (PyYAML's C parser: 0.04 s for the
    onnxruntime_micro profile, where the parse with positions takes 0.3 s); None for any
    other file, or without libyaml. Built-in profiles are edgeflow's own files, and
    tests/targets/test_profile_files.py checks that both parsers give the same data for each;
    a user's profile is always parsed with positions, for located messages."""
    if path.parent.resolve() != resources.builtin_dir("targets").resolve():
        return None
    try:
        import yaml

        loader = yaml.CSafeLoader
    except (ImportError, AttributeError):
        return None
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # the safe loader
    return data if isinstance(data, dict) else None


# Keys whose entries an extending profile adds to (or replaces one by one) instead of replacing.
MERGED = ("operators", "boards", "int8", "dtype_fallbacks", "int8_warnings")


def _extended(
    name: str, path: Path, data: dict[str, Any], cwd: Path | None, seen: list[Path]
) -> dict[str, Any]:
    """The profile's data over the profile it `extends:` (recursively). `extends` may name
    the built-in the file shadows (same name) or any other visible profile; `name` defaults
    to the file's. Entries of operators, boards, int8, dtype_fallbacks and int8_warnings are
    merged, but for those the file lists in `replaces:` (`replaces: [boards]`: its own boards
    only)."""
    base_name = data.pop("extends", None)
    replaced = data.pop("replaces", [])
    if base_name is None:
        if replaced:
            raise EdgeflowError(f"{path}: replaces: applies to a profile that extends another")
        return data
    unknown = [key for key in replaced if key not in MERGED]
    if not isinstance(replaced, list) or unknown:
        raise EdgeflowError(
            f"{path}: replaces: lists the keys whose entries are not merged with the extended "
            f"profile's (got {unknown or replaced!r})",
            f"choose among {', '.join(MERGED)}",
        )
    data.setdefault("name", name)
    known = resources.available("targets", cwd)
    if base_name == name:  # extend the built-in this file shadows
        base_path = resources.builtin_dir("targets") / f"{name}.yaml"
        if not base_path.is_file() or base_path in seen:
            raise EdgeflowError(
                f"{path}: extends: '{base_name}' names the file itself; there is no built-in "
                f"target of that name",
                did_you_mean(base_name, known),
            )
    elif base_name in known:
        base_path = known[base_name]
    else:
        raise EdgeflowError(
            f"{path}: extends: unknown target '{base_name}'", did_you_mean(base_name, known)
        )
    if base_path in seen:
        chain = " -> ".join(str(p) for p in [*seen, base_path])
        raise EdgeflowError(f"profiles extend each other in a loop: {chain}")
    base_data = builtin_data(base_path)
    if base_data is None:
        base_data = plain(read_yaml(base_path))
    base = _extended(base_name, base_path, base_data, cwd, [*seen, base_path])
    merged = {**base, **data}
    for key in MERGED:
        if key in replaced:
            continue
        if key == "operators":  # `[Conv, Relu]` is short for `{Conv: {}, Relu: {}}`
            base[key], data[key] = operator_list(base.get(key)), operator_list(data.get(key))
        if isinstance(base.get(key), dict) and isinstance(data.get(key), dict):
            merged[key] = {**base[key], **data[key]}
    return merged


def backend(profile: TargetProfile) -> ModuleType:
    """The module that converts and runs artifacts for this profile (imported on demand)."""
    from edgeflow.targets import registry

    return registry.get(profile.backend).load()
