"""The fuzz part's mutations: each class of mistake, as a function from a base recipe."""

from __future__ import annotations

import copy
import math
import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .recipe_tree import (
    Path_,
    Raw,
    concrete,
    dotted,
    get_in,
    kind_of,
    needs_calibration,
    nullable,
    shown,
    to_yaml,
    walk,
    with_value,
    without,
)


@dataclass(frozen=True)
class Base:
    """A shipped recipe (paths made absolute) as text and as data, or the ONNX-source base."""

    name: str
    tree: dict[str, Any]
    text: str

    @property
    def pytorch(self) -> bool:
        """Whether the source is a PyTorch model (it then has weights and init)."""
        return self.tree["source"]["kind"] == "pytorch"


@dataclass
class Mutant:
    """A mutation of a base: what changed, whether it MUST be refused, and the recipe to write
    (`tree` as YAML, or `raw` bytes; `recipe` says when the recipe file itself is odd)."""

    mutation: str
    must_refuse: bool
    tree: Any = None
    raw: bytes | None = None
    fault: Path | None = None
    recipe: str = "file"  # file | absent | dir | loop | unreadable


Mutator = Callable[[random.Random, Base, Path], Mutant | None]
# A value of another type for each kind of key (none of them valid there).
WRONG_VALUES: dict[str, list[Any]] = {
    "number": ["fast", [1, 2], {"a": 1}, None],
    "bool": ["fast", 2.5, [True], {"a": 1}, None],
    "str": [5, 2.5, True, ["x"], {"a": 1}, None],
    "map": [[1, 2], "text", 5, None],
    "list": [{"a": 1}, "text", 5, None],
    "rule": [5, [1], None, {"option": 1}],
}
# (what, recipe value, the file at fault, must refuse) for a file the recipe names
FileVariant = tuple[str, Any, Path | None, bool]
NUMBER_KEYS = (
    "source.inputs[].shape[]",
    "export.opset",
    "calibration.samples",
    "evaluation.samples",
    "verify.max_abs_diff",
    "verify.max_relative_diff",
    "verify.max_accuracy_drop",
    "verify.min_top1_agreement",
    "verify.min_sqnr_db",
    "verify.min_decision_agreement",
    "verify.min_sequence_agreement",
    "verify.max_latency_ms",
    "verify.max_size_bytes",
    "verify.latency_runs",
    "verify.warmup_runs",
    "verify.detections.max_detections",
    "verify.detections.min_match_rate",
)


def set_value(base: Base, path: Path_, value: Any, must: bool, fault: Path | None = None) -> Mutant:
    """The base with one value set, described as `key: value` (as written into the recipe)."""
    return Mutant(
        f"{dotted(path)}: {shown(value)}", must, with_value(base.tree, path, value), fault=fault
    )


def mutate_wrong_type(rng: random.Random, base: Base, folder: Path) -> Mutant | None:
    """A value of another type at any level: a string for a number, a list for a mapping..."""
    nodes = [p for p, _ in walk(base.tree)]
    path = rng.choice(nodes)
    kind = kind_of(path)
    if kind == "unknown":
        return None
    choices = [v for vs in WRONG_VALUES.values() for v in vs] if kind in ("free", "option") else []
    value = copy.deepcopy(rng.choice(choices or WRONG_VALUES[kind]))
    must = kind not in ("free", "option") and not (value is None and nullable(base.tree, path))
    return set_value(base, path, value, must)


def mutate_bool_number(rng: random.Random, base: Base, folder: Path) -> Mutant | None:
    """A boolean where a number goes (shape: [1, 1, true, 8], latency_runs: true, ...)."""
    path = concrete(base.tree, rng.choice(NUMBER_KEYS), rng)
    if path is None:
        return None
    return set_value(base, path, rng.choice([True, False]), True)


UNKNOWN_KEYS: list[Any] = ["colour", "x_note", "ünïcode", 123, True, None]


