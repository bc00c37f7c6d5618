"""`edgeflow fix RECIPE [target=A,B] [KEY=VALUE ...]`: build with `rewrites: auto`, then write
what it chose into the recipe.

Each target is built as `edgeflow run recipe=RECIPE target=T ... +rewrites=[auto]` would
build it (and again with `quantization.fallback=auto` where an int8 build misses its
thresholds). The rules every target's build chose are written into the recipe's `rewrites:`
(each after the recipe's rules of its level, `auto` replaced by them); rules only some
targets need are printed as the command that adds them for those targets. The file is edited
as text, at the places ruamel.yaml's parse gives, so every other byte stays (comments,
order, blank lines); the result is parsed again and must hold exactly the intended data, or
nothing is written, nor is anything written to a file that changed on disk while the builds
ran. The diff is printed, and the recipe is built once more as written, each target, to
show that it holds without `auto`.
"""

from __future__ import annotations

import difflib
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules import AUTO
from edgeflow.rules.entries import flow

LEVELS = ("ast", "fx", "onnx")


@dataclass
class Outcome:
    """What the builds of one target chose, and how they ended."""

    target: str  # "" for the recipe's own
    exit_code: int
    rules: list[str] | None = None  # `rewrites:` entries; None where no build completed
    fallback: bool = False  # int8 needed quantization.fallback: auto to hold


def fix(name: str, args: list[str], quiet: bool = False) -> int:
    from edgeflow.core import resources
    from edgeflow.recipe import find_recipe, load_recipe

    path = find_recipe(name)
    builtin = resources.builtin_dir("recipes")
    if path.is_relative_to(builtin):
        raise EdgeflowError(
            f"{path.name} is a built-in recipe of edgeflow: fix edits the recipe file",
            f"copy it into your repository (cp {path} recipes/) and fix the copy",
        )
    original = path.read_text(encoding="utf-8")
    targets, rest = _targets(args)
    loaded = load_recipe(path)  # a recipe that does not load is reported before any build
    has_auto = loaded.recipe.rewrites_auto
    outcomes = [_build(path, t, rest, has_auto, quiet) for t in targets]
    built = [o for o in outcomes if o.rules is not None]
    if not built:
        print(f"\nfix: no build of {path.name} completed; nothing written (errors above)")
        return max(o.exit_code for o in outcomes)
    common = [r for r in built[0].rules or [] if all(r in (o.rules or []) for o in built)]
    fallback = all(o.fallback for o in built)
    for o in outcomes:
        _report(o, common, fallback, path, rest)
    if not common and not fallback and not has_auto:
        some = any(o.rules or o.fallback for o in built)
        print(f"\nfix: {'no change every target needs' if some else 'no change needed'}; "
              f"{path.name} left as it is")  # fmt: skip
        return max(o.exit_code for o in outcomes)
    text = edited(original, common, fallback)
    diff = "".join(
        difflib.unified_diff(
            original.splitlines(keepends=True),
            text.splitlines(keepends=True),
            f"a/{path.name}",
            f"b/{path.name}",
        )
    )
    _write(path, text, original)
    print(f"\nfix: wrote {path}:\n{diff}")
    return _as_written(path, [o.target for o in outcomes], rest, quiet)


