"""Every hint works as printed (issue 33): a suggestion edgeflow prints, run exactly as printed,
passes recipe validation.

1. Printed over the test corpus: the precheck (`edgeflow precheck`'s text for an ONNX file, a
   build's precheck table for a pytorch source) on the foreign files (benchmarks/_foreign)
   and the zoo's models, for every target, quantization none and int8; `edgeflow explain` on
   its tests' models. Each suggested rule entry goes into a recipe for that model as printed:
   in the file's `rewrites:`, as `rewrites=[...]` and as `+rewrites=[...]` on `edgeflow run`'s
   command line; each recipe setting (`quantization.mode: int8`, a board's
   `precheck.board: NAME`) as that key in the file and as `key=value`.
2. Written in edgeflow's code: every `key=value` override, rule entry and recipe setting in
   its messages, help and error hints (`set quantization.method: minmax`), validated as
   printed against the demo recipe; the few that cannot be run as they stand (a usage's
   `NAME`) are listed in SKIPPED with the reason.

An error about a rule's options is located at that rule's entry (`rewrites[1].opset`), in the
file or on the command line.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from ruamel.yaml import YAML

from edgeflow.cli import main
from edgeflow.core import resources
from edgeflow.core.errors import RecipeError
from edgeflow.recipe import LoadedRecipe, load_recipe
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from _foreign.build import write_inputs
from _foreign.files import FILES, Foreign, Input

TARGETS = list(resources.available("targets"))
MODES = ("none", "int8")
# A recipe key as the precheck prints it in a reason or the Suggested rule column:
# `quantization.mode: int8`, `(precheck.board: cortex_m7_512k)`.
SETTING = re.compile(r"(?<![\w.])((?:quantization|precheck|convert|verify)\.[a-z_]+): ([\w.-]+)")


@dataclass(frozen=True)
class Model:
    """A model of the corpus: its ONNX graph, its inputs as a recipe declares them, and the
    module a pytorch recipe names (None: an ONNX file only)."""

    name: str
    onnx: onnx.ModelProto
    inputs: tuple[Input, ...]
    module: str | None = None


def _exported(module: str, shape: tuple[int, ...], name: str) -> Model:
    """A zoo model exported to ONNX (TorchScript at opset 17: faster than its recipe's dynamo
    export; the precheck judges either graph)."""
    import importlib

    import torch

    path, _, cls = module.partition(":")
    net = getattr(importlib.import_module(path), cls)().eval()
    buffer = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(net, (torch.zeros(shape),), buffer, dynamo=False, opset_version=17,
                          input_names=[name])  # fmt: skip
    graph = onnx.load_from_string(buffer.getvalue())
    return Model(f"{cls}_{'x'.join(map(str, shape))}", graph, (Input(name, shape),), module)


@functools.cache
def corpus() -> dict[str, Model]:
    """The foreign files (benchmarks/_foreign, as tests/test_foreign_files.py builds them) and
    the zoo's models: the demo's, the development models, the keyword spotter."""
    from edgeflow.zoo.devmodels import paddle_style_onnx

    models = {}
    for name, build in FILES.items():
        foreign = build()
        models[name] = Model(name, foreign.model, foreign.inputs)
    zoo = [
        ("edgeflow.zoo.digits:DigitsCNN", (1, 1, 8, 8), "image"),
        ("edgeflow.zoo.digits:DigitsMobileNet", (1, 1, 32, 32), "image"),
        ("edgeflow.zoo.devmodels:DigitsPReLU", (1, 1, 8, 8), "image"),
        ("edgeflow.zoo.keywords:KeywordDSCNN", (1, 1, 49, 10), "mfcc"),
        # on 98 frames of 40 log mel bands (1 s at a 10 ms hop): its float arena outgrows
        # tflite_micro's default board, and the precheck names the boards it fits
        ("edgeflow.zoo.keywords:KeywordDSCNN", (1, 1, 98, 40), "log_mel"),
        ("edgeflow.zoo.devmodels:SpeechLSTMEncoder", (1, 49, 40), "log_mel"),
    ]
    for module, shape, name in zoo:
        model = _exported(module, shape, name)
        models[model.name] = model
    paddle = paddle_style_onnx()
    models["paddle_style"] = Model("paddle_style", paddle, (Input("image", (1, 1, 8, 8)),))
    return models


def write_model(model: Model, folder: Path) -> tuple[Path, Path]:
    """The model's ONNX file and its samples (.npz), as the foreign-files benchmark writes
    them; once per folder."""
    path = folder / f"{model.name}.onnx"
    if path.exists():
        return path, path.with_suffix(".npz")
    return write_inputs(Foreign(model.name, "", model.onnx, model.inputs), folder)


def recipe_text(model: Model, source: str, target: str, mode: str, folder: Path) -> str:
    """A recipe for the model as a user writes one: the file (or the module, for a pytorch
    source), its inputs, the samples for calibration and agreement, the target and mode."""
    path, data = write_model(model, folder)
    lines = []
    for spec in model.inputs:
        fields = [f"name: {json.dumps(spec.name)}", f"shape: {list(spec.shape)}",
                  f"dtype: {spec.dtype}"]  # fmt: skip
        if spec.value is not None:
            fields.append(f"value: {spec.value}")
        elif spec.batch_axis not in (0, None):
            fields.append(f"batch_axis: {spec.batch_axis}")
        lines.append("    - {" + ", ".join(fields) + "}")
    inputs = "\n".join(lines)
    where = f"model: {model.module}" if source == "pytorch" else f"model: {json.dumps(str(path))}"
    return f"""\
