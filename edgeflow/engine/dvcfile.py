"""`edgeflow dvc init` and `edgeflow dvc stage`: a DVC pipeline that follows the stage graph.

`init` writes dvc.yaml and params.yaml for every recipe in recipes/. params.yaml names the
builds (a target and a quantization, each falling back to the top-level `target` and
`quantization`, then to the recipe). Each edgeflow stage becomes a DVC stage; stages that read
neither the target nor the quantization, and take no input from a stage that does (load,
rewrite, export, rewrite_onnx for a PyTorch source), appear once per recipe and feed all of its
builds. A stage's DVC params are the recipe keys it reads, in the recipe file itself, so
`dvc repro` after a quantization edit reruns quantize and what follows, not the export.

`stage` is the command each DVC stage runs: one edgeflow stage, its inputs read from the
upstream stages' DVC outputs, its result renamed into place only when complete. The last
stage of a build writes build/<recipe>/<build>/ exactly as `edgeflow run` does.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from edgeflow import __version__, resources
from edgeflow.engine.stage import WARNINGS_FILE, Stage
from edgeflow.errors import EdgeflowError
from edgeflow.recipe import LoadedRecipe, load_recipe
from edgeflow.recipe.loader import display_path, plain, read_yaml, validate

DVC_FILE = Path("dvc.yaml")
PARAMS_FILE = Path("params.yaml")
STAGE_DIR = Path(".edgeflow/dvc")  # the DVC outputs of stages before the last
BUILD_READS = ("target", "quantization")  # what a build changes; stages reading it are per build
BUILD_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
PLOTS = ("latency.csv", "outputs.csv", "layers.csv")
HYDRA_CONFIG = Path("conf/config.yaml")  # DVC's default for `dvc config hydra.enabled true`


class QuantizationKeys(BaseModel):
    """Quantization keys a build sets; null keeps the recipe's value."""

    model_config = ConfigDict(extra="forbid")

    mode: str | None = None
    per_channel: bool | None = None
    symmetric: bool | None = None
    method: str | None = None
    reduce_range: bool | None = None
    activations: str | None = None


class BuildParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: str | None = None
    quantization: str | QuantizationKeys | None = None  # a preset name, or keys
    recipes: list[str] | None = None  # only these recipes get the build (default: all)

    @field_validator("quantization")
    @classmethod
    def _known_preset(cls, value: Any) -> Any:
        from edgeflow.hydra_app import QUANTIZATION_PRESETS

        if isinstance(value, str) and value not in QUANTIZATION_PRESETS:
            raise ValueError(f"unknown preset '{value}' (have: {', '.join(QUANTIZATION_PRESETS)})")
        return value


class Params(BaseModel):
    """params.yaml's edgeflow keys: which recipes, the builds each makes, and the defaults
    `dvc exp run -S` changes. Other top-level keys are the user's, kept as they are."""

    model_config = ConfigDict(extra="allow")

    edgeflow: dict[str, str] = {}
    recipes: list[str] | None = None  # names in recipes/ (default: every file there)
    target: str | None = None
    quantization: QuantizationKeys = QuantizationKeys()
    builds: dict[str, BuildParams] = {"default": BuildParams()}

    @field_validator("builds")
    @classmethod
    def _names(cls, value: dict[str, BuildParams]) -> dict[str, BuildParams]:
        if not value:
            raise ValueError("name at least one build (`default: {}` builds what each recipe says)")
        for name in value:
            if not BUILD_NAME.match(name):
                raise ValueError(f"build name '{name}': use letters, digits, '_' and '-'")
        return value

    def overrides(self, build: str) -> dict[str, Any]:
        """Dotted recipe overrides of one build: its own keys over the top-level defaults."""
        if build not in self.builds:
            raise EdgeflowError(
                f"{PARAMS_FILE}: no build '{build}' (have: {', '.join(self.builds)})",
                "add it under builds:, then run `edgeflow dvc init` again",
            )
        from edgeflow.hydra_app import QUANTIZATION_PRESETS

        spec = self.builds[build]
        quantization = self.quantization.model_dump(exclude_none=True)
        if isinstance(spec.quantization, str):
            quantization.update(QUANTIZATION_PRESETS[spec.quantization])
        elif spec.quantization is not None:
            quantization.update(spec.quantization.model_dump(exclude_none=True))
        found: dict[str, Any] = {}
        if spec.target or self.target:
            found["target"] = spec.target or self.target
        found.update({f"quantization.{k}": v for k, v in quantization.items()})
        return found


