"""`edgeflow init MODEL`: a recipe for a model file or class, and random data to replace.

Reads the model's inputs, dtypes and outputs (edgeflow.scaffold.model for files,
edgeflow.scaffold.code for code), proposes batch axes and state links
(edgeflow.scaffold.render), writes `<name>.yaml` and beside it `<name>_data.py` (unless
`--data FILE.npz`), validates the recipe before it is in place, and never overwrites a
file: each is created whole under a temporary name and linked to its own (which fails if
that name exists).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgeflow.core.errors import EdgeflowError, RecipeError
from edgeflow.scaffold.model import KINDS, Asked, Given, Model, parse_input
from edgeflow.scaffold.render import Plan, batch_axes, data_text, recipe_text, state_links
from edgeflow.schema.source import KERAS_SUFFIXES, SAVED_MODEL_FILES

DEFAULT_TARGET = "onnxruntime_micro"
__all__ = ["DEFAULT_TARGET", "KINDS", "InitOptions", "Written", "init"]


@dataclass(frozen=True)
class InitOptions:
    """The command line of `edgeflow init`."""

    model: str
    target: str = DEFAULT_TARGET
    output: Path | None = None
    inputs: tuple[str, ...] = ()  # --input NAME:SHAPE[:DTYPE]
    init: tuple[str, ...] = ()  # --init KEY=VALUE
    data: Path | None = None
    kind: str | None = None

    def command(self, inputs: Sequence[str] | None = None) -> str:
        """This command as a shell line, with other --input arguments where given."""
        parts = ["edgeflow", "init", self.model]
        if self.kind:
            parts += ["--kind", self.kind]
        if self.target != DEFAULT_TARGET:
            parts += ["--target", self.target]
        if self.output is not None:
            parts += ["--output", str(self.output)]
        for text in self.init:
            parts += ["--init", text]
        for text in self.inputs if inputs is None else inputs:
            parts += ["--input", text]
        if self.data is not None:
            parts += ["--data", str(self.data)]
        return shlex.join(parts)


@dataclass(frozen=True)
class Written:
    """What init wrote, and what the user should know about it."""

    recipe: Path
    data: Path | None  # the generated data file (None with --data)
    plan: Plan
    notes: list[str] = field(default_factory=list)


def init(options: InitOptions) -> Written:
    """Read the model, write the recipe (and the data file), validated; paths are taken
    from the working directory."""
    from edgeflow.targets import load_profile

    given = _given(options.inputs)
    values = _init_values(options.init)
    kind, path = _kind(options)
    if path is not None and values:
        raise EdgeflowError(
            f"--init: {options.model} is a saved model; --init passes arguments to a class or "
            "a function that builds one",
            "leave --init out",
        )
    recipe = _recipe_path(options.output, _stem(options.model, path))
    data = None if options.data is not None else _data_path(recipe)
    taken = [f for f in (recipe, data) if f is not None and _exists(f)]
    if taken:
        free = _free(recipe, data is not None)
        raise EdgeflowError(
            f"{' and '.join(map(str, taken))} exist{'s' if len(taken) == 1 else ''}: edgeflow "
            "init does not overwrite files",
            f"remove {'it' if len(taken) == 1 else 'them'}, or write another: "
            f"{replace(options, output=free).command()}",
        )
    profile = load_profile(options.target)  # an unknown target, before the model is read
    arrays = _data_arrays(options.data)
    asked = Asked(given, arrays)
    model = _read(options, kind, path, asked, values)
    native = profile.family.tensorflow_native
    plan = _plan(model, options, recipe, data, given, arrays, native)
    if options.data is not None:
        _check_data(options.data, plan)
    texts = {recipe: recipe_text(plan, recipe.stem)}
    if data is not None:
        texts[data] = data_text(plan, recipe.name)
    _write(texts, recipe)
    return Written(recipe, data, plan, _notes(plan))


def _data_path(recipe: Path) -> Path:
    """The generated data file beside a recipe: data.py, or NAME_data.py where a data.py is
    there already (another recipe's: never overwritten)."""
    plain = recipe.with_name("data.py")
    return recipe.with_name(f"{recipe.stem}_data.py") if _exists(plain) else plain


def _free(recipe: Path, with_data: bool) -> Path:
    """The first NAME_2.yaml, NAME_3.yaml, ... that init can write (with its data file)."""
    n = 2
    while True:
        other = recipe.with_stem(f"{recipe.stem}_{n}")
        if not _exists(other) and not (with_data and _exists(_data_path(other))):
            return other
        n += 1


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _given(texts: Sequence[str]) -> dict[str, Given]:
    found: dict[str, Given] = {}
    for text in texts:
        one = parse_input(text)
        if one.name in found:
            raise EdgeflowError(f"--input {text}: '{one.name}' is given twice", "give it once")
        found[one.name] = one
    return found


def _init_values(texts: Sequence[str]) -> dict[str, Any]:
    """--init KEY=VALUE, each value read as YAML (16, 0.5, true, [1, 2], text)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    values: dict[str, Any] = {}
    for text in texts:
        key, sep, raw = text.partition("=")
        if not sep or not key.isidentifier():
            raise EdgeflowError(
                f"--init {text}: expected KEY=VALUE, KEY an argument's name",
                "e.g. --init hidden=16 --init name=small",
            )
        try:
            value = YAML(typ="safe", pure=True).load(raw) if raw.strip() else ""
        except YAMLError as exc:
            raise EdgeflowError(
                f"--init {text}: the value does not read as YAML", "quote it: 'key=\"text\"'"
            ) from exc
        values[key] = value
    return values


def _kind(options: InitOptions) -> tuple[str | None, Path | None]:
    """The source kind a path says (None for code: what it builds says), and the path."""
    text, forced = options.model, options.kind
    path = Path(text)
    if path.is_dir():
        if not any((path / name).is_file() for name in SAVED_MODEL_FILES):
            raise EdgeflowError(
                f"{text} is a folder without saved_model.pb: not a SavedModel",
                "name a SavedModel folder, an .onnx, .keras or .h5 file, or code: file.py:Name",
            )
        kind = "tensorflow"
    elif path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".py":
            raise EdgeflowError(
                f"{text} is a Python file: name the class or function in it",
                f"{options.command().replace(text, f'{text}:Name', 1)}",
            )
        if suffix not in (".onnx", *KERAS_SUFFIXES):
            raise EdgeflowError(
                f"{text}: edgeflow init reads .onnx, .keras and .h5 files and SavedModel folders",
                "export the model to ONNX, or name its code: file.py:Name or pkg.module:Name",
            )
        kind = "onnx" if suffix == ".onnx" else "tensorflow"
    elif ":" in text:
        if forced == "onnx":
            raise EdgeflowError(f"--kind onnx: {text} names code", "name an .onnx file")
        return None, None
    else:
        raise EdgeflowError(
            f"{text}: no such file or folder",
            "name a model file (.onnx, .keras, .h5), a SavedModel folder, or code: "
            "file.py:Name or pkg.module:Name",
        )
    if forced is not None and forced != kind:
        raise EdgeflowError(f"--kind {forced}: {text} is a {kind} model", f"--kind {kind}")
    return kind, path


def _stem(text: str, path: Path | None) -> str:
    """The recipe's name from the model's: a file's stem, a class's in snake case."""
    if path is not None:
        raw = path.resolve().name if path.is_dir() else path.stem
    else:
        raw = text.rpartition(":")[2]
        raw = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", raw)
    stem = re.sub(r"[^a-z0-9_]+", "_", raw.lower()).strip("_")
    return stem or "model"


def _recipe_path(output: Path | None, stem: str) -> Path:
    """--output, or <stem>.yaml in ./recipes/ where there is one, else here."""
    if output is None:
        folder = Path("recipes") if Path("recipes").is_dir() else Path(".")
        return folder / f"{stem}.yaml"
    if output.is_dir():
        return output / f"{stem}.yaml"
    if output.suffix not in (".yaml", ".yml") or output.name.startswith("."):
        raise EdgeflowError(
            f"--output {output}: a recipe is a .yaml file whose name does not start with '.'",
            f"--output {output.with_name(output.name.lstrip('.') or stem).with_suffix('.yaml')}",
        )
    if not output.parent.is_dir():
        raise EdgeflowError(f"--output {output}: no folder {output.parent}", "create it first")
    return output


def _data_arrays(data: Path | None) -> dict[str, tuple[int, ...]]:
    if data is None:
        return {}
    from edgeflow.core.filekinds import file_problem
    from edgeflow.data import array_shapes

    if not data.is_file():
        raise EdgeflowError(f"--data {data}: no such file", "check the path")
    if data.suffix != ".npz":
        raise EdgeflowError(
            f"--data {data}: not a .npz file", "np.savez('data.npz', input_name=array, ...)"
        )
    problem = file_problem(data)
    if problem:
        raise EdgeflowError(f"--data {data}: {problem}", "write it with numpy.savez")
    return array_shapes(data)


def _read(
    options: InitOptions, kind: str | None, path: Path | None, asked: Asked, values: dict[str, Any]
) -> Model:
    from edgeflow.scaffold import code, model

    if kind == "onnx" and path is not None:
        return model.read_onnx(path, asked)
    if kind == "tensorflow" and path is not None:
        return model.read_tensorflow(path, asked)
    ref = code.resolve(options.model)
    try:
        found = code.read_code(ref, options.model, asked, values)
    except code.MissingShapes as exc:
        if not exc.guessed:
            raise
        texts = [g.text for g in exc.guessed.values()]
        raise EdgeflowError(exc.message, f"shapes that ran it: {options.command(texts)}") from None
    if options.kind is not None and options.kind != found.kind:
        raise EdgeflowError(
            f"--kind {options.kind}: {options.model} builds a {found.kind} model",
            f"--kind {found.kind}, or leave --kind out",
        )
    return found


def _relative(path: Path, folder: Path) -> str:
    """A path as a recipe in `folder` names it."""
    return Path(os.path.relpath(path.resolve(), folder.resolve())).as_posix()


def _plan(
    model: Model,
    options: InitOptions,
    recipe: Path,
    data: Path | None,
    given: dict[str, Given],
    arrays: dict[str, tuple[int, ...]],
    native: bool,
) -> Plan:
    links = state_links(model)
    axes, notes = batch_axes(model, links)
    states = {link.input for link in links}
    zero_d = [t.name for t in model.inputs if not t.shape and t.name not in states]
    off = ""
    if links and zero_d:
        off = f"off: a stateful model's data inputs need a batch axis ({', '.join(zero_d)}: 0-D)"
    elif links and options.data is not None and not _sequences(model, states, arrays):
        off = f"off: {options.data.name} holds single steps, not sequences [N, steps, ...]"
    folder = recipe.parent
    if model.path is None:
        source = model.reference  # pkg.module:Name
    elif model.reference:  # file.py:Name
        source = f"{_relative(model.path, folder)}:{model.reference.rpartition(':')[2]}"
    else:
        source = _relative(model.path, folder)
    data_file = _relative(options.data, folder) if options.data is not None else ""
    said = (
        [f"The samples come from {data_file} (--data)."]
        if data is None
        else [
            f"{data.name} feeds it RANDOM samples of the inputs' shapes and dtypes: replace",
            "its samples() with your real data. Until then a build shows only that the artifact",
            "computes what the model computes on random inputs, nothing about accuracy.",
        ]
    )
    header = [
        f"Written by `{options.command()}`.",
        "A recipe to start from: read every line; each key's comment points to its section",
        "of edgeflow's docs/recipe.md.",
        *said,
        f"Build and verify it: edgeflow run recipe={recipe.as_posix()}",
    ]
    return Plan(
        model,
        source,
        axes,
        notes,
        links,
        off=off,
        data_file=data_file,
        data_module=data.name if data is not None else "",
        given={name: one.dtype is not None for name, one in given.items()},
        target=options.target,
        via_onnx=bool(links) and not off and model.kind == "tensorflow" and native,
        header=header,
    )


def _sequences(model: Model, states: set[str], arrays: dict[str, tuple[int, ...]]) -> bool:
    """Whether the --data arrays hold sequences (a step axis) for a stateful model."""
    if states & set(arrays):  # the data feed the state: single steps
        return False
    data = [t for t in model.inputs if t.name not in states and t.name in arrays]
    return bool(data) and all(len(arrays[t.name]) == len(t.shape) + 1 for t in data)


def _check_data(path: Path, plan: Plan) -> None:
    """The --data arrays against the inputs the recipe declares."""
    from edgeflow.data import array_shapes, shape_mismatch
    from edgeflow.schema.sections import TensorSpec

    arrays = array_shapes(path)
    for t in plan.data_inputs():
        if t.name not in arrays:
            raise EdgeflowError(
                f"--data {path}: no array '{t.name}' (it has: {', '.join(arrays) or 'none'})",
                "name the arrays after the model's inputs: np.savez(path, "
                + ", ".join(f"{x.name}=..." for x in plan.data_inputs())
                + ")",
            )
        spec = TensorSpec.model_validate(
            {
                "name": t.name,
                "shape": list(t.shape),
                "dtype": t.dtype,
                "batch_axis": plan.axes[t.name],
            }
        )
        problem = shape_mismatch(arrays[t.name], spec, plan.streaming)
        if problem:
            raise EdgeflowError(
                f"--data {path}: {problem}",
                "--input NAME:SHAPE sets a shape; the arrays hold the samples on axis 0",
            )


def _write(texts: dict[Path, str], recipe: Path) -> None:
    """Write each file whole under a temporary name, validate the recipe, then link each to
    its name (refused if that exists); on any failure nothing of them is left."""
    from edgeflow.recipe import load_recipe

    temps: dict[Path, Path] = {}
    placed: list[Path] = []
    try:
        for final, text in texts.items():
            temp = final.with_name(f"{final.stem}-edgeflow-init-{os.getpid()}{final.suffix}")
            # "x": created here, or refused (a file or link already there is not followed,
            # and so never removed below)
            try:
                with open(temp, "x", encoding="utf-8") as f:
                    temps[final] = temp
                    f.write(text)
            except FileExistsError:
                raise EdgeflowError(
                    f"{temp} is in the way of edgeflow init's temporary file (nothing written)",
                    "remove it, or run again (the name holds the process id)",
                ) from None
        data = [f for f in texts if f != recipe]
        for final in data:  # the recipe names the data file by its own name
            _link(temps[final], final)
            placed.append(final)
        try:
            load_recipe(temps[recipe], user_code=False)
        except RecipeError as exc:
            shown = exc.render().replace(temps[recipe].name, recipe.name)
            raise EdgeflowError(
                f"the recipe edgeflow init made does not validate (nothing was written):\n{shown}",
                "where no problem is about --target, --input or --data, it is a bug in edgeflow "
                "init: please report it",
            ) from None
        _link(temps[recipe], recipe)
        placed.append(recipe)
    except BaseException:
        for final in placed:
            final.unlink(missing_ok=True)
        raise
    finally:
        for temp in temps.values():
            temp.unlink(missing_ok=True)


def _link(temp: Path, final: Path) -> None:
    """`temp` under the name `final`, which must not exist (it may have appeared since the
    check before the model was read)."""
    try:
        try:
            os.link(temp, final)  # fails where `final` exists: nothing is overwritten
        except FileExistsError:
            raise
        except OSError:  # a file system without hard links: create it exclusively, then fill
            with open(final, "x", encoding="utf-8") as f:
                f.write(temp.read_text(encoding="utf-8"))
    except FileExistsError:
        raise EdgeflowError(
            f"{final} exists: edgeflow init does not overwrite files", "remove it, or --output"
        ) from None


def _notes(plan: Plan) -> list[str]:
    """What the user should check, one line each."""
    from edgeflow.scaffold.render import shape_note

    notes = []
    for t in plan.model.inputs:
        said = [plan.axis_notes[t.name]] if t.open_batch or plan.axes[t.name] != 0 else []
        said += [shape_note(t, False)] if t.chosen else []
        if said:
            notes.append(f"{t.name} {list(t.shape)}: {'; '.join(said)}")
    for link in plan.links:
        state = "proposed" if plan.streaming else "proposed, written commented out"
        notes.append(f"state: {link.input} <- {link.output} {state} ({link.why})")
    if plan.off:
        notes.append(plan.off)
    return notes