def mutate_unknown_key(rng: random.Random, base: Base, folder: Path) -> Mutant | None:
    """A key the schema does not have, at any level (a near miss of a real key, or junk)."""
    maps = [p for p, n in walk(base.tree) if isinstance(n, dict)]
    path = rng.choice(maps)
    node = get_in(base.tree, path)
    key = rng.choice([*UNKNOWN_KEYS, near_miss(rng, list(node))])
    if key in node or str(key) in node:
        return None
    items = list(node.items())
    items.insert(rng.randrange(len(items) + 1), (key, rng.choice([1, "x", True])))
    must = kind_of((*path, "x")) not in ("free",)
    where = dotted((*path, str(key))) if path else str(key)
    return Mutant(
        f"added {where}: {shown(dict(items)[key])}", must, with_value(base.tree, path, dict(items))
    )


def near_miss(rng: random.Random, keys: list[Any]) -> str:
    """A typo of one of the keys (a letter dropped or doubled)."""
    names = [k for k in keys if isinstance(k, str) and len(k) > 3] or ["kind"]
    name = rng.choice(names)
    i = rng.randrange(1, len(name))
    return name[:i] + name[i:][1:] if rng.random() < 0.5 else name[:i] + name[i - 1 :]


MISSING_MUST = (
    ("source",),
    ("source", "kind"),
    ("source", "model"),
    ("source", "inputs"),
    ("evaluation",),
    ("target",),
    ("evaluation", "dataset"),
    ("calibration", "dataset"),
    ("source", "inputs", 0, "name"),
    ("source", "inputs", 0, "shape"),
)
MISSING_MAY = (("name",), ("description",), ("export",), ("verify",), ("source", "weights"))
EMPTY_RECIPES = (
    (b"", "an empty file"),
    (b"# only a comment\n", "only a comment"),
    (b"just a string\n", "a string at the top level"),
    (b"- a\n- b\n", "a list at the top level"),
    (b"---\n...\n", "an empty document"),
    (b"a: 1\n---\nb: 2\n", "two documents"),
)


def mutate_missing(rng: random.Random, base: Base, folder: Path) -> Mutant | None:
    """A required section or key removed (source, source.kind, ..., target), or an empty file."""
    if rng.random() < 0.15:
        raw, what = rng.choice(EMPTY_RECIPES)
        return Mutant(f"the recipe is {what}", True, raw=raw)
    paths = [*MISSING_MUST, *MISSING_MAY]
    if needs_calibration(base.tree):
        paths.append(("calibration",))
    path = rng.choice(paths)
    try:
        tree = without(base.tree, path)
    except (KeyError, IndexError, TypeError):
        return None
    must = path in MISSING_MUST or path == ("calibration",)
    return Mutant(f"removed {dotted(path)}", must, tree)


# (key pattern, value, must be refused)
EXTREMES: tuple[tuple[str, Any, bool], ...] = (
    ("source.inputs[].shape[]", -1, True),
    ("source.inputs[].shape[]", 0, True),
    ("source.inputs[].shape[]", 10**30, True),
    ("source.inputs[].shape[]", 1e308, True),
    ("source.inputs[].shape[]", 2**63, True),
    ("export.opset", 12, True),
    ("export.opset", 24, True),
    ("export.opset", -18, True),
    ("export.opset", 10**30, True),
    ("verify.latency_runs", 0, True),
    ("verify.latency_runs", -5, True),
    ("verify.latency_runs", 10**12, True),
    ("verify.latency_runs", 10**30, True),
    ("verify.latency_runs", 1e308, True),
    ("verify.latency_runs", 7, False),
    ("verify.warmup_runs", -1, True),
    ("verify.warmup_runs", 10**9, True),
    ("verify.warmup_runs", 0, False),
    ("calibration.samples", 0, True),
    ("calibration.samples", -1, True),
    ("calibration.samples", 10**30, False),
    ("calibration.samples", 50, False),
    ("evaluation.samples", 0, True),
    ("evaluation.samples", 3, False),
    ("verify.max_abs_diff", -1.0, True),
    ("verify.max_abs_diff", math.nan, True),
    ("verify.max_abs_diff", math.inf, False),
    ("verify.max_abs_diff", 1e308, False),
    ("verify.max_accuracy_drop", 2, True),
    ("verify.max_accuracy_drop", -0.5, True),
    ("verify.max_accuracy_drop", 1e308, True),
    ("verify.max_accuracy_drop", math.nan, True),
    ("verify.min_top1_agreement", 1.5, True),
    ("verify.min_top1_agreement", math.nan, True),
    ("verify.max_latency_ms", 0, True),
    ("verify.max_latency_ms", -1.0, True),
    ("verify.max_size_bytes", 0, True),
    ("verify.max_size_bytes", 10**30, False),
    ("verify.detections.max_detections", 0, True),
    ("verify.detections.max_detections", 10**12, True),
    ("verify.detections.box_atol", 0, True),
    ("verify.detections.min_match_rate", 1.5, True),
    ("source.dynamic_batch", {"min": 8, "max": 2}, True),
    ("source.dynamic_batch", {"min": 0, "max": 4}, True),
    ("source.dynamic_batch", {"min": 10**30}, True),
    ("source.dynamic_batch", {"min": 1, "max": 10**30}, False),
)