name: {model.name}
source:
  kind: {source}
  {where}
  inputs:
{inputs}
calibration: {{dataset: {json.dumps(str(data))}}}
evaluation: {{dataset: {json.dumps(str(data))}, metric: agreement}}
quantization: {{mode: {mode}}}
target: {target}
"""


# ------------------------------------------------------------------ what the precheck prints


@dataclass(frozen=True)
class Printed:
    """One suggestion as printed, and where: a rule entry (`rule`), a recipe key (`setting`)
    or a board (`board`: `precheck.board: NAME`), with the recipe it was printed for."""

    kind: str
    text: str
    source: str  # the recipe's source kind: onnx (an ONNX file) or pytorch
    where: str  # the model, target and mode, for a failure's message
    recipe: str = field(repr=False, compare=False)  # the recipe's text, without it


def precheck_text(model: Model, source: str, target: str, mode: str, folder: Path) -> str:
    """What the precheck prints: `edgeflow precheck MODEL.onnx` for an ONNX file; for a
    pytorch source, the table a build's precheck stage prints (stages/precheck.py)."""
    if source == "onnx":
        path, _ = write_model(model, folder)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["precheck", str(path), "--target", target, "--quantization", mode])
        return out.getvalue()
    from edgeflow.targets import load_profile
    from edgeflow.targets.precheck import check, check_memory, render_table, to_json

    profile = load_profile(target)
    _, too_big = check_memory(model.onnx, profile, mode)
    return render_table(to_json(check(model.onnx, profile, mode, source) + too_big))


def read_suggestions(text: str) -> list[tuple[str, str]]:
    """(kind, as printed): each backticked entry of the Suggested rule column, and each recipe
    key the text names with a value (in a reason or in that column)."""
    found: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.startswith("| ") or "Suggested rule" in line or "---" in line:
            continue
        for shown in re.findall(r"`([^`]+)`", line.rsplit(" | ", 1)[-1]):
            if not SETTING.fullmatch(shown.strip("()")):
                found.append(("rule", shown))
    for key, value in SETTING.findall(text):
        found.append(("board" if key == "precheck.board" else "setting", f"{key}: {value}"))
    return list(dict.fromkeys(found))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hints")


@pytest.fixture(scope="module")
def printed(folder: Path) -> list[Printed]:
    """Every suggestion the precheck prints over the corpus."""
    import edgeflow.targets

    found = []
    with pytest.MonkeyPatch.context() as patch:  # each profile parsed once, not per command
        patch.setattr(
            edgeflow.targets, "load_profile", functools.cache(edgeflow.targets.load_profile)
        )
        for model in corpus().values():
            for source in ("onnx", "pytorch") if model.module else ("onnx",):
                for target in TARGETS:
                    offered = edgeflow.targets.load_profile(target).quantization
                    for mode in (m for m in MODES if m in offered):  # int8 alone on ethos_u
                        text = precheck_text(model, source, target, mode, folder)
                        recipe = recipe_text(model, source, target, mode, folder)
                        where = f"{model.name}, {source} source, {target}, {mode}"
                        for kind, shown in read_suggestions(text):
                            found.append(Printed(kind, shown, source, where, recipe))
    return found