def read_params(root: Path, source: Path = PARAMS_FILE) -> Params | None:
    """The edgeflow keys of params.yaml, which is what the stages run with (DVC composes it
    from conf/ on `dvc exp run` when Hydra composition is on), or of conf/config.yaml."""
    path = root / source
    if not path.is_file():
        return None
    tree = read_yaml(path)
    data = {k: v for k, v in plain(tree).items() if k != "defaults"}  # Hydra's list
    params = validate(Params, tree, path, data=data)
    params.edgeflow.pop("version", None)  # written by init, not an input
    return params


def compose(root: Path) -> dict[str, Any]:
    """conf/config.yaml composed by Hydra with its defaults, as DVC composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str((root / HYDRA_CONFIG).parent), version_base=None):
            config = hydra_compose(config_name=HYDRA_CONFIG.stem)
    except (HydraException, OmegaConfBaseException) as exc:
        raise EdgeflowError(
            f"{display_path(root / HYDRA_CONFIG)}: Hydra cannot compose it: {exc}",
            "check its defaults list against the groups in conf/ (edgeflow dvc init --hydra)",
        ) from None
    finally:
        GlobalHydra.instance().clear()
    data = OmegaConf.to_container(config, resolve=True)
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items()}


@dataclass(frozen=True)
class PlannedStage:
    """One DVC stage: an edgeflow stage for a recipe, shared by its builds or for one build."""

    name: str
    stage: Stage
    build: str | None  # None: shared by every build of the recipe
    out: Path  # relative to the repository root
    inputs: dict[str, Path]  # slot -> file or folder, relative to the root
    upstream: tuple[Path, ...]  # the outputs of the stages it reads from
    published: dict[str, Path]  # for the last stage: what build/<recipe>/<build>/ gets

    @property
    def last(self) -> bool:
        return bool(self.published)


def plan(
    recipe_path: Path, builds: list[str], loaded: LoadedRecipe, root: Path
) -> list[PlannedStage]:
    """The DVC stages of one recipe: shared stages once, then each build's own, in run order."""
    from edgeflow.engine.pipeline import load_pipeline
    from edgeflow.engine.runner import PUBLISHED_SLOTS, seed_slots

    pipeline = load_pipeline(loaded.recipe.source.kind, root)
    stem = recipe_path.stem
    seeds = {
        slot: _relative(s.path, root) for slot, s in seed_slots(loaded, pipeline.seeds).items()
    }
    per_build_stage = {
        s.name: any(r.split(".")[0] in BUILD_READS for r in s.reads) for s in pipeline.stages
    }
    planned: dict[str, PlannedStage] = {}
    for build in builds:
        # slot -> (path, producing stage's out folder or None, made per build)
        slots: dict[str, tuple[Path, Path | None, bool]] = {
            slot: (path, None, False) for slot, path in seeds.items()
        }
        for i, stage in enumerate(pipeline.stages):
            used = [s for s in (*stage.consumes, *stage.optional) if s in slots]
            own = per_build_stage[stage.name] or any(slots[s][2] for s in used)
            last = i == len(pipeline.stages) - 1
            if last and not own:
                raise EdgeflowError(
                    f"pipeline {pipeline.name}: its last stage does not read a build"
                )
            if not own:
                name, out = f"{stem}.{stage.name}", STAGE_DIR / stem / stage.name
            else:
                name = f"{stem}.{build}.{stage.name}"
                out = (
                    Path("build") / stem / build if last else STAGE_DIR / stem / build / stage.name
                )
            published = [s for s in PUBLISHED_SLOTS if s in slots] if last else []
            upstream = {u for s in (*used, *published) if (u := slots[s][1]) is not None}
            planned.setdefault(
                name,
                PlannedStage(
                    name,
                    stage,
                    build if own else None,
                    out,
                    {s: slots[s][0] for s in used},
                    tuple(sorted(upstream)),
                    {s: slots[s][0] for s in published},
                ),
            )
            for slot, file in stage.produces.items():
                slots[slot] = (out / file, out, own)
    return list(planned.values())