def mutate_extreme(rng: random.Random, base: Base, folder: Path) -> Mutant | None:
    """Negative, zero, 1e308, 10**30, absurd run counts, min > max, opsets out of range."""
    if base.pytorch and rng.random() < 0.2:
        return opset_exporter(rng, base)
    pattern, value, must = rng.choice(EXTREMES)
    path = concrete(base.tree, pattern, rng)
    if path is None:
        return None
    return set_value(base, path, value, must)


def opset_exporter(rng: random.Random, base: Base) -> Mutant:
    """An opset the exporter does not have (dynamo: 18..23; torchscript: 13..20), or one it has."""
    exporter = rng.choice(["dynamo", "torchscript"])
    low, high = (18, 23) if exporter == "dynamo" else (13, 20)
    valid = rng.random() < 0.3
    opset = rng.randint(low, high) if valid else rng.choice([*range(13, low), *range(high + 1, 24)])
    value = {"opset": opset, "exporter": exporter}
    return Mutant(f"export: {shown(value)}", not valid, with_value(base.tree, ("export",), value))


def mutate_encoding(rng: random.Random, base: Base, folder: Path) -> Mutant | None:
    """The file in another encoding (UTF-16/32, a BOM), or with bytes no encoding allows."""
    text = base.text
    data = text.encode("utf-8")
    at = rng.randrange(len(data))
    at = data.rfind(b"\n", 0, at) + 1  # a line start: never inside a multi-byte character
    variants: list[tuple[str, bytes, bool]] = [
        ("UTF-8 with a BOM", b"\xef\xbb\xbf" + data, False),
        ("UTF-16-LE with a BOM", text.encode("utf-16"), False),
        ("UTF-16-BE with a BOM", b"\xfe\xff" + text.encode("utf-16-be"), False),
        ("UTF-16-LE without a BOM", text.encode("utf-16-le"), False),
        ("UTF-32 with a BOM", text.encode("utf-32"), False),
        ("description in Latin-1 (Caf\\xe9)", latin1_description(text), True),
        ("a Latin-1 comment (r\\xe9sum\\xe9) on line 1", b"# r\xe9sum\xe9\n" + data, True),
        (f"invalid UTF-8 byte 0x80 at byte {at}", data[:at] + b"\x80" + data[at:], True),
        (f"invalid UTF-8 bytes 0xc3 0x28 at byte {at}", data[:at] + b"\xc3(" + data[at:], True),
        (f"a NUL byte at byte {at}", data[:at] + b"\x00" + data[at:], True),
        (f"NUL bytes in a comment at byte {at}", data[:at] + b"# a\x00b\n" + data[at:], True),
        (f"an ESC control character at byte {at}", data[:at] + b"# \x1b[31m\n" + data[at:], True),
        ("a lone surrogate escape in name", text_with(base, "name", '"\\ud800"'), False),
    ]
    what, raw, must = rng.choice(variants)
    return Mutant(what, must, raw=raw)


def latin1_description(text: str) -> bytes:
    """The recipe with its description line (or a new one) written in Latin-1."""
    line = "description: Caf\xe9 (Latin-1)"
    if re.search(r"^description:.*$", text, re.M):
        text = re.sub(r"^description:.*$", line, text, count=1, flags=re.M)
    else:
        text = f"{line}\n{text}"
    return text.encode("latin-1", errors="replace")


