"""`edgeflow dvc init`: a DVC pipeline that follows the stage graph.

`init` writes dvc.yaml and params.yaml for every recipe in recipes/. params.yaml names the
builds (a target and a quantization, each falling back to the top-level `target` and
`quantization`, then to the recipe). Each edgeflow stage becomes a DVC stage; stages that read
neither the target nor the quantization, and take no input from a stage that does (load,
rewrite, export, rewrite_onnx for a PyTorch source), appear once per recipe and feed all of its
builds. A stage's DVC params are the recipe keys it reads, in the recipe file itself, so
`dvc repro` after a quantization edit reruns quantize and what follows, not the export.

Each DVC stage runs `edgeflow dvc stage` (edgeflow/engine/dvcstage.py); params.yaml and the
Hydra config groups are edgeflow/engine/dvcparams.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from edgeflow.core import resources
from edgeflow.core.errors import EdgeflowError
from edgeflow.core.loader import display_path, read_yaml
from edgeflow.engine.dvcparams import (
    HYDRA_CONFIG,
    PARAMS_FILE,
    Params,
    enable_dvc_hydra,
    existing,
    hydra_files,
    params_text,
    product_builds,
    read_params,
    write_atomic,
    write_composed,
    yaml_dump,
)
from edgeflow.recipe import LoadedRecipe, load_recipe
from edgeflow.stages.base import Stage

DVC_FILE = Path("dvc.yaml")
STAGE_DIR = Path(".edgeflow/dvc")  # the DVC outputs of stages before the last
BUILD_READS = ("target", "quantization")  # what a build changes; stages reading it are per build
PLOTS = ("latency.csv", "outputs.csv", "layers.csv")


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


def plan(recipe_path: Path, builds: dict[str, LoadedRecipe], root: Path) -> list[PlannedStage]:
    """The DVC stages of one recipe: shared stages once, then each build's own, in run order.
    `builds`: each build's recipe (its pipeline may differ: a tensorflow source converts
    natively for the TFLite family and through ONNX for the other targets)."""
    from edgeflow.engine.pipeline import load_pipeline, pipeline_name
    from edgeflow.engine.runner import PUBLISHED_SLOTS, seed_slots

    stem = recipe_path.stem
    planned: dict[str, PlannedStage] = {}
    for build, loaded in builds.items():
        pipeline = load_pipeline(pipeline_name(loaded), root)
        seeds = {
            slot: _relative(s.path, root) for slot, s in seed_slots(loaded, pipeline.seeds).items()
        }
        per_build_stage = {
            s.name: any(r.split(".")[0] in BUILD_READS for r in s.reads) for s in pipeline.stages
        }
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
        params = params.model_copy(update={"builds": product_builds(targets, quantizations)})
    if recipes:
        params = params.model_copy(update={"recipes": recipes})
    stages: dict[str, Any] = {}
    metrics: list[str] = []
    plots: list[dict[str, Any]] = []
    artifacts: dict[str, Any] = {}
    for recipe_path in _recipe_files(root, params.recipes):
        builds = [
            name
            for name, spec in params.builds.items()
            if spec.recipes is None or recipe_path.stem in spec.recipes
        ]
        # every build must load (a build its target cannot make is an error here, not later)
        loaded_builds = {b: load_recipe(recipe_path, params.overrides(b), root) for b in builds}
        loaded = load_recipe(recipe_path, None, root)
        for planned in plan(recipe_path, loaded_builds, root):
            stages[planned.name] = _dvc_stage(planned, recipe_path, loaded, root)
            if planned.last:
                metrics.append((planned.out / "metrics.json").as_posix())
                plots += _plots(planned.out)
                artifacts.update(_report_artifact(planned.out))
    outputs = {"metrics": metrics, "plots": plots, "artifacts": artifacts}
    files = {root / DVC_FILE: _dvc_text(root / DVC_FILE, stages, outputs)}
    if hydra:
        files.update(hydra_files(root, params))
    else:
        files[root / PARAMS_FILE] = params_text(root / PARAMS_FILE, params)
    changed = _write(files, check, echo)
    if hydra:  # params.yaml as DVC composes it, from the conf/ just written
        changed |= write_composed(root, check, echo)
        if not check:
            enable_dvc_hydra(root, echo)
    return changed


def _write(files: dict[Path, str], check: bool, echo: Callable[[str], None]) -> bool:
    stale = [p for p, text in sorted(files.items()) if not _same(p, text)]
    for path in stale:
        if check:
            echo(f"{display_path(path)} is out of date: run `edgeflow dvc init`")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, files[path])
        echo(f"wrote {display_path(path)}")
    if not stale:
        echo(f"up to date: {', '.join(display_path(p) for p in sorted(files))}")
    return bool(stale)


def _same(path: Path, text: str) -> bool:
    return path.is_file() and path.read_text(encoding="utf-8") == text


def _recipe_files(root: Path, names: list[str] | None) -> list[Path]:
    from edgeflow.core.suggest import did_you_mean

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
    from edgeflow.core.refs import ImportRef

    files: set[Path] = set()

    def walk(value: Any) -> None:
        if isinstance(value, BaseModel):
            for name in type(value).model_fields:
                walk(getattr(value, name))
        elif isinstance(value, Path):
            files.add(value)
        elif isinstance(value, ImportRef):  # its module and the user's modules it imports
            files.update(value.files().values())
        elif hasattr(value, "rule") and hasattr(value, "code_refs"):  # a RuleSpec
            for ref in value.code_refs().values():
                files.update(ref.files().values())
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
    return {  # a folder (a SavedModel) is one DVC dependency
        p.relative_to(root) for p in resolved if p.exists() and p.is_relative_to(root)
    }


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


DVC_HEADER = """\
# `edgeflow dvc init` writes the stages whose command is `edgeflow dvc stage`, with their metrics
# and plots (from recipes/ and params.yaml: run it again after editing those); other stages
# are yours. `dvc repro` reruns the stages whose inputs changed.
"""


def _report_artifact(build_dir: Path) -> dict[str, Any]:
    """The build's report.html as a DVC artifact (`dvc artifacts get`, DVC Studio), named
    after the build as DVC's artifact names allow."""
    name = re.sub(r"[^a-zA-Z0-9_-]+", "-", f"{build_dir.parent.name}-{build_dir.name}-report")
    return {
        name.strip("-_"): {
            "path": (build_dir / "report.html").as_posix(),
            "type": "report",
            "desc": f"edgeflow's report of {build_dir.parent.name} {build_dir.name}: "
            "figures, thresholds and plots in one self-contained page",
        }
    }