# ---- init ----------------------------------------------------------------------------------


def init(
    root: Path,
    targets: list[str] | None = None,
    quantizations: list[str] | None = None,
    recipes: list[str] | None = None,
    check: bool = False,
    hydra: bool = False,
    echo: Callable[[str], None] = print,
) -> bool:
    """Write edgeflow's part of dvc.yaml and params.yaml; returns whether either changed
    (with `check`, whether either would change, writing nothing).

    With `targets`/`quantizations`, the builds become their product (named target-preset);
    with `recipes`, only those recipes get stages. Otherwise what params.yaml says is kept
    (default: every recipe in recipes/, one build each, as the recipe says). Stages, metrics,
    plots and params keys of the user's own are kept, so edgeflow's stages can sit next to a
    training stage. The output depends only on these inputs: a rerun is byte-identical.

    With `hydra` (or once conf/config.yaml exists) the builds live in conf/config.yaml, with
    the config groups conf/target/ and conf/quantization/, for DVC's Hydra composition;
    params.yaml is then what Hydra composes from them.
    """
    root = root.resolve()
    hydra = hydra or (root / HYDRA_CONFIG).is_file()
    params = (hydra and read_params(root, HYDRA_CONFIG)) or read_params(root) or Params()
    if targets or quantizations:
        params = params.model_copy(update={"builds": _product(targets, quantizations)})
    if recipes:
        params = params.model_copy(update={"recipes": recipes})
    stages: dict[str, Any] = {}
    metrics: list[str] = []
    plots: list[dict[str, Any]] = []
    for recipe_path in _recipe_files(root, params.recipes):
        builds = [
            name
            for name, spec in params.builds.items()
            if spec.recipes is None or recipe_path.stem in spec.recipes
        ]
        # every build must load (a build its target cannot make is an error here, not later)
        for build in builds:
            load_recipe(recipe_path, params.overrides(build), root)
        loaded = load_recipe(recipe_path, None, root)
        for planned in plan(recipe_path, builds, loaded, root):
            stages[planned.name] = _dvc_stage(planned, recipe_path, loaded, root)
            if planned.last:
                metrics.append((planned.out / "metrics.json").as_posix())
                plots += _plots(planned.out)
    files = {root / DVC_FILE: _dvc_text(root / DVC_FILE, stages, metrics, plots)}
    if hydra:
        files.update(_hydra_files(root, params))
    else:
        files[root / PARAMS_FILE] = _params_text(root / PARAMS_FILE, params)
    changed = _write(files, check, echo)
    if hydra:  # params.yaml as DVC composes it, from the conf/ just written
        changed |= _write_composed(root, check, echo)
        if not check:
            _enable_dvc_hydra(root, echo)
    return changed


def _enable_dvc_hydra(root: Path, echo: Callable[[str], None]) -> None:
    import subprocess

    if not (root / ".dvc").is_dir():
        echo("then `dvc init` and `dvc config hydra.enabled true` for DVC's Hydra composition")
        return
    dvc = shutil.which("dvc")
    done = None
    if dvc is not None:
        command = [dvc, "config", "hydra.enabled", "true"]
        done = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    if done is None or done.returncode != 0:
        echo("run `dvc config hydra.enabled true` for DVC's Hydra composition")