def text_with(base: Base, key: str, value: str) -> bytes:
    """The base's YAML with one top-level key set to verbatim YAML text."""
    tree = {key: Raw(value), **{k: v for k, v in base.tree.items() if k != key}}
    return to_yaml(tree).encode("utf-8")


def mutate_deep(rng: random.Random, base: Base, folder: Path) -> Mutant | None:
    """A flow list or map nested 10,000 deep (or a block mapping 1,000 deep)."""
    depth = 10_000
    variants: list[tuple[Path_, str, str, bool]] = [
        (("source", "inputs", 0, "shape"), "[" * depth + "1" + "]" * depth, "list", True),
        (("verify",), "{a: " * depth + "1" + "}" * depth, "map", True),
        (("description",), "[" * depth + "]" * depth, "list", True),
        (("source", "init"), "{a: " * depth + "1" + "}" * depth, "map", False),
    ]
    if not base.pytorch:
        variants.pop()
    path, text, what, must = rng.choice(variants)
    if rng.random() < 0.2:
        return deep_block(base)
    tree = with_value(base.tree, path, Raw(text))
    return Mutant(f"{dotted(path)}: a flow {what} nested {depth:,} deep", must, tree)


def deep_block(base: Base) -> Mutant:
    """verify: a block mapping nested 1,000 deep (indentation grows with depth)."""
    depth = 1000
    lines = [f"{'  ' * (i + 1)}a{i}:" for i in range(depth)] + [f"{'  ' * (depth + 1)}x: 1"]
    tree = {k: v for k, v in base.tree.items() if k != "verify"}
    raw = (to_yaml(tree) + "verify:\n" + "\n".join(lines) + "\n").encode()
    return Mutant(f"verify: a block mapping nested {depth:,} deep", True, raw=raw)


def laughs(levels: int = 9, width: int = 10) -> str:
    """The "billion laughs" alias bomb: `levels` anchors of `width` references each."""
    items = ["&l0 [" + ", ".join(['"lol"'] * width) + "]"]
    for level in range(1, levels):
        items.append(f"&l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]")
    return "[" + ", ".join(items) + "]"


def mutate_alias(rng: random.Random, base: Base, folder: Path) -> Mutant | None:
    """Recursive aliases, a billion-laughs bomb (10^9 nodes), or a harmless alias."""
    variants: list[tuple[Path_, str, str, bool]] = [
        (("description",), "&x [*x]", "a recursive alias &x [*x]", True),
        (("verify",), "&v {latency_runs: 5, self: *v}", "a recursive mapping alias", True),
        (("description",), laughs(), "a billion-laughs bomb (9 levels x 10 refs)", True),
        (("x_bomb",), laughs(), "a billion-laughs bomb under an unknown key", True),
        (("name",), '&n "aliased"', "an anchor on name, used by description", False),
        (("evaluation", "options"), "{small: " + laughs(3, 3) + "}", "27-node alias tree", False),
    ]
    if base.pytorch:
        variants.append((("source", "init", "bomb"), laughs(), "a bomb in source.init", True))
    path, text, what, must = rng.choice(variants)
    tree = with_value(base.tree, path, Raw(text))
    if path == ("name",):
        tree["description"] = Raw("*n")
    return Mutant(f"{dotted(path)}: {what}", must, tree)


def mutate_junk(rng: random.Random, base: Base, folder: Path) -> Mutant | None:
    """Random bytes appended or inserted, a byte overwritten, truncation, a line repeated."""
    data = base.text.encode("utf-8")
    at = rng.randrange(len(data))
    junk = rng.randbytes(rng.randint(1, 64))
    lines = base.text.splitlines(keepends=True)
    line = rng.randrange(len(lines))
    variants = [
        (f"{len(junk)} random bytes appended", data + junk),
        (f"{len(junk)} random bytes inserted at byte {at}", data[:at] + junk + data[at:]),
        (f"byte {at} replaced by 0x{junk[0]:02x}", data[:at] + junk[:1] + data[at + 1 :]),
        (f"truncated at byte {at} of {len(data)}", data[:at]),
        (f"line {line + 1} repeated", "".join(lines[: line + 1] + lines[line:]).encode()),
        (f"line {line + 1} removed", "".join(lines[:line] + lines[line + 1 :]).encode()),
    ]
    what, raw = rng.choice(variants)
    return Mutant(what, False, raw=raw)