def test_the_corpus_prints_suggestions_of_every_kind(printed: list[Printed]) -> None:
    kinds = Counter(p.kind for p in printed)
    with_options = [p for p in printed if p.kind == "rule" and p.text.startswith("{")]
    print(f"\n{len(printed)} suggestions printed: {dict(kinds)}, {len(with_options)} with options")
    print(Counter(p.text for p in printed).most_common())
    assert kinds["rule"] >= 100 and kinds["setting"] >= 1 and kinds["board"] >= 1
    assert len(with_options) >= 50


REMOVE = " and remove "  # a hint's `set A: v and remove B`


class Loaded(BaseException):
    """Raised by the stubbed build with the recipe `edgeflow run` validated and loaded."""


@contextlib.contextmanager
def no_build() -> Iterator[None]:
    """`edgeflow run` up to its build: the overrides are routed, parsed by Hydra and handed
    to the recipe loader as in any run; the build raises Loaded with what it was given."""
    import edgeflow.engine.runner

    def stub(loaded: LoadedRecipe, *args: Any, **kwargs: Any) -> Any:
        raise Loaded(loaded)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(edgeflow.engine.runner, "run_build", stub)
        yield


def run(args: list[str]) -> LoadedRecipe | str:
    """`edgeflow run ARGS` (its build stubbed): the loaded recipe, or what it printed to
    stderr when it refused them."""
    err = io.StringIO()
    with no_build(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(["run", *args])
        except Loaded as done:
            return done.args[0]  # type: ignore[no-any-return]
    return f"exit {code}: {err.getvalue().strip()}"


def in_file(recipe: str, kind: str, shown: str) -> str:
    """The recipe with the suggestion written into it as printed."""
    if kind == "rule":
        return f"{recipe}rewrites:\n  - {shown}\n"
    yaml = YAML(typ="rt")
    tree = yaml.load(recipe)
    setting, _, removed = shown.partition(REMOVE)
    key, _, value = setting.partition(": ")
    *parents, last = key.split(".")
    node = tree
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = yaml.load(f"v: {value}")["v"]
    if removed:
        *parents, last = removed.split(".")
        node = tree
        for part in parents:
            node = node.get(part) or {}
        node.pop(last, None)
    out = io.StringIO()
    yaml.dump(tree, out)
    return out.getvalue()


def on_command_line(kind: str, shown: str) -> list[list[str]]:
    """The overrides that apply the suggestion as printed: a rule as `rewrites=[...]` and
    `+rewrites=[...]`, a recipe key as `key=value`."""
    if kind == "rule":
        return [[f"rewrites=[{shown}]"], [f"+rewrites=[{shown}]"]]
    setting, _, removed = shown.partition(REMOVE)
    key, _, value = setting.partition(": ")
    return [[f"{key}={value}", *([f"{removed}=null"] if removed else [])]]


def applied(loaded: LoadedRecipe, kind: str, shown: str) -> bool:
    """Does the loaded recipe hold the suggestion as printed (its last rule, that key)?"""
    shown, _, removed = shown.partition(REMOVE)
    value = YAML(typ="safe").load(shown)
    parent, _, last = removed.rpartition(".")
    if removed and last in _at(loaded, parent).model_fields_set and _at(loaded, removed):
        return False  # neither left out (its default) nor null
    if kind == "rule":
        name, options = (value, {}) if isinstance(value, str) else (value.pop("rule"), value)
        if name == "auto":  # not a rule: rewrites: auto, after the recipe's own
            return loaded.recipe.rewrites_auto
        spec = loaded.recipe.rewrites[-1]
        given = spec.options.model_dump(by_alias=True)
        return spec.name == name and given | options == given
    ((key, expected),) = value.items()
    return bool(_at(loaded, key) == expected)


def _at(loaded: LoadedRecipe, key: str) -> Any:
    found: Any = loaded.recipe
    for part in key.split("."):
        found = getattr(found, part)
    return found


def fails_in_file(p: Printed, path: Path) -> str | None:
    """The suggestion written into the recipe file as printed: None when it loads and holds
    it, else what went wrong."""
    path.write_text(in_file(p.recipe, p.kind, p.text), encoding="utf-8")
    try:
        loaded = load_recipe(path)
    except RecipeError as exc:
        path.write_text(p.recipe, encoding="utf-8")
        try:
            load_recipe(path)
        except RecipeError:
            return f"{p.text!r} ({p.where}): the recipe fails without it too:\n{exc.render()}"
        return f"{p.text!r} ({p.where}) in the file:\n{exc.render()}"
    if not applied(loaded, p.kind, p.text):
        return f"{p.text!r} ({p.where}) in the file: it loads, but not as printed"
    return None


def fails_on_command_line(p: Printed, path: Path) -> list[str]:
    """The suggestion as `edgeflow run` overrides, as printed: what went wrong, if anything."""
    path.write_text(p.recipe, encoding="utf-8")
    failures = []
    for args in on_command_line(p.kind, p.text):
        found = run([f"recipe={path}", *args])
        if isinstance(found, str):
            failures.append(f"{p.text!r} ({p.where}) as {' '.join(args)}:\n{found}")
        elif not applied(found, p.kind, p.text):
            failures.append(f"{p.text!r} ({p.where}) as {' '.join(args)}: not as printed")
    return failures


def test_every_precheck_suggestion_loads_in_the_recipe_file(
    printed: list[Printed], folder: Path
) -> None:
    failures = [fails_in_file(p, folder / f"file-{i}.yaml") for i, p in enumerate(printed)]
    found = [f for f in failures if f]
    print(f"\n{len(printed)} suggestions in a recipe file, {len(found)} failed")
    assert found == [], "\n\n".join(found[:20])


def test_every_precheck_suggestion_loads_on_the_command_line(
    printed: list[Printed], folder: Path
) -> None:
    """Each text once per source kind: how Hydra reads an override and the loader takes it
    do not depend on the model, target or mode (the file test covers every combination)."""
    distinct = list({(p.kind, p.text, p.source): p for p in printed}.values())
    failures = [
        f
        for i, p in enumerate(distinct)
        for f in fails_on_command_line(p, folder / f"cli-{i}.yaml")
    ]
    print(f"\n{len(distinct)} distinct suggestions as overrides, {len(failures)} failed")
    assert len(distinct) >= 20
    assert failures == [], "\n\n".join(failures[:20])


# ------------------------------------------------------------------ what explain prints

EXPLAINED = ("Gate", "Count", "ShapeChecked", "Positive")  # tests/test_explain.py's failing ones


def explain_rules(text: str) -> list[str]:
    """The rules column of `edgeflow explain`'s table, entry by entry (an entry with options
    holds commas: split outside braces)."""
    lines = text.splitlines()
    start = lines[1].rfind(" ") + 1  # the dashes under the last column
    found = []
    for line in lines[2:]:
        if not line.strip():
            break
        cell = line[start:].strip()
        found += [e.strip() for e in re.split(r",\s*(?![^{]*\})", cell) if e.strip()]
    return found


@pytest.fixture(scope="module")
def explained(folder: Path) -> list[Printed]:
    """Every rule `edgeflow explain` prints for its tests' models (as JSON and in its table)."""
    from edgeflow.explain import Attempt, render_table
    from tests.test_explain import MODEL

    (folder / "model.py").write_text(MODEL, encoding="utf-8")
    np.savez(folder / "eval.npz", x=np.ones((4, 4), np.float32), label=np.zeros(4))
    found = []
    for cls in EXPLAINED:
        recipe = f"""\
source:
  kind: pytorch
  model: model.py:{cls}
  inputs: [{{name: x, shape: [1, 4]}}]
evaluation: {{dataset: eval.npz}}
target: onnxruntime_micro
"""
        path = folder / f"explain-{cls}.yaml"
        path.write_text(recipe, encoding="utf-8")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["explain", str(path), "--json"]) == 1
        attempts = [Attempt(**a) for a in json.loads(out.getvalue())]
        listed = [r for a in attempts for r in a.rules]
        assert explain_rules(render_table(attempts)) == listed  # the table prints the same
        for shown in dict.fromkeys(listed):
            found.append(Printed("rule", shown, "pytorch", f"explain {cls}", recipe))
    return found


