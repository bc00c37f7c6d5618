"""The fuzz part's cases: the base recipes, reproducible mutations of them, and controls."""

from __future__ import annotations

import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .common import BenchError
from .inputs import tiny_onnx
from .mutations import CLASSES, Base, Mutant, Mutator
from .recipe_tree import to_yaml

SHIPPED = ("digits_cnn", "digits_cnn_qat", "digits_mobilenet", "ssdlite320", "ssdlite320_tflite")
FILE_SUFFIXES = (".pt", ".pth", ".onnx", ".npz", ".npy")
PATH_VALUE = re.compile(
    r"(?P<key>\b(?:weights|model|dataset):[ \t]*)(?P<q>[\"']?)(?P<value>[^\"'\s,{}\[\]#]+)(?P=q)"
)


@dataclass
class Case:
    """One fuzz case, as reported."""

    ident: str
    klass: str
    base: str
    mutation: str
    must_refuse: bool
    path: Path
    fault: Path | None
    outcome: str = ""
    code: int | None = None
    output: str = ""


def absolute_paths(text: str, folder: Path) -> str:
    """Rewrite relative file paths of a recipe (weights: ../models/x.pt) to absolute ones."""

    def fix(m: re.Match[str]) -> str:
        value = m["value"]
        file, sep, attr = value.partition(".py:")
        if sep and not Path(file).is_absolute():
            value = f"{os.path.normpath(folder / file)}.py:{attr}"
        elif value.endswith(FILE_SUFFIXES) and not Path(value).is_absolute():
            value = os.path.normpath(folder / value)
        return f"{m['key']}{m['q']}{value}{m['q']}"

    return PATH_VALUE.sub(fix, text)


def shipped_bases(repo: Path, folder: Path) -> list[Base]:
    """The shipped recipes copied into `folder`, relative paths made absolute."""
    from edgeflow.core.loader import plain, read_yaml

    bases = []
    for name in SHIPPED:
        source = repo / "recipes" / f"{name}.yaml"
        text = absolute_paths(source.read_text(encoding="utf-8"), source.parent)
        copy_path = folder / f"{name}.yaml"
        copy_path.write_text(text, encoding="utf-8")
        bases.append(Base(name, plain(read_yaml(copy_path)), text))
    return bases


def onnx_base(folder: Path) -> Base:
    """A recipe with an ONNX source (a small valid model and an .npz dataset)."""
    model, data = tiny_onnx(folder)
    tree = {
        "name": "tiny_onnx",
        "source": {
            "kind": "onnx",
            "model": str(model),
            "inputs": [{"name": "x", "shape": [1, 64], "dtype": "float32"}],
            "outputs": ["y"],
        },
        "calibration": {"dataset": str(data), "samples": 8},
        "evaluation": {"dataset": str(data), "metric": "agreement"},
        "quantization": {"mode": "int8", "per_channel": True},
        "target": "onnxruntime_micro",
        "verify": {"max_abs_diff": 0.5, "latency_runs": 5, "warmup_runs": 1},
    }
    return Base("tiny_onnx", tree, to_yaml(tree))


def write_recipe(mutant: Mutant, path: Path) -> None:
    """Put the mutated recipe at `path` (or the odd thing in its place)."""
    if mutant.recipe == "absent":
        return
    if mutant.recipe == "dir":
        path.mkdir()
        return
    if mutant.recipe == "loop":
        path.symlink_to(path.name)
        return
    path.write_bytes(mutant.raw if mutant.raw is not None else to_yaml(mutant.tree).encode())
    if mutant.recipe == "unreadable":
        path.chmod(0)


def generate_cases(
    count: int, bases: list[Base], root: Path, classes: dict[str, Mutator] = CLASSES
) -> list[Case]:
    """`count` reproducible cases, the classes in turn, no two the same where avoidable."""
    rng = random.Random(0)
    seen: set[tuple[str, str, str]] = set()
    cases = []
    names = list(classes)
    for i in range(count):
        klass = names[i % len(names)]
        ident = f"c{i + 1:04d}"
        folder = root / ident
        mutant, base = new_mutant(rng, klass, bases, folder, seen, classes)
        path = root / f"{ident}-{base.name}.yaml"
        write_recipe(mutant, path)
        fault = path if mutant.recipe != "file" else mutant.fault
        cases.append(
            Case(ident, klass, base.name, mutant.mutation, mutant.must_refuse, path, fault)
        )
    return cases


def new_mutant(
    rng: random.Random,
    klass: str,
    bases: list[Base],
    folder: Path,
    seen: set[tuple[str, str, str]],
    classes: dict[str, Mutator] = CLASSES,
) -> tuple[Mutant, Base]:
    """A mutation of class `klass` of a random base, different from those made so far."""
    for attempt in range(60):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        base = rng.choice(bases)
        mutant = classes[klass](rng, base, folder)
        if mutant is None:
            continue
        key = (klass, base.name, mutant.mutation)
        if key not in seen or attempt == 59:
            seen.add(key)
            return mutant, base
    raise BenchError(f"no applicable mutation of class {klass}")


def control_cases(bases: list[Base], root: Path) -> list[Case]:
    """The unmutated bases, as copied text and as written by this script: must validate."""
    cases = []
    for base in bases:
        for how, data in (("text", base.text.encode()), ("emitted", to_yaml(base.tree).encode())):
            path = root / f"control-{how}-{base.name}.yaml"
            path.write_bytes(data)
            cases.append(Case(f"control-{how}", "control", base.name, how, False, path, None))
    return cases