def _dvc_text(path: Path, stages: dict[str, Any], outputs: dict[str, Any]) -> str:
    """dvc.yaml with edgeflow's stages, metrics, plots and artifacts; the user's own kept."""
    from ruamel.yaml.comments import CommentedMap

    header, tree = existing(path, DVC_HEADER)
    theirs = tree.get("stages") or CommentedMap()
    for name in [n for n, st in theirs.items() if _ours(st)]:
        del theirs[name]
    theirs.update(stages)
    tree["stages"] = theirs
    for key in ("metrics", "plots"):
        kept = [e for e in tree.get(key) or [] if not _edgeflow_output(e)]
        tree[key] = [*kept, *outputs[key]]
        if not tree[key]:
            del tree[key]
    kept_artifacts = {
        name: entry
        for name, entry in (tree.get("artifacts") or {}).items()
        if not _edgeflow_output(entry.get("path", "") if isinstance(entry, dict) else "")
    }
    tree["artifacts"] = {**kept_artifacts, **outputs["artifacts"]}
    if not tree["artifacts"]:
        del tree["artifacts"]
    return header + yaml_dump(tree)


def _ours(stage: Any) -> bool:
    return isinstance(stage, dict) and str(stage.get("cmd", "")).startswith("edgeflow dvc stage ")


def _edgeflow_output(entry: Any) -> bool:
    """A metrics, plots or artifacts entry edgeflow wrote (dropped, then written again for
    today's builds)."""
    path = entry if isinstance(entry, str) else next(iter(entry), "")
    name = str(path).rsplit("/", 1)[-1]
    return str(path).startswith("build/") and name in ("metrics.json", "report.html", *PLOTS)


def _relative(path: Path, root: Path) -> Path:
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(root):
        return resolved
    return resolved.relative_to(root)