def test_every_rule_explain_prints_loads_as_printed(explained: list[Printed], folder: Path) -> None:
    print(f"\n{len(explained)} rules explain printed: {sorted({p.text for p in explained})}")
    assert len(explained) >= 4 and not [p for p in explained if "<" in p.text]
    failures = [
        fails_in_file(p, folder / f"explain-file-{i}.yaml") for i, p in enumerate(explained)
    ]
    for i, p in enumerate(explained):
        failures += fails_on_command_line(p, folder / f"explain-cli-{i}.yaml")
    assert [f for f in failures if f] == []


def test_every_entry_the_precheck_and_explain_can_print_loads(folder: Path) -> None:
    """Beyond the corpus: for everything a rule declares it fixes, the entry the precheck
    would suggest for a pytorch source (every level) and explain's entries, in the demo
    recipe as printed; the templates apart (see the test below)."""
    from edgeflow.explain import rules_for
    from edgeflow.rules import builtin_rules
    from edgeflow.rules.entries import entry
    from edgeflow.rules.fixes import FINDINGS, Fix
    from edgeflow.targets.findings import suggestion

    fixes = {fix for rule in builtin_rules().values() for fix in rule.fixes}
    fixes |= {Fix.finding(name) for name in FINDINGS}
    computed = {Fix.finding("opset"): {"opset": 13}}  # what the precheck works out itself
    entries = {entry(*suggestion(fix, given=computed.get(fix))) for fix in fixes}
    entries |= {e for fix in fixes for e in rules_for(fix) if "<" not in e}
    entries.discard("")
    print(f"\n{len(entries)} entries: {sorted(entries)}")
    assert any(e.startswith("{rule: fx.replace_activation") for e in entries)
    _, recipe = demo_recipe(folder, tensorflow=False)
    failures = []
    for i, shown in enumerate(sorted(entries)):
        p = Printed("rule", shown, "pytorch", "a declared fix", recipe)
        failures += [f for f in [fails_in_file(p, folder / f"declared-{i}.yaml")] if f]
        if shown.startswith("{"):  # with options: how the command line reads them too
            failures += fails_on_command_line(p, folder / f"declared-cli-{i}.yaml")
    assert failures == [], "\n\n".join(failures)


