"""Recipes: find, load and validate them, with every problem located in the YAML file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from edgeflow.core import resources
from edgeflow.core.errors import EdgeflowError, Problem, RecipeError
from edgeflow.core.loader import (
    COMMAND_LINE,
    apply_overrides,
    display_path,
    locate,
    plain,
    read_yaml,
    validate,
)
from edgeflow.core.suggest import did_you_mean
from edgeflow.recipe import checks
from edgeflow.recipe.schema import Recipe
from edgeflow.rules import AUTO, locate_item
from edgeflow.rules.base import RuleSpec
from edgeflow.targets.profile import TargetProfile

__all__ = ["LoadedRecipe", "Recipe", "find_recipe", "load_recipe"]


@dataclass(frozen=True)
class LoadedRecipe:
    """A validated recipe together with the file it came from and its resolved target."""

    path: Path
    recipe: Recipe
    profile: TargetProfile
    # user rules checked from their source only (load_recipe(user_code=False)), not loaded
    unchecked: tuple[str, ...] = ()

    @property
    def stem(self) -> str:
        return self.path.stem

    @property
    def build_name(self) -> str:
        """target-mode, plus the int8 settings the quantization presets change (so that a
        sweep over presets does not write two builds into one folder; int8_weights takes
        per_channel alone of them)."""
        q = self.recipe.quantization
        parts = [self.profile.name, q.mode]
        if q.mode in ("int8", "int8_weights"):
            parts += [k for k, on in BUILD_SUFFIXES.items() if on(q)]
        if self.recipe.source.kind == "tensorflow":  # the path, where it is not the default
            from edgeflow.schema.source import default_via

            via = self.recipe.convert.via
            if via is not None and via != default_via(self.profile.family.tensorflow_native, q):
                parts.append(f"via_{via}")
        return "-".join(parts)


def find_recipe(name_or_path: str, cwd: Path | None = None) -> Path:
    """A recipe by file path, or by name from ./recipes/ or the built-ins."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if candidate.is_file():
            return candidate.resolve()
        if candidate.is_dir():
            raise folder_error(candidate)
        raise EdgeflowError(f"recipe file not found: {name_or_path}", "check the path")
    known = resources.available("recipes", cwd)
    if name_or_path in known:
        return known[name_or_path]
    if ((cwd or Path.cwd()) / candidate).is_dir():
        raise folder_error(candidate)
    raise EdgeflowError(
        f"unknown recipe '{name_or_path}'",
        did_you_mean(name_or_path, known) or "pass a path to a recipe YAML file",
    )


def folder_error(path: Path) -> EdgeflowError:
    """The error for a recipe argument that names a folder: its recipe files, if any."""
    files = sorted(p.name for p in path.iterdir() if p.suffix in (".yaml", ".yml"))[:5]
    inside = f" (its YAML files: {', '.join(files)})" if files else " (it holds no .yaml file)"
    example = f"{path / files[0]}" if files else "path/to/recipe.yaml"
    return EdgeflowError(
        f"{path} is a folder, not a recipe file{inside}", f"pass a recipe file: {example}"
    )


def load_recipe(
    path: Path,
    overrides: Mapping[str, Any] | None = None,
    cwd: Path | None = None,
    user_code: bool = True,
) -> LoadedRecipe:
    """Parse and validate a recipe; `overrides` are dotted keys from the command line (a key
    ending in `+` appends to a list). Every problem of every phase (the schema, the rules and
    their options, the target and board, checks across sections) is reported in one
    RecipeError. With `user_code=False` nothing of the user's runs: user rules are checked
    from their source only (`edgeflow validate`), and left out of `recipe.rewrites`."""
    from edgeflow.rules import resolve_rewrites

    path = Path(path).resolve()
    tree = read_yaml(path)
    located = apply_overrides(tree, dict(overrides or {}))
    context = {"base_dir": path.parent, "cwd": str(cwd or Path.cwd())}
    problems: list[Problem] = []
    if path.stem.startswith("."):  # build/<stem>/ must be a visible folder inside build_dir
        why = "outside build_dir" if path.stem.strip(".") == "" else "a hidden folder"
        message = (
            f"the file name {path.name} cannot name a build folder: build/{path.stem}/ would be "
            f"{why} (a recipe's file name must not start with '.'; docs/recipe.md)"
        )
        hint = f"rename the file (e.g. {path.name.lstrip('.') or 'recipe.yaml'})"
        problems.append(Problem(display_path(path), 1, 1, "", message, hint))
    entries, auto = _auto_entry(tree, path, located, problems)
    specs: list[RuleSpec] = []
    unchecked: list[str] = []
    if isinstance(entries, list):
        try:
            specs, unchecked = resolve_rewrites(entries, tree, path, located, user_code)
        except RecipeError as exc:
            problems += exc.problems
        context["rewrites"] = specs  # what Recipe.rewrites holds; entry problems are above
    recipe: Recipe | None = None
    try:
        recipe = validate(Recipe, tree, path, context, located)
    except RecipeError as exc:
        problems += exc.problems
    if recipe is not None and auto:
        recipe = recipe.model_copy(update={"rewrites_auto": True})
    sections = _sections(recipe, tree, path, context, problems)
    profile = _profile(sections.get("target"), tree, path, located, cwd, problems)
    if recipe is not None and recipe.accelerator is not None and profile is not None:
        profile = _accelerated(profile, recipe.accelerator, tree, path, located, problems)
    for check in checks.CHECKS:
        for key, message, hint in check(sections, profile):
            problems.append(locate(tree, path, located, key, message, hint))
    if problems or recipe is None or profile is None:
        problems.sort(key=lambda p: (p.file == COMMAND_LINE, p.file, p.line, p.col))
        raise RecipeError(_unique(problems))
    return LoadedRecipe(path=path, recipe=recipe, profile=profile, unchecked=tuple(unchecked))


