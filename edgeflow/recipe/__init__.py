"""Recipes: find, load and validate them, with every problem located in the YAML file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeflow import resources
from edgeflow.errors import EdgeflowError, Problem, RecipeError
from edgeflow.recipe.loader import (
    COMMAND_LINE,
    apply_overrides,
    display_path,
    read_yaml,
    validate,
)
from edgeflow.recipe.schema import Recipe
from edgeflow.recipe.suggest import did_you_mean
from edgeflow.targets.profile import TargetProfile

__all__ = ["LoadedRecipe", "Recipe", "find_recipe", "load_recipe"]


@dataclass(frozen=True)
class LoadedRecipe:
    """A validated recipe together with the file it came from and its resolved target."""

    path: Path
    recipe: Recipe
    profile: TargetProfile

    @property
    def stem(self) -> str:
        return self.path.stem

    @property
    def build_name(self) -> str:
        """target-mode, plus the int8 settings the quantization presets change (so that a
        sweep over presets does not write two builds into one folder)."""
        q = self.recipe.quantization
        parts = [self.profile.name, q.mode]
        if q.mode == "int8":
            parts += [k for k, on in BUILD_SUFFIXES.items() if on(q)]
        return "-".join(parts)


def find_recipe(name_or_path: str, cwd: Path | None = None) -> Path:
    """A recipe by file path, or by name from ./recipes/ or the built-ins."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if candidate.is_file():
            return candidate.resolve()
        raise EdgeflowError(f"recipe file not found: {name_or_path}", "check the path")
    known = resources.available("recipes", cwd)
    if name_or_path in known:
        return known[name_or_path]
    raise EdgeflowError(
        f"unknown recipe '{name_or_path}'",
        did_you_mean(name_or_path, known) or "pass a path to a recipe YAML file",
    )


def load_recipe(
    path: Path, overrides: Mapping[str, Any] | None = None, cwd: Path | None = None
) -> LoadedRecipe:
    """Parse and validate a recipe; `overrides` are dotted keys from the command line."""
    from edgeflow.targets import load_profile

    path = Path(path).resolve()
    tree = read_yaml(path)
    overrides = dict(overrides or {})
    apply_overrides(tree, overrides)
    context = {"base_dir": path.parent, "cwd": str(cwd or Path.cwd())}
    recipe = validate(Recipe, tree, path, context, overrides)
    if recipe.rewrites:
        from edgeflow.rules import resolve_rewrites

        specs = resolve_rewrites(recipe.rewrites, tree, path, path.parent)
        recipe = recipe.model_copy(update={"rewrites": specs})
    target = recipe.target
    profile = target if isinstance(target, TargetProfile) else load_profile(target, cwd)
    q = recipe.quantization
    if q.mode not in profile.quantization:
        raise _conflict(
            tree,
            path,
            overrides,
            "quantization.mode",
            f"target '{profile.name}' does not support mode '{q.mode}'",
            f"choose one of {', '.join(profile.quantization)}",
        )
    if q.method == "qat" and profile.backend in ("tflite", "tflite_micro", "armnn"):
        raise _conflict(
            tree,
            path,
            overrides,
            "quantization.method",
            f"target '{profile.name}' cannot take a QAT model's own scales: its converter "
            "(onnx2tf) calibrates again and cannot carry Q/DQ scales into a .tflite "
            "(onnx2tf issue 680)",
            "use onnxruntime_micro or tensorrt, which run the exported Q/DQ as it is",
        )
    if q.activations == "int16" and (q.mode != "int8" or profile.backend not in INT16_ACT):
        raise _conflict(
            tree,
            path,
            overrides,
            "quantization.activations",
            f"int16 activations need quantization.mode int8 and a target whose runtime has "
            f"16x8 kernels ({', '.join(INT16_ACT)}); got mode {q.mode}, target {profile.name}",
            "set quantization.activations: int8, or choose tflite or tflite_micro",
        )
    board = recipe.precheck.board
    if board is not None and board not in profile.boards:
        raise _conflict(
            tree,
            path,
            overrides,
            "precheck.board",
            f"target '{profile.name}' has no board '{board}'",
            did_you_mean(board, list(profile.boards)) or "this target defines no boards",
        )
    return LoadedRecipe(path=path, recipe=recipe, profile=profile)


# Name parts of int8 builds whose settings differ from the defaults that presets change.
BUILD_SUFFIXES: dict[str, Any] = {
    "per_tensor": lambda q: not q.per_channel,
    "symmetric": lambda q: q.symmetric,
    "int16act": lambda q: q.activations == "int16",
}
# Backends whose runtime runs int8-weight, int16-activation ("16x8") models.
INT16_ACT = ("tflite", "tflite_micro")


def _conflict(
    tree: Any, path: Path, overrides: Mapping[str, Any], key: str, message: str, hint: str
) -> RecipeError:
    """A recipe value the resolved target does not allow, located at the value (or, when the
    recipe does not set it, at `target:`); a command-line override is named as such."""
    if key in overrides:  # as the schema's own errors name an override
        shown = f"{COMMAND_LINE} ({key}={overrides[key]})"
        return RecipeError([Problem(shown, 0, 0, key, message, hint)])
    section, _, name = key.partition(".")
    node: Any = tree.get(section)
    has_key = isinstance(node, dict) and name in node
    line, col = node.lc.value(name) if has_key else tree.lc.key("target")
    return RecipeError([Problem(display_path(path), line + 1, col + 1, key, message, hint)])