# ------------------------------------------------------------------ an option's error, located

OPTION_ERRORS = [
    ("{rule: onnx.convert_opset, opset: banana}", "rewrites[1].opset", "must be a valid integer"),
    ("{rule: onnx.convert_opset, opset: 99}", "rewrites[1].opset", "opset must be between 7 and"),
    ("{rule: onnx.convert_opset, opset: 11, opsett: 11}", "rewrites[1].opsett",
     "unknown key 'opsett'"),
    ("{rule: onnx.convert_opset}", "rewrites[1].opset", "missing required key"),
    ("onnx.convert_opset", "rewrites[1]", "rule 'onnx.convert_opset' needs opset"),
    ("{rule: onnx.equalize_channels, threshold: 2.5}", "rewrites[1].threshold",
     "must be less than 1"),
    ("{rule: onnx.decompose, ops: [Gelu, Banana]}", "rewrites[1].ops[1]", "must be one of"),
    ("{rule: fx.replace_activation, from: relu, to: relu7}", "rewrites[1].to",
     "cannot replace relu with 'relu7'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("entry", "key", "message"), OPTION_ERRORS, ids=[e[0] for e in OPTION_ERRORS]
)
def test_an_options_error_is_located_at_its_entry(
    entry: str, key: str, message: str, write_recipe: Any
) -> None:
    """In the file (file:line:col of the entry's option), as `rewrites=[...]` and as
    `+rewrites=[...]` (the command line, naming the override): never the top level."""
    from tests.recipe.test_errors import GOOD

    path = write_recipe(f"{GOOD}rewrites:\n  - fx.fuse_conv_bn\n  - {entry}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    [problem] = info.value.problems
    assert (problem.key, problem.file) == (key, str(path))
    assert problem.line == 15 and problem.col >= 5 and message in problem.message
    assert problem.render().startswith(f"{path}:15:{problem.col}: {key}: ")
    base = write_recipe(f"{GOOD}rewrites:\n  - fx.fuse_conv_bn\n", "base.yaml")
    for args in ([f"rewrites=[fx.fuse_conv_bn, {entry}]"], [f"+rewrites=[{entry}]"]):
        printed = run([f"recipe={base}", *args])
        assert isinstance(printed, str) and printed.startswith("exit 2: error: <command line> (")
        assert f"): {key}: " in printed and message in printed, printed


# ------------------------------------------------------------------ what edgeflow's code says

HOLE = "\x00"  # an f-string's {expression}: a value computed when the text is printed
OVERRIDE = re.compile(r"(?<![\w.+/-])(\+{0,2}[a-z_]+(?:\.[a-z_0-9]+)*)=")
WHOLE_SETTING = re.compile(r"\(?([a-z_]+(?:\.[a-z_]+)+): ([\w.-]+)\)?")  # a whole string
ENTRY = re.compile(r"\{rule: [^{}]*\}|'- ([a-z]+\.[a-z_0-9]+)'")
# Hints not run as printed, and why. The test fails when one is no longer printed or a new
# one is not listed here: each must say why it cannot be run as it stands.
SKIPPED = {
    "recipe=NAME|PATH": "usage: NAME or PATH stands for the user's recipe",
    "target=NAME": "usage: NAME stands for a target profile",
    "quantization=PRESET": "usage: PRESET stands for a preset",
    "recipe=RECIPE": "usage: RECIPE stands for the user's recipe",
    "+rewrites=[...]": "help: `...` stands for the rules to append",
    "target=a,b": "help: a sweep's shape; a and b stand for target names",
    "cache_dir=PATH": "a hint: PATH is a folder of the user's choice",
    "build_dir=PATH": "a hint: PATH is a folder of the user's choice",
    "recipe=\x00": "code, not a hint: the argument `edgeflow diff RECIPE` is rewritten to",
    "{rule: onnx.convert_opset, opset: \x00}": "the opset ORT's QDQ needs, computed (13)",
    "name=...": "Python in a hint: keras.Input(shape, name=...), a keyword argument",
    "source.weights_key: \x00": "the key of the state_dict found in the user's checkpoint",
    "recipe=recipes/NAME.yaml": "usage: NAME stands for the name init gives the recipe",
    "target=\x00": "edgeflow fix: the command for one of the targets the user named; and the NPU "
    "backends (`accelerator:` on another target), each loaded by tests/targets/test_registry.py",
    "quantization.mode=\x00": "the modes the target offers; tests/recipe/test_errors.py runs one",
    "target.accelerator=ethos-u85-256": "an ethos_u build's (the demo recipe's target has no "
    "NPU); tests/targets/test_ethos_u.py builds target=ethos_u target.accelerator=ethos-u85-256",
    "+rewrites=[\x00]": "edgeflow fix: the entries auto chose for one target, as metrics.json "
    "records them (tests/test_autopilot.py runs the command)",
}
# The demo recipe a hint is run against: the tensorflow one for the keys of its path.
TENSORFLOW_KEYS = ("convert.",)


def _texts(path: Path) -> Iterator[str]:
    """The strings of a module that it prints (not its docstrings), an f-string's
    expressions as HOLE."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            docstrings |= {id(v) for v in node.values}
            yield "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield from [node.value] if id(node) not in docstrings else []


def _value(text: str, start: int) -> str:
    """An override's value from `start`: brackets balanced, up to a space, quote, backtick
    or a closing bracket of the text around it."""
    depth, end = 0, start
    while end < len(text):
        char = text[end]
        if char in "[{":
            depth += 1
        elif char in "]}":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and (char.isspace() or char in "`'\");"):
            break
        end += 1
    value = text[start:end]
    return value[:-1] if value.endswith((".", ",")) and value.strip(".") else value  # a stop


# Where an error's hint is: the argument of these callables (edgeflow.core.errors' types,
# specs.user_error, read_yaml's and resolve_rewrites' helpers), `hint=`, a variable `hint`,
# and the third item of a recipe check's (key, message, hint).
HINT_ARGUMENT = {"EdgeflowError": 1, "ToolCrashed": 1, "WeightsError": 1, "user_error": 1,
                 "RuleEntryError": 1, "problem": 1, "AtRecipeKey": 2, "StageFailed": 2,
                 "fail": 3, "Problem": 5}  # fmt: skip


def _hints(path: Path) -> Iterator[str]:
    """The text of each error hint a module writes (an f-string's expressions as HOLE)."""
    import ast

    def text(node: ast.AST) -> str:
        parts = []
        for n in ast.walk(node):
            if isinstance(n, ast.JoinedStr):
                parts.append("".join(v.value if isinstance(v, ast.Constant) else HOLE
                                     for v in n.values))  # fmt: skip
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                parts.append(n.value)
        return " ".join(parts)

    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            at = HINT_ARGUMENT.get(name)
            if at is not None and len(node.args) > at:
                yield text(node.args[at])
            yield from (text(k.value) for k in node.keywords if k.arg == "hint")
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "hint" for t in node.targets
        ):
            yield text(node.value)
        elif isinstance(node, ast.Tuple) and path.match("recipe/checks.py") and len(node.elts) == 3:
            yield text(node.elts[2])


def written_hints() -> list[tuple[str, str, str]]:
    """(kind, text, module) for every override, recipe setting and rule entry edgeflow's code
    prints: `key=value` (a key `edgeflow run` takes) anywhere but in docstrings; a string
    that is one setting (`(convert.via: onnx)`, the precheck's); a setting in an error's
    hint (`set quantization.method: minmax`); a rule entry (`{rule: ...}`,
    `'- fx.fuse_conv_bn'`)."""
    from edgeflow.hydra_app import RUN_KEYS, recipe_sections

    keys = {*RUN_KEYS, *recipe_sections(), "quantization"}
    key = rf"(?:{'|'.join(keys)})(?:\.[a-z_]+)+"
    in_hint = re.compile(rf"(?<![\w.])({key}): ([^\s,;)`'\"]+)( and remove {key})?")
    found = []
    for path in sorted((REPO / "edgeflow").rglob("*.py")):
        module = str(path.relative_to(REPO))
        for hint in _hints(path):
            for match in in_hint.finditer(hint):
                value = match.group(2)
                value = value[:-1] if value.endswith(".") else value
                also = match.group(3) or ""  # `set A: v and remove B`: one instruction
                found.append(("setting", f"{match.group(1)}: {value}{also}", module))
        for text in _texts(path):
            for match in OVERRIDE.finditer(text):
                value = _value(text, match.end())
                if value and match.group(1).lstrip("+").split(".")[0] in keys:  # not code's
                    found.append(("override", f"{match.group(1)}={value}", module))
            setting = WHOLE_SETTING.fullmatch(text)
            if setting and setting.group(1).split(".")[0] in keys:
                found.append(("setting", f"{setting.group(1)}: {setting.group(2)}", module))
            for match in ENTRY.finditer(text):
                found.append(("rule", match.group(1) or match.group(0), module))
    return list(dict.fromkeys(found))


def demo_recipe(folder: Path, tensorflow: bool) -> tuple[Path, str]:
    """The demo recipe (digits_cnn, or digits_keras for a tensorflow source) as a file
    elsewhere, its weights found: (path, text)."""
    from tests.conftest import DEMO_WEIGHTS

    name = "digits_keras" if tensorflow else "digits_cnn"
    text = (REPO / "recipes" / f"{name}.yaml").read_text(encoding="utf-8")
    text = text.replace("../models/", f"{DEMO_WEIGHTS.parent}/")
    path = folder / f"demo-{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path, text


def fails_as_override(token: str, folder: Path) -> list[str]:
    """`edgeflow run recipe=DEMO TOKEN` as printed (a sweep's `a,b`: each value, as each job
    gets it); what went wrong, if anything."""
    from edgeflow.hydra_app import RUN_KEYS

    given, _, value = token.partition("=")
    key = given.lstrip("+")
    path, _ = demo_recipe(folder, key.startswith(TENSORFLOW_KEYS))
    values = [value] if value.startswith(("[", "{")) else value.split(",")
    failures = []
    for one in values:
        arg = f"{given}={one}"
        loaded = run([arg] if key == "recipe" else [f"recipe={path}", arg])
        if isinstance(loaded, str):
            failures.append(f"{token} as {arg}:\n{loaded}")
        elif key not in RUN_KEYS and key != "quantization":
            kind = "rule" if key == "rewrites" else "setting"
            shown = one.strip("[]") if kind == "rule" else f"{key}: {one}"
            if not applied(loaded, kind, shown):
                failures.append(f"{token} as {arg}: loaded, but not as printed")
    return failures


def test_every_hint_written_in_the_code_works_as_printed(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(folder)  # cache_dir=.edgeflow/cache and the like land here
    written = written_hints()
    hints: dict[tuple[str, str], str] = {}  # each distinct hint once, with where it is written
    for kind, text, module in written:
        hints[kind, text] = f"{hints[kind, text]}, {module}" if (kind, text) in hints else module
    skipped = {text for _, text in hints if text in SKIPPED}
    assert skipped == set(SKIPPED), "SKIPPED names a hint no longer printed"
    counts = Counter(kind for kind, text in hints if text not in SKIPPED)
    print(f"\n{len(written)} hints written, {dict(counts)} distinct, {len(skipped)} skipped")
    assert counts["override"] >= 15 and counts["setting"] >= 10 and counts["rule"] >= 2
    failures = []
    for (kind, text), module in hints.items():
        if text in SKIPPED:
            continue
        assert HOLE not in text and "..." not in text, f"{text!r} ({module}): list it in SKIPPED"
        if kind == "override":
            failures += [f"{module}: {f}" for f in fails_as_override(text, folder)]
            continue
        tensorflow = kind == "setting" and text.startswith(TENSORFLOW_KEYS)
        path, recipe = demo_recipe(folder, tensorflow)
        printed = Printed(kind, text, "tensorflow" if tensorflow else "pytorch", module, recipe)
        if "<" in text:  # a template: what is wrong is only what its placeholders stand for
            failures += template_failures(printed, folder)
            continue
        failures += [f for f in [fails_in_file(printed, folder / "hint.yaml")] if f]
        failures += fails_on_command_line(printed, path)
    assert failures == [], "\n\n".join(failures)


def template_failures(p: Printed, folder: Path) -> list[str]:
    """A template loads with problems at its placeholders' options only (a `<str>` may pass
    as a string), never elsewhere: it names the rule's required options and no other."""
    path = folder / "template.yaml"
    path.write_text(in_file(p.recipe, "rule", p.text), encoding="utf-8")
    holes = re.findall(r"(\w+): <[^>]*>", p.text)
    index = len(YAML(typ="safe").load(p.recipe).get("rewrites") or [])
    try:
        load_recipe(path)
    except RecipeError as exc:
        keys = {problem.key for problem in exc.problems}
        expected = {f"rewrites[{index}].{hole}" for hole in holes}
        return [] if keys <= expected else [f"{p.text} ({p.where}):\n{exc.render()}"]
    return [f"{p.text} ({p.where}): a template loads as it is: print it as an entry"]


def test_every_template_explain_can_print_is_wrong_only_at_its_placeholders(
    folder: Path,
) -> None:
    """Explain lists a rule whose options only the user knows as a template; the loader's
    'needs' hint is one too. Each names the rule's required options and nothing else."""
    from edgeflow.explain import rules_for
    from edgeflow.rules import builtin_rules
    from edgeflow.rules.entries import required, template
    from edgeflow.rules.fixes import CAPTURES, FINDINGS, Fix

    fixes = {fix for rule in builtin_rules().values() for fix in rule.fixes}
    fixes |= {Fix.capture(c) for c in CAPTURES} | {Fix.finding(f) for f in FINDINGS}
    templates = {e for fix in fixes for e in rules_for(fix) if "<" in e}
    templates |= {template(r) for r in builtin_rules().values() if required(r)}
    print(f"\n{len(templates)} templates: {sorted(templates)}")
    assert len(templates) >= 6
    _, recipe = demo_recipe(folder, tensorflow=False)
    failures = []
    for text in sorted(templates):
        failures += template_failures(Printed("rule", text, "pytorch", "template", recipe), folder)
    assert failures == [], "\n\n".join(failures)


def test_a_removal_hint_does_what_removing_the_key_does(folder: Path) -> None:
    """`~key` is refused (a recipe key cannot be removed on the command line); the hint's
    override, run as printed, loads as the recipe without that key does (or fails with the
    same problem: int8 without calibration). It said `key=null` ("null means its default"),
    which `verify.latency_runs=null` refuses and which turns `verify.max_accuracy_drop` off
    rather than back to 0.01."""
    from ruamel.yaml.comments import CommentedMap

    path, text = demo_recipe(folder, tensorflow=False)
    tree = YAML(typ="rt").load(text)
    keys = [k for k in tree if k not in ("target", "quantization")]  # not config groups
    keys += [f"{k}.{sub}" for k, v in tree.items() if isinstance(v, CommentedMap) for sub in v]
    keys += ["rewrites", "target_rewrites", "precheck.board", "diff"]
    followed = 0
    for key in keys:
        refused = run([f"recipe={path}", f"~{key}"])
        assert isinstance(refused, str) and "cannot be removed on the command line" in refused
        yaml = YAML(typ="rt")
        without = yaml.load(text)
        *parents, last = key.split(".")
        node = without
        for part in parents:
            node = node.get(part) or {}
        node.pop(last, None)
        removed = folder / "removed.yaml"
        with removed.open("w", encoding="utf-8") as out:
            yaml.dump(without, out)
        try:
            expected: LoadedRecipe | str = load_recipe(removed)
        except RecipeError as exc:
            expected = "\n".join(f"{p.key}: {p.message}" for p in exc.problems)
        found = re.search(rf"\(({re.escape(key)}=[^)]*)\)", refused)
        if found is None:  # "edit the recipe": a required key, or in a section of several kinds
            assert isinstance(expected, str) or key.startswith("source."), (key, refused)
            continue
        followed += 1
        loaded = run([f"recipe={path}", found.group(1)])
        if isinstance(expected, str):  # the key cannot go: the override fails as removing does
            assert isinstance(loaded, str) and all(m in loaded for m in expected.splitlines())
            continue
        assert not isinstance(loaded, str), f"{found.group(1)}: {loaded}"
        assert _at(loaded, key) == _at(expected, key), found.group(1)
    assert followed >= 15