def mutate_files(rng: random.Random, base: Base, folder: Path) -> Mutant | None:
    """A file the recipe names that is missing, unreadable, a folder, or of the wrong kind."""
    makers = [files_dataset, files_recipe, files_weights if base.pytorch else files_onnx]
    return rng.choice(makers)(rng, base, folder)


def _file_variants(folder: Path, name: str) -> list[FileVariant]:
    """(what, recipe value, the file at fault, must refuse) for a file slot named `name`."""
    stem, suffix = os.path.splitext(name)
    missing, directory, loop = folder / name, folder / f"dir{suffix}", folder / f"loop{suffix}"
    long_path = folder.joinpath(*["d" * 250] * 20, name)
    variants = [
        ("a missing file", str(missing), missing, True),
        ("a folder", str(directory), directory, True),
        ("a symlink loop", str(loop), loop, True),
        ("a path over PATH_MAX (5,000 chars)", str(long_path), long_path, True),
        ("a path with a NUL character", f"{folder}/{stem}\0{suffix}", folder / name, True),
        ("an empty string", "", folder, True),
        ("/dev/null (not a regular file)", "/dev/null", Path("/dev/null"), True),
    ]
    if os.geteuid() != 0:  # as root chmod 000 does not stop reading
        variants.append(("an unreadable file (chmod 000)", str(folder / f"ro{suffix}"), None, True))
    return variants


def _wrong_kind(folder: Path, name: str, text: str, what: str, must: bool) -> FileVariant:
    """A file variant of the wrong kind (a .txt, a .csv), written into `folder`."""
    path = folder / name
    path.write_text(text)
    return what, str(path), path, must


def _make_file(what: str, value: Any, folder: Path) -> None:
    """Create what a file variant needs on disk (the folder, the loop, the unreadable file)."""
    if what not in ("a folder", "a symlink loop") and not what.startswith("an unreadable"):
        return
    path = Path(value)
    if what == "a folder":
        path.mkdir(exist_ok=True)
    elif what == "a symlink loop":
        path.symlink_to(path.name)
    elif what.startswith("an unreadable"):
        path.write_bytes(b"data")
        path.chmod(0)


def _file_mutant(base: Base, key: Path_, variant: FileVariant, folder: Path) -> Mutant:
    """The base with a file slot set to a variant (made on disk first)."""
    what, value, fault, must = variant
    _make_file(what, value, folder)
    tree = with_value(base.tree, key, value)
    return Mutant(f"{dotted(key)}: {what} ({shown(value)})", must, tree, fault=fault)


def files_weights(rng: random.Random, base: Base, folder: Path) -> Mutant:
    """source.weights: missing, a folder, a loop, too long, not a regular file, a .txt."""
    variants = _file_variants(folder, "weights.pt")
    variants.append(_wrong_kind(folder, "weights.txt", "not weights\n", "a .txt file", False))
    return _file_mutant(base, ("source", "weights"), rng.choice(variants), folder)


def files_onnx(rng: random.Random, base: Base, folder: Path) -> Mutant:
    """source.model of an ONNX source: missing, a folder, a .txt where .onnx goes, ..."""
    variants = _file_variants(folder, "model.onnx")
    what = "a .txt where .onnx goes"
    variants.append(_wrong_kind(folder, "model.txt", "not a model\n", what, True))
    return _file_mutant(base, ("source", "model"), rng.choice(variants), folder)


def files_dataset(rng: random.Random, base: Base, folder: Path) -> Mutant | None:
    """calibration/evaluation.dataset: a missing .npz/.npy, a folder, a .csv, ..."""
    sections = [s for s in ("calibration", "evaluation") if isinstance(base.tree.get(s), dict)]
    name = rng.choice(["data.npz", "data.npy"])
    variants = _file_variants(folder, name)
    variants.append(_wrong_kind(folder, "data.csv", "1,2,3\n", "a .csv file", True))
    return _file_mutant(base, (rng.choice(sections), "dataset"), rng.choice(variants), folder)


