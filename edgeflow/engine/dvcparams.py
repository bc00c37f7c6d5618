"""params.yaml and conf/ for `edgeflow dvc init`: the builds each recipe makes, the defaults
`dvc exp run -S` changes, and the Hydra config groups for DVC's Hydra composition.

Also the YAML writing both generated files share: the user's own keys, stages and comments
are kept (ruamel round trip), and a file is replaced by one rename.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from edgeflow import __version__
from edgeflow.core import resources
from edgeflow.core.errors import EdgeflowError
from edgeflow.core.loader import display_path, plain, read_yaml, validate

PARAMS_FILE = Path("params.yaml")
BUILD_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
HYDRA_CONFIG = Path("conf/config.yaml")  # DVC's default for `dvc config hydra.enabled true`


class QuantizationKeys(BaseModel):
    """Quantization keys a build sets; null keeps the recipe's value. The same keys as the
    recipe's `quantization` section (tests/test_dvc_init.py keeps the two in step)."""

    model_config = ConfigDict(extra="forbid")

    mode: str | None = None
    per_channel: bool | None = None
    symmetric: bool | None = None
    method: str | None = None
    reduce_range: bool | Literal["auto"] | None = None
    activations: str | None = None
    fallback: str | None = None
    float_outputs: bool | None = None
    fallback_max_trials: int | None = None
    fallback_max_seconds: float | None = None
    keep_float: list[str] | None = None


class BuildParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: str | None = None
    quantization: str | QuantizationKeys | None = None  # a preset name, or keys
    recipes: list[str] | None = None  # only these recipes get the build (default: all)

    @field_validator("quantization")
    @classmethod
    def _known_preset(cls, value: Any) -> Any:
        from edgeflow.schema.sections import QUANTIZATION_PRESETS

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
        from edgeflow.schema.sections import QUANTIZATION_PRESETS

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


def product_builds(
    targets: list[str] | None, quantizations: list[str] | None
) -> dict[str, BuildParams]:
    from edgeflow.core.suggest import did_you_mean
    from edgeflow.schema.sections import QUANTIZATION_PRESETS

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


def hydra_files(root: Path, params: Params) -> dict[Path, str]:
    """conf/config.yaml (edgeflow's keys updated, the rest kept) and the generated groups:
    conf/target/<profile>.yaml and conf/quantization/<preset>.yaml, so that `dvc exp run
    -S target=armnn -S quantization=int8_per_tensor -S quantization.mode=none` composes."""
    from edgeflow.schema.sections import QUANTIZATION_KEYS, QUANTIZATION_PRESETS

    files = {}
    # Hydra reads the package directive from the first line only
    note = "# @package _global_\n# `edgeflow dvc init` writes this group option.\n"
    for name in ["recipe", *resources.available("targets", root)]:
        value = None if name == "recipe" else name
        files[root / "conf/target" / f"{name}.yaml"] = note + yaml_dump({"target": value})
    for name, preset in QUANTIZATION_PRESETS.items():
        keys = {key: preset.get(key) for key in QUANTIZATION_KEYS}
        body = yaml_dump({"quantization": keys})
        files[root / "conf/quantization" / f"{name}.yaml"] = note + body
    path = root / HYDRA_CONFIG
    header, tree = existing(path, HYDRA_HEADER)
    if not path.is_file():  # start from params.yaml's own keys, so training params carry over
        _, old = existing(root / PARAMS_FILE, "")
        tree["defaults"] = [{"target": "recipe"}, {"quantization": "recipe"}, "_self_"]
        tree.update({k: v for k, v in old.items() if k not in ("target", "quantization")})
    for key, value in _params_values(params).items():
        if key in ("target", "quantization"):
            continue  # chosen through the defaults list's groups
        if value is None:
            tree.pop(key, None)
        else:
            tree[key] = value
    files[path] = header + yaml_dump(tree)
    return files


def write_composed(root: Path, check: bool, echo: Callable[[str], None]) -> bool:
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
        write_atomic(path, COMPOSED_HEADER + yaml_dump(composed))
        echo(f"wrote {display_path(path)}")
    return True


def enable_dvc_hydra(root: Path, echo: Callable[[str], None]) -> None:
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


def yaml_dump(data: Any) -> str:
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


def existing(path: Path, header: str) -> tuple[str, Any]:
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


def params_text(path: Path, params: Params) -> str:
    header, tree = existing(path, PARAMS_HEADER)
    for key, value in _params_values(params).items():
        if value is None and key == "recipes":
            tree.pop(key, None)
        else:
            tree[key] = value
    return header + yaml_dump(tree)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