def _write(files: dict[Path, str], check: bool, echo: Callable[[str], None]) -> bool:
    stale = [p for p, text in sorted(files.items()) if not _same(p, text)]
    for path in stale:
        if check:
            echo(f"{display_path(path)} is out of date: run `edgeflow dvc init`")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, files[path])
        echo(f"wrote {display_path(path)}")
    if not stale:
        echo(f"up to date: {', '.join(display_path(p) for p in sorted(files))}")
    return bool(stale)


def _same(path: Path, text: str) -> bool:
    return path.is_file() and path.read_text(encoding="utf-8") == text


def _hydra_files(root: Path, params: Params) -> dict[Path, str]:
    """conf/config.yaml (edgeflow's keys updated, the rest kept) and the generated groups:
    conf/target/<profile>.yaml and conf/quantization/<preset>.yaml, so that `dvc exp run
    -S target=armnn -S quantization=int8_per_tensor -S quantization.mode=none` composes."""
    from edgeflow.hydra_app import QUANTIZATION_KEYS, QUANTIZATION_PRESETS

    files = {}
    # Hydra reads the package directive from the first line only
    note = "# @package _global_\n# `edgeflow dvc init` writes this group option.\n"
    for name in ["recipe", *resources.available("targets", root)]:
        value = None if name == "recipe" else name
        files[root / "conf/target" / f"{name}.yaml"] = note + _yaml_dump({"target": value})
    for name, preset in QUANTIZATION_PRESETS.items():
        keys = {key: preset.get(key) for key in QUANTIZATION_KEYS}
        body = _yaml_dump({"quantization": keys})
        files[root / "conf/quantization" / f"{name}.yaml"] = note + body
    path = root / HYDRA_CONFIG
    header, tree = _existing(path, HYDRA_HEADER)
    if not path.is_file():  # start from params.yaml's own keys, so training params carry over
        _, old = _existing(root / PARAMS_FILE, "")
        tree["defaults"] = [{"target": "recipe"}, {"quantization": "recipe"}, "_self_"]
        tree.update({k: v for k, v in old.items() if k not in ("target", "quantization")})
    for key, value in _params_values(params).items():
        if key in ("target", "quantization"):
            continue  # chosen through the defaults list's groups
        if value is None:
            tree.pop(key, None)
        else:
            tree[key] = value
    files[path] = header + _yaml_dump(tree)
    return files


def _write_composed(root: Path, check: bool, echo: Callable[[str], None]) -> bool:
    """params.yaml as Hydra composes conf/; compared as data, since DVC writes the same
    data in its own layout on `dvc exp run`."""
    path = root / PARAMS_FILE
    composed = compose(root)
    current = plain(read_yaml(path)) if path.is_file() else None
    if current == composed:
        echo(f"{display_path(path)} is up to date")
        return False
    if check:
        echo(f"{display_path(path)} is out of date: run `edgeflow dvc init`")
    else:
        _write_atomic(path, COMPOSED_HEADER + _yaml_dump(composed))
        echo(f"wrote {display_path(path)}")
    return True


def _recipe_files(root: Path, names: list[str] | None) -> list[Path]:
    from edgeflow.recipe.suggest import did_you_mean

    found = {p.stem: p for p in sorted((root / "recipes").glob("*.yaml"))}
    if not found:
        raise EdgeflowError(f"no recipes in {root / 'recipes'}", "add a recipe YAML file there")
    for name in names or []:
        if name not in found:
            raise EdgeflowError(
                f"{PARAMS_FILE}: recipes: no recipe '{name}' in recipes/",
                did_you_mean(name, found) or f"have: {', '.join(found)}",
            )
    return [path for name, path in found.items() if names is None or name in names]