def files_recipe(rng: random.Random, base: Base, folder: Path) -> Mutant:
    """The recipe path itself: missing, a folder, a symlink loop (unreadable when not root)."""
    variants = [("absent", "missing"), ("dir", "a folder"), ("loop", "a symlink to itself")]
    if os.geteuid() != 0:
        variants.append(("unreadable", "unreadable (chmod 000)"))
    recipe, what = rng.choice(variants)
    return Mutant(f"the recipe file is {what}", True, base.tree, recipe=recipe)


def mutate_refs(rng: random.Random, base: Base, folder: Path) -> Mutant | None:
    """Code and name references to what does not exist: modules, attributes, rules, targets."""
    variants = ref_variants(base, folder)
    key, value, must, fault = rng.choice(variants)
    if key == ("rewrites",):
        value = [*base.tree.get("rewrites", []), value]
    return set_value(base, key, value, must, fault)


def ref_variants(base: Base, folder: Path) -> list[tuple[Path_, Any, bool, Path | None]]:
    """(key, value, must refuse, file at fault) for the reference mutations of a base."""
    files = make_ref_files(folder)
    section = "evaluation"
    variants: list[tuple[Path_, Any, bool, Path | None]] = [
        ((section, "dataset"), "edgeflow.datasets:no_such_dataset", True, None),
        ((section, "dataset"), "edgeflow.no_such_module:load", True, None),
        ((section, "dataset"), "edgeflow.datasets", True, None),
        (("target",), "onnxruntime_mcu", True, None),
        (("target",), "../targets/onnxruntime_micro", True, None),
        (("rewrites",), "ast.no_such_rule", True, None),
        (("rewrites",), f"{files['missing']}:MyRule", True, files["missing"]),
        (("optimize",), {"passes": ["eliminate_nothing"]}, True, None),
        (("precheck",), {"board": "arduino_uno_r9"}, True, None),
    ]
    if base.pytorch:
        model = ("source", "model")
        variants += [
            (model, "edgeflow.zoo.no_such_module:DigitsCNN", True, None),
            (model, "edgeflow.zoo.digits:NoSuchNet", True, None),
            (model, "edgeflow.zoo.digits", True, None),
            (model, "edgeflow.zoo.digits:DigitsCNN.extra", True, None),
            (model, "no_such_package_xyz:Net", True, None),
            (model, f"{files['missing']}:Net", True, files["missing"]),
            (model, f"{files['folder']}:Net", True, files["folder"]),
            (model, f"{files['empty']}:Net", True, files["empty"]),
            (model, f"{files['binary']}:Net", False, files["binary"]),
            (model, f"{files['latin1']}:Net", False, files["latin1"]),
            (model, f"{files['valid']}:Net", False, files["valid"]),
        ]
    return variants


def make_ref_files(folder: Path) -> dict[str, Path]:
    """Python files for `file.py:Name` references: missing, a folder, empty, binary, ..."""
    files = {k: folder / f"{k}_net.py" for k in ("missing", "folder", "empty", "binary")}
    files |= {k: folder / f"{k}_net.py" for k in ("latin1", "valid")}
    files["folder"].mkdir(parents=True, exist_ok=True)
    files["empty"].write_text("")
    files["binary"].write_bytes(bytes(range(256)) * 4)
    files["latin1"].write_bytes(b"# caf\xe9\nclass Net:\n    pass\n")
    files["valid"].write_text("import torch\n\n\nclass Net(torch.nn.Module):\n    pass\n")
    return files


CLASSES: dict[str, Mutator] = {
    "wrong type": mutate_wrong_type,
    "bool for number": mutate_bool_number,
    "unknown key": mutate_unknown_key,
    "missing key": mutate_missing,
    "extreme number": mutate_extreme,
    "encoding": mutate_encoding,
    "deep nesting": mutate_deep,
    "alias": mutate_alias,
    "junk bytes": mutate_junk,
    "files": mutate_files,
    "refs": mutate_refs,
}