def _write(path: Path, text: str, original: str) -> None:
    """Replace the recipe atomically (its mode kept), unless it changed since it was read."""
    import os
    import tempfile

    fd, part = tempfile.mkstemp(prefix=f".{path.name}.fix-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(part, path.stat().st_mode & 0o7777)
        if path.read_text(encoding="utf-8") != original:
            raise EdgeflowError(
                f"{path} changed while fix ran its builds: nothing written",
                "save your edits, then run edgeflow fix again",
            )
        os.replace(part, path)
    except BaseException:
        os.unlink(part)
        raise


def _targets(args: list[str]) -> tuple[list[str], list[str]]:
    """`target=a,b` -> the targets (the recipe's own: [""]), and the other arguments."""
    targets: list[str] = []
    rest = []
    for arg in args:
        if arg.startswith("target="):
            targets += [t for t in arg.removeprefix("target=").split(",") if t]
        elif arg in ("-m", "--multirun"):
            raise EdgeflowError(
                "fix runs one build per target itself: no -m",
                "name the targets as target=a,b",
            )
        else:
            rest.append(arg)
    return targets or [""], rest


def _build(path: Path, target: str, rest: list[str], has_auto: bool, quiet: bool) -> Outcome:
    from edgeflow.hydra_app import run_hydra

    argv = [f"recipe={path}", *([f"target={target}"] if target else []), *rest]
    if not has_auto:
        argv.append("+rewrites=[auto]")
    print(f"fix: edgeflow run {shlex.join(argv)}")
    results: list[Any] = []
    code = run_hydra(argv, quiet=quiet, results=results)
    outcome = Outcome(target, code)
    if not results:
        return outcome
    result = results[-1]
    q = result.loaded.recipe.quantization
    if result.failed_checks and q.mode == "int8" and q.fallback == "none":
        argv.append("quantization.fallback=auto")
        print(f"fix: int8 misses its thresholds; edgeflow run {shlex.join(argv)}")
        again: list[Any] = []
        code = run_hydra(argv, quiet=quiet, results=again)
        if again:
            result, outcome = again[-1], Outcome(target, code, fallback=True)
    outcome.exit_code = code
    outcome.rules = list(result.metrics.get("auto_rewrites") or [])
    return outcome


def _report(o: Outcome, common: list[str], fallback: bool, path: Path, rest: list[str]) -> None:
    """Per target: what it chose beyond what is written, as the command that adds it."""
    label = o.target or "the recipe's target"
    if o.rules is None:
        print(f"fix: {label}: no build completed (exit {o.exit_code}); nothing from it")
        return
    extra = [r for r in o.rules if r not in common]
    settings = []
    if extra:
        settings.append(f"+rewrites=[{', '.join(extra)}]")
    if o.fallback and not fallback:
        settings.append("quantization.fallback=auto")
    if settings:
        target = [f"target={o.target}"] if o.target else []
        command = shlex.join(["edgeflow", "run", f"recipe={path}", *target, *rest, *settings])
        print(f"fix: {label} also needs what the others do not; build it with:\n  {command}")


def edited(text: str, rules: list[str], fallback: bool) -> str:
    """The recipe text with `rules` in its `rewrites:` (each after the recipe's rules of its
    level; an `auto` entry or value replaced by them) and, with `fallback`, quantization's
    fallback set to auto. Lines are inserted and replaced in the text itself, found through
    ruamel.yaml's positions, so that every other byte stays; the result is parsed again and
    must hold exactly the intended data, or nothing is written."""
    from ruamel.yaml import YAML

    yaml = YAML()
    tree = yaml.load(text)
    lines = text.splitlines(keepends=True)
    entries = tree.get("rewrites")
    current = [] if entries in (None, AUTO) else [e for e in entries if e != AUTO]
    wanted = list(current)
    _merge(wanted, [_entry(yaml, r) for r in rules])
    edits: list[tuple[int, int, list[str]]] = []  # (first line, lines replaced, new lines)
    if fallback:
        edits.append(_fallback_edit(tree, lines))
    edits.append(_rewrites_edit(tree, lines, wanted))
    for first, count, new in sorted(edits, reverse=True):
        lines[first : first + count] = new
    result = "".join(lines)
    expected = yaml.load(text)
    if "rewrites" in expected:
        expected["rewrites"] = wanted
    else:
        expected.insert(_rewrites_position(expected), "rewrites", wanted)
    if fallback:
        expected["quantization"]["fallback"] = "auto"
    if _plain(yaml.load(result)) != _plain(expected):
        raise EdgeflowError(
            "fix could not place the rules in this recipe's layout: nothing written",
            f"add these to its rewrites: yourself: {', '.join(rules) or '(none)'}"
            + ("; and quantization.fallback: auto" if fallback else ""),
        )
    return result


def _plain(value: Any) -> Any:
    """ruamel's round-trip containers as plain ones (order kept, comments dropped)."""
    if isinstance(value, dict):
        return [(k, _plain(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _rewrites_edit(tree: Any, lines: list[str], wanted: list[Any]) -> tuple[int, int, list[str]]:
    """The edit that makes `rewrites:` hold `wanted`. In a block list, the recipe's own items
    keep their lines (comments included) and the new ones are inserted between them; a
    value `auto`, a flow list or no key at all becomes a block list (two-space dash under the
    key, as docs/recipe.md writes it), the key's comment kept."""
    from ruamel.yaml.comments import CommentedSeq

    if "rewrites" not in tree:
        keys = list(tree)
        position = _rewrites_position(tree)
        first = tree.lc.key(keys[position])[0] if position < len(keys) else len(lines)
        while first > 0 and lines[first - 1].lstrip().startswith("#"):
            first -= 1  # above the comment that leads the next key
        head = ["# rules chosen by `edgeflow fix` (rewrites: auto)\n", "rewrites:\n"]
        return first, 0, head + [f"  - {flow(e)}\n" for e in wanted]
    first, last = tree.lc.key("rewrites")[0], _last_line(tree, "rewrites", lines)
    entries = tree["rewrites"]
    spans: dict[int, list[str]] = {}  # the recipe's items by id: their own lines
    dash = "  - "
    if isinstance(entries, CommentedSeq) and not entries.fa.flow_style() and entries:
        starts = [entries.lc.item(i)[0] for i in range(len(entries))] + [last + 1]
        for i, entry in enumerate(entries):
            spans[id(entry)] = lines[starts[i] : starts[i + 1]]
        row = lines[starts[0]]
        dash = row[: row.index("-") + 2]
        head = lines[first : starts[0]]
    else:
        key_line = lines[first]
        comment = key_line[key_line.index("#") :].rstrip("\n") if "#" in key_line else ""
        head = [f"rewrites:{'  ' + comment if comment else ''}\n"]
    if not wanted:
        return first, last - first + 1, [head[0].replace("rewrites:", "rewrites: []", 1)]
    body = [
        line for e in wanted for line in spans.get(id(e), [f"{' ' * (len(dash) - 2)}- {flow(e)}\n"])
    ]
    return first, last - first + 1, [*head, *body]


def _last_line(tree: Any, key: str, lines: list[str]) -> int:
    """The last line of a top-level key's value: before the next key, without the blank and
    comment lines in between (they belong to what follows)."""
    keys = list(tree)
    following = keys[keys.index(key) + 1 :]
    end = tree.lc.key(following[0])[0] if following else len(lines)
    last, top = end - 1, tree.lc.key(key)[0]
    while last > top and (not lines[last].strip() or lines[last].lstrip().startswith("#")):
        last -= 1
    return last


def _fallback_edit(tree: Any, lines: list[str]) -> tuple[int, int, list[str]]:
    """quantization's `fallback: auto`: in a one-line flow mapping before its `}`, else a line
    after its last key."""
    from ruamel.yaml.comments import CommentedMap

    quantization = tree.get("quantization")
    if not isinstance(quantization, CommentedMap):
        raise EdgeflowError(
            "quantization.fallback: auto is needed, but the recipe has no quantization mapping",
            "add `quantization: {mode: int8, fallback: auto}` yourself",
        )
    first = tree.lc.key("quantization")[0]
    line = lines[first]
    if "fallback" in quantization:
        at = quantization.lc.value("fallback")
        row = lines[at[0]]
        value = str(quantization["fallback"])
        start = row.index(value, at[1])
        return at[0], 1, [row[:start] + "auto" + row[start + len(value) :]]
    if quantization.fa.flow_style():
        if "}" not in line:
            raise EdgeflowError(
                "quantization is a flow mapping over several lines: fix does not edit it",
                "add `fallback: auto` to quantization yourself",
            )
        close = line.rindex("}")
        return first, 1, [line[:close].rstrip() + ", fallback: auto" + line[close:]]
    column = quantization.lc.key(next(iter(quantization)))[1]
    return _last_line(tree, "quantization", lines) + 1, 0, [" " * column + "fallback: auto\n"]


def _entry(yaml: Any, text: str) -> Any:
    """A printed entry (`onnx.decompose`, `{rule: onnx.convert_opset, opset: 13}`) as YAML."""
    return yaml.load(text) if text.startswith("{") else text


def _level(entry: Any) -> int:
    name = entry.get("rule", "") if isinstance(entry, dict) else str(entry)
    prefix = name.split(".", 1)[0]
    return LEVELS.index(prefix) if prefix in LEVELS else len(LEVELS)  # a user rule: its own


def _merge(entries: list[Any], new: list[Any]) -> None:
    """Insert each of `new` after the last of `entries` of its level or below."""
    for entry in new:
        if entry in entries:
            continue
        at = max((i + 1 for i, e in enumerate(entries) if _level(e) <= _level(entry)), default=0)
        entries.insert(at, entry)


# The top-level keys a new `rewrites:` goes before, the first the recipe has (its place in
# docs/recipe.md's order).
AFTER_REWRITES = (
    "postprocess",
    "target_rewrites",
    "optimize",
    "calibration",
    "evaluation",
    "quantization",
    "target",
)


def _rewrites_position(tree: Any) -> int:
    keys = list(tree)
    return next((keys.index(k) for k in AFTER_REWRITES if k in keys), len(keys))


def _as_written(path: Path, targets: list[str], rest: list[str], quiet: bool) -> int:
    """Build the edited recipe as written, without `auto`, on each target."""
    from edgeflow.hydra_app import run_hydra

    worst = 0
    for target in targets:
        argv = [f"recipe={path}", *([f"target={target}"] if target else []), *rest]
        print(f"fix: as written: edgeflow run {shlex.join(argv)}")
        worst = max(worst, run_hydra(argv, quiet=quiet))
    return worst