def _product(targets: list[str] | None, quantizations: list[str] | None) -> dict[str, BuildParams]:
    from edgeflow.hydra_app import QUANTIZATION_PRESETS
    from edgeflow.recipe.suggest import did_you_mean

    for preset in quantizations or []:
        if preset not in QUANTIZATION_PRESETS:
            raise EdgeflowError(
                f"--quantization: unknown preset '{preset}'",
                did_you_mean(preset, QUANTIZATION_PRESETS)
                or f"choose from {', '.join(QUANTIZATION_PRESETS)}",
            )
    builds = {}
    for target in targets or ["recipe"]:
        for preset in quantizations or ["recipe"]:
            spec = BuildParams(
                target=None if target == "recipe" else target,
                quantization=None if preset == "recipe" else preset,
            )
            builds[f"{target}-{preset}"] = spec
    return builds


def _dvc_stage(
    planned: PlannedStage, recipe_path: Path, loaded: LoadedRecipe, root: Path
) -> dict[str, Any]:
    recipe_rel = _relative(recipe_path, root).as_posix()
    cmd = f"edgeflow dvc stage {recipe_rel} {planned.stage.name}"
    if planned.build:
        cmd += f" --build {planned.build}"
    deps = {p.as_posix() for p in planned.upstream}
    deps |= {p.as_posix() for p in _referenced_files(loaded, planned, root)}
    package = Path(__file__).resolve().parents[1]
    if package.is_relative_to(root):  # edgeflow's own checkout: its code is a dependency
        inside = _relative(package, root).as_posix()
        deps = {d for d in deps if not d.startswith(inside + "/")} | {inside}
    recipe_keys = _recipe_keys(read_yaml(recipe_path), planned.stage.reads)  # as in the file
    params: list[Any] = ["edgeflow.version"]
    if planned.build:
        params += ["target", "quantization", f"builds.{planned.build}"]
    if recipe_keys:
        params.append({recipe_rel: recipe_keys})
    out: Any = planned.out.as_posix()
    if planned.last:  # committed to git, so `dvc metrics diff` and reviews read it directly
        out = {out: {"cache": False}}
    return {
        "cmd": cmd,
        "deps": sorted(deps),
        "params": params,
        "outs": [out],
    }


def _recipe_keys(tree: Any, reads: tuple[str, ...]) -> list[str]:
    """The recipe file's keys for a stage's reads: each read, or its nearest key that the file
    has (a read inside a section the file leaves out falls back to the section's default)."""
    keys = set()
    for dotted in reads:
        if dotted == "recipe_file":
            continue
        node, found = tree, []
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
            found.append(part)
        if found:
            keys.add(".".join(found))
    # a key inside another listed key is covered by it
    return sorted(k for k in keys if not any(k.startswith(o + ".") for o in keys))


def _referenced_files(loaded: LoadedRecipe, planned: PlannedStage, root: Path) -> set[Path]:
    """Files inside the repository that the stage's recipe keys name (the model source, the
    weights, data, user rules) and, for a build's stages, every profile in ./targets/ (a
    build may pick any of them, and one may extend another)."""
    from edgeflow.recipe.refs import ImportRef

    files: set[Path] = set()

    def walk(value: Any) -> None:
        if isinstance(value, BaseModel):
            for name in type(value).model_fields:
                walk(getattr(value, name))
        elif isinstance(value, Path):
            files.add(value)
        elif isinstance(value, ImportRef):
            files.add(value.source_file() or Path(value.module))
        elif hasattr(value, "rule") and hasattr(value, "fingerprint"):  # a RuleSpec
            files.add(Path(inspect.getsourcefile(value.rule) or "."))
        elif isinstance(value, dict | list | tuple):
            for item in value.values() if isinstance(value, dict) else value:
                walk(item)

    for dotted in planned.stage.reads:
        if dotted == "target":
            files.update(resources.available("targets", root).values())
        elif dotted != "recipe_file":
            value: Any = loaded.recipe
            for part in dotted.split("."):
                value = getattr(value, part)
            walk(value)
    resolved = (p.resolve() for p in files)
    return {p.relative_to(root) for p in resolved if p.is_file() and p.is_relative_to(root)}