def _auto_entry(
    tree: Any, path: Path, located: dict[str, Any], problems: list[Problem]
) -> tuple[Any, bool]:
    """The `rewrites:` entries without `auto`, and whether it was there: `rewrites: auto`, or
    an entry `auto` after the recipe's own rules (it applies what the precheck proves after
    them; anywhere else it would be unclear what runs first)."""
    entries = tree.get("rewrites")
    if "rewrites_auto" in tree:
        problems.append(
            locate(
                tree,
                path,
                located,
                "rewrites_auto",
                "unknown key 'rewrites_auto'",
                "write `rewrites: auto` (or `auto` as the last entry of rewrites:)",
            )
        )
    if entries == AUTO:
        return [], True
    if not isinstance(entries, list):
        return entries, False
    where = [i for i, e in enumerate(entries) if e == AUTO]
    for i in where:
        if i != len(entries) - 1:
            problems.append(
                locate_item(
                    tree,
                    path,
                    located,
                    f"rewrites[{i}]",
                    i,
                    "'auto' comes after the recipe's own rules, as the last entry",
                    "move `- auto` to the end of rewrites:",
                )
            )
    return entries, bool(where)  # resolve_rewrites passes over `auto`, keeping the indices


def _sections(
    recipe: Recipe | None, tree: Any, path: Path, context: dict[str, Any], problems: list[Problem]
) -> dict[str, Any]:
    """The sections the cross checks read: from the recipe, or (when it did not validate)
    each section that validates on its own, so that its checks still run."""
    from pydantic import TypeAdapter, ValidationError

    if recipe is not None:
        return {name: getattr(recipe, name) for name in checks.SECTIONS}
    failed = {p.key.split(".")[0].split("[")[0] for p in problems} | {""}
    found: dict[str, Any] = {}
    for name in checks.SECTIONS:
        if name in failed:
            continue
        field = Recipe.model_fields[name]
        if name not in tree:
            if field.is_required():
                continue
            found[name] = field.get_default(call_default_factory=True)
            continue
        annotation = (
            Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
        )
        adapter: TypeAdapter[Any] = TypeAdapter(annotation)
        try:
            found[name] = adapter.validate_python(plain(tree[name]), context=context)
        except ValidationError:
            continue  # reported by the whole recipe's validation already
    return found


def _profile(
    target: Any,
    tree: Any,
    path: Path,
    located: dict[str, Any],
    cwd: Path | None,
    problems: list[Problem],
) -> TargetProfile | None:
    """The recipe's target profile: inline, or loaded by name (its own file's problems are
    reported too)."""
    from edgeflow.targets import load_profile

    if isinstance(target, TargetProfile) or target is None:
        return target
    try:
        return load_profile(target, cwd)
    except RecipeError as exc:
        problems += exc.problems
    except EdgeflowError as exc:
        problems.append(locate(tree, path, located, "target", exc.message, exc.hint))
    return None


def _accelerated(
    profile: TargetProfile,
    accelerator: str,
    tree: Any,
    path: Path,
    located: dict[str, Any],
    problems: list[Problem],
) -> TargetProfile:
    """The profile compiling for the recipe's `accelerator:` (TargetProfile.with_accelerator),
    or the problem of a target that compiles for no NPU."""
    if profile.npu is not None:
        return profile.with_accelerator(accelerator)
    from edgeflow.targets.registry import offering

    npu_targets = offering(lambda b: b.npu)
    message = f"target '{profile.name}' compiles for no NPU: accelerator applies to NPU targets"
    hint = "an NPU target: " + " or ".join(f"target={name}" for name in npu_targets)
    problems.append(locate(tree, path, located, "accelerator", message, hint))
    return profile


def _unique(problems: list[Problem]) -> list[Problem]:
    return list(dict.fromkeys(problems))


# Name parts of int8 builds whose settings differ from the defaults that presets change.
BUILD_SUFFIXES: dict[str, Any] = {
    "per_tensor": lambda q: not q.per_channel,
    "symmetric": lambda q: q.symmetric,
    "int16act": lambda q: q.activations == "int16",
    "fallback": lambda q: q.fallback == "auto",
    "float_outputs": lambda q: q.float_outputs,
    "keep_float": lambda q: q.keep_float is not None,  # the recipe's islands, not the target's
    # calibration methods other than the default (a sweep over quantization.method)
    "entropy": lambda q: q.method == "entropy",
    "percentile": lambda q: q.method == "percentile",
    "mse": lambda q: q.method == "mse",
}
