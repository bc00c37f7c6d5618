"""Targets: profiles as data (targets/*.yaml) and one backend module per target family."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from edgeflow import resources
from edgeflow.errors import EdgeflowError
from edgeflow.recipe.loader import read_yaml, validate
from edgeflow.recipe.suggest import did_you_mean
from edgeflow.targets.profile import TargetProfile


def load_profile(name: str, cwd: Path | None = None) -> TargetProfile:
    """A target profile by name, from ./targets/ or the built-ins, validated with locations."""
    known = resources.available("targets", cwd)
    if name not in known:
        raise EdgeflowError(f"unknown target '{name}'", did_you_mean(name, known))
    path = known[name]
    profile = validate(TargetProfile, read_yaml(path), path)
    if profile.name != name:
        raise EdgeflowError(
            f"{path}: name: '{profile.name}' does not match the file name '{name}'",
            f"rename the file or set name: {name}",
        )
    return profile


def backend(profile: TargetProfile) -> ModuleType:
    """The module that converts and runs artifacts for this profile (imported on demand)."""
    if profile.backend == "onnxruntime_micro":
        from edgeflow.targets import onnxruntime_micro

        return onnxruntime_micro
    if profile.backend == "tflite":
        from edgeflow.targets import tflite

        return tflite
    if profile.backend == "tflite_micro":
        from edgeflow.targets import tflite_micro

        return tflite_micro
    if profile.backend == "armnn":
        from edgeflow.targets import armnn

        return armnn
    if profile.backend == "tensorrt":
        from edgeflow.targets import tensorrt

        return tensorrt
    raise AssertionError(f"no backend module for '{profile.backend}'")