def _plots(build_dir: Path) -> list[dict[str, Any]]:
    return [
        {
            (build_dir / "latency.csv").as_posix(): {
                "x": "run",
                "y": "ms",
                "title": f"{build_dir.parent.name} {build_dir.name}: latency per run (ms)",
            }
        },
        {
            (build_dir / "layers.csv").as_posix(): {
                "x": "layer",
                "y": "alive_bytes",
                "title": f"{build_dir.parent.name} {build_dir.name}: "
                "activation bytes alive per layer (estimate)",
            }
        },
        {
            (build_dir / "outputs.csv").as_posix(): {
                "x": "output",
                "y": "max_abs_diff",
                "template": "bar_horizontal",
                "title": f"{build_dir.parent.name} {build_dir.name}: max abs diff per output",
            }
        },
    ]


def _yaml_dump(data: Any) -> str:
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt")
    yaml.default_flow_style = False
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    stream = StringIO()
    yaml.dump(data, stream)
    return stream.getvalue()


PARAMS_HEADER = """\
# `edgeflow dvc init` writes the keys edgeflow, recipes, target, quantization and builds;
# other keys are yours. Edit values, then run it again; `dvc params diff` shows changes.
# target, quantization: defaults for every build (null: as each recipe says);
#   `dvc exp run -S target=armnn -S quantization.mode=none` tries other values.
# builds: what each recipe is built as, by name (build/<recipe>/<name>/); a build's own
#   target and quantization (a preset name, or keys) win over the defaults.
"""
HYDRA_HEADER = """\
# DVC composes this file with the groups in conf/ into params.yaml on `dvc exp run`
# (dvc config hydra.enabled true): `dvc exp run -S target=armnn -S quantization=int8_per_tensor
# -S quantization.mode=none`. `edgeflow dvc init` writes the keys edgeflow, recipes and builds
# (edit values, then run it again); other keys are yours.
"""
COMPOSED_HEADER = """\
# Composed by Hydra from conf/ (`edgeflow dvc init`; `dvc exp run` writes it the same way):
# edit conf/config.yaml, not this file.
"""
DVC_HEADER = """\
# `edgeflow dvc init` writes the stages whose command is `edgeflow dvc stage`, with their metrics
# and plots (from recipes/ and params.yaml: run it again after editing those); other stages
# are yours. `dvc repro` reruns the stages whose inputs changed.
"""


def _existing(path: Path, header: str) -> tuple[str, Any]:
    """The file's own header comment (or ours for a new file) and its tree, round-trip."""
    from ruamel.yaml.comments import CommentedMap

    if not path.is_file():
        return header, CommentedMap()
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    top = "".join(line for line in lines[: _header_end(lines)])
    body = text[len(top) :]
    from ruamel.yaml import YAML

    tree = YAML(typ="rt").load(body) if body.strip() else None
    if tree is None:
        tree = CommentedMap()
    if not isinstance(tree, dict):
        raise EdgeflowError(f"{display_path(path)}: expected a mapping at the top level")
    return top or header, tree


def _header_end(lines: list[str]) -> int:
    for i, line in enumerate(lines):
        if line.strip() and not line.startswith("#"):
            return i
    return len(lines)


def _params_values(params: Params) -> dict[str, Any]:
    """edgeflow's keys as init writes them (recipes None: the key is left out)."""
    return {
        "edgeflow": {**params.edgeflow, "version": __version__},
        "recipes": params.recipes,
        "target": params.target,
        "quantization": params.quantization.model_dump(),
        "builds": {n: b.model_dump(exclude_none=True) for n, b in params.builds.items()},
    }


def _params_text(path: Path, params: Params) -> str:
    header, tree = _existing(path, PARAMS_HEADER)
    for key, value in _params_values(params).items():
        if value is None and key == "recipes":
            tree.pop(key, None)
        else:
            tree[key] = value
    return header + _yaml_dump(tree)


def _dvc_text(
    path: Path, stages: dict[str, Any], metrics: list[str], plots: list[dict[str, Any]]
) -> str:
    from ruamel.yaml.comments import CommentedMap

    header, tree = _existing(path, DVC_HEADER)
    theirs = tree.get("stages") or CommentedMap()
    for name in [n for n, st in theirs.items() if _ours(st)]:
        del theirs[name]
    theirs.update(stages)
    tree["stages"] = theirs
    for key, ours in (("metrics", metrics), ("plots", plots)):
        kept = [e for e in tree.get(key) or [] if not _edgeflow_output(e)]
        tree[key] = [*kept, *ours]
        if not tree[key]:
            del tree[key]
    return header + _yaml_dump(tree)


def _ours(stage: Any) -> bool:
    return isinstance(stage, dict) and str(stage.get("cmd", "")).startswith("edgeflow dvc stage ")


def _edgeflow_output(entry: Any) -> bool:
    """A metrics or plots entry edgeflow wrote (dropped, then written again for today's builds)."""
    path = entry if isinstance(entry, str) else next(iter(entry), "")
    name = str(path).rsplit("/", 1)[-1]
    return str(path).startswith("build/") and name in ("metrics.json", *PLOTS)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _relative(path: Path, root: Path) -> Path:
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(root):
        return resolved
    return resolved.relative_to(root)


# ---- stage ---------------------------------------------------------------------------------


def run_stage(
    root: Path, recipe: str, stage_name: str, build: str | None, echo: Callable[[str], None] = print
) -> int:
    """Run one planned stage (the command of a DVC stage); returns the exit status."""
    import json
    import time

    from edgeflow.engine.runner import PUBLISHED_SLOTS, execute, publish

    root = root.resolve()
    recipe_path = (root / recipe).resolve()
    params = read_params(root) or Params()
    builds = [build] if build else list(params.builds)
    loaded = load_recipe(recipe_path, params.overrides(builds[0]), root)
    wanted = (
        f"{recipe_path.stem}.{build}.{stage_name}" if build else f"{recipe_path.stem}.{stage_name}"
    )
    planned = {p.name: p for p in plan(recipe_path, builds, loaded, root)}
    if wanted not in planned:
        raise EdgeflowError(
            f"no stage {wanted} in the plan of {recipe}",
            "dvc.yaml is out of date: run `edgeflow dvc init` again",
        )
    step = planned[wanted]
    missing = [p for p in step.inputs.values() if not (root / p).exists()]
    if missing:
        raise EdgeflowError(
            f"{wanted}: input {missing[0]} is missing", "run `dvc repro`, which makes it first"
        )
    out = root / step.out
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True)
    start = time.perf_counter()
    inputs = {slot: root / path for slot, path in step.inputs.items()}
    try:
        execute(step.stage, loaded, inputs, tmp)
        warnings = tmp / WARNINGS_FILE
        messages = json.loads(warnings.read_text()) if warnings.is_file() else []
        if step.last:  # build/<recipe>/<build>/ as `edgeflow run` writes it
            slots = {slot: root / path for slot, path in step.published.items()}
            slots.update(
                {s: tmp / f for s, f in step.stage.produces.items() if s in PUBLISHED_SLOTS}
            )
            publish(out, slots)
            shutil.rmtree(tmp)
        else:
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            if out.exists():
                os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    echo(f"  {wanted:<40} ran {time.perf_counter() - start:7.2f} s")
    for message in messages:
        echo("  warning: " + message.replace("\n", "\n  "))
    if step.last:
        metrics = json.loads((out / "metrics.json").read_text())
        if not metrics["verified"] and not metrics.get("not_verified"):
            print(
                f"error: verification failed; the build is kept for inspection in "
                f"{display_path(out)} (see report.md)",
                file=sys.stderr,
            )
            return 1
    return 0
