"""Load YAML with line numbers and turn pydantic errors into `file:line:col: key: message` lines."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from edgeflow.errors import Problem, RecipeError
from edgeflow.recipe.suggest import closest, did_you_mean

M = TypeVar("M", bound=BaseModel)
COMMAND_LINE = "<command line>"


def display_path(path: Path) -> str:
    """The path as a user would type it: relative to the working directory where possible."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def read_yaml(path: Path) -> Any:
    """Parse a YAML file keeping positions; syntax errors become a located RecipeError."""
    shown = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecipeError([Problem(shown, 0, 0, "", f"cannot read file: {exc.strerror}")]) from None
    try:
        tree = YAML(typ="rt").load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = exc.problem or "invalid YAML"
        context = f" {exc.context}" if exc.context else ""
        hint = "check the indentation and quoting on this line or the one above"
        if "duplicate key" in problem or "found duplicate key" in str(exc):
            hint = "remove or rename one of the two keys"
        raise RecipeError(
            [Problem(shown, line, col, "", f"invalid YAML: {problem}{context}", hint)]
        ) from None
    except YAMLError as exc:
        raise RecipeError([Problem(shown, 1, 1, "", f"invalid YAML: {exc}")]) from None
    if not isinstance(tree, CommentedMap):
        raise RecipeError(
            [Problem(shown, 1, 1, "", "expected a mapping of keys at the top level", None)]
        )
    return tree


def apply_overrides(tree: CommentedMap, overrides: Mapping[str, Any]) -> None:
    """Set dotted keys (from the command line) in a parsed tree, creating mappings as needed."""
    for dotted, value in overrides.items():
        node = tree
        *parents, last = dotted.split(".")
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict):
                child = CommentedMap()
                node[part] = child
            node = child
        node[last] = value


def plain(node: Any) -> Any:
    """ruamel's annotated containers and scalars -> builtin Python types."""
    if isinstance(node, Mapping):
        return {str(k): plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    for kind in (int, float, str):
        if isinstance(node, kind):
            return kind(node)
    return node


def validate(
    model: type[M],
    tree: CommentedMap,
    path: Path,
    context: dict[str, Any] | None = None,
    overridden: Mapping[str, Any] | None = None,
    at: tuple[str | int, ...] = (),
    data: Any = None,
) -> M:
    """Validate a parsed tree (or `data` found at `at` in it); every problem is reported at
    once as a RecipeError located in the tree."""
    if data is None:
        node = tree
        for part in at:
            node = node[part]
        data = plain(node)
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        problems = [_problem(model, tree, path, e, overridden or {}, at) for e in exc.errors()]
        problems.sort(key=lambda p: (p.file == COMMAND_LINE, p.line, p.col))
        raise RecipeError(problems) from None


def _problem(
    model: type[BaseModel],
    tree: Any,
    path: Path,
    err: Any,
    overridden: Mapping[str, Any],
    at: tuple[str | int, ...] = (),
) -> Problem:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    loc = tuple(err["loc"])
    if kind == "edgeflow" and ctx.get("at"):
        loc = tuple(ctx["at"].split("."))
    keys, line, col = _locate(tree, at + loc, point_at_key=kind == "extra_forbidden")
    if kind == "union_tag_not_found":
        keys.append(str(ctx.get("discriminator", "kind")).strip("'"))
    dotted = _dotted(keys)
    message, hint = _describe(model, loc, err, keys)
    for key in overridden:
        if dotted == key or dotted.startswith(key + ".") or dotted.startswith(key + "["):
            shown = f"{COMMAND_LINE} ({key}={overridden[key]})"
            return Problem(shown, 0, 0, dotted, message, hint)
    return Problem(display_path(path), line, col, dotted, message, hint)


def _locate(
    tree: Any, loc: tuple[Any, ...], point_at_key: bool
) -> tuple[list[str | int], int, int]:
    """Walk `loc` through the tree: the keys found and the 1-based position to report."""
    node, line, col = tree, 1, 1
    keys: list[str | int] = []
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, CommentedMap) and part in node:
            if part in node.lc.data:
                key_line, key_col = node.lc.key(part)
                val_line, val_col = node.lc.value(part)
            else:  # set from the command line: no position; stay at the parent's
                key_line = val_line = line - 1
                key_col = val_col = col - 1
            child = node[part]
            scalar = not isinstance(child, CommentedMap | CommentedSeq)
            if last and scalar and not point_at_key:
                line, col = val_line + 1, val_col + 1
            else:
                line, col = key_line + 1, key_col + 1
            node = child
            keys.append(part)
        elif isinstance(node, CommentedSeq) and isinstance(part, int) and part < len(node):
            item_line, item_col = node.lc.item(part)
            line, col = item_line + 1, item_col + 1
            node = node[part]
            keys.append(part)
        elif isinstance(node, CommentedMap) and (last or isinstance(part, int)):
            keys.append(part)  # a missing key: report it at its parent
        # otherwise a union tag that pydantic put into the location: it is not in the YAML
    return keys, line, col


def _dotted(keys: list[str | int]) -> str:
    out = ""
    for key in keys:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _choices(text: str) -> list[str]:
    return re.findall(r"'([^']*)'", text)


def _describe(
    model: type[BaseModel], loc: tuple[Any, ...], err: Any, keys: list[str | int]
) -> tuple[str, str | None]:
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    last = str(keys[-1]) if keys else ""
    if kind == "edgeflow":
        return ctx["message"], ctx.get("hint") or None
    if kind == "missing":
        parent = _dotted(keys[:-1]) or "the top level"
        return "missing required key", f"add '{last}:' under {parent}"
    if kind == "extra_forbidden":
        allowed = allowed_keys(model, loc)
        guess = closest(last, allowed)
        hint = f"did you mean '{guess}'?" if guess else f"allowed keys: {', '.join(allowed)}"
        return f"unknown key '{last}'", hint
    if kind in ("literal_error", "enum"):
        options = _choices(str(ctx.get("expected", "")))
        return f"must be one of {', '.join(options)} (got {_shown(got)})", did_you_mean(
            _shown(got), options
        )
    if kind == "union_tag_invalid":
        options = _choices(str(ctx.get("expected_tags", "")))
        tag = ctx.get("tag")
        return f"must be one of {', '.join(options)} (got {tag})", did_you_mean(str(tag), options)
    if kind == "union_tag_not_found":
        return "missing required key", "say which kind of source this is, e.g. kind: pytorch"
    message = str(err["msg"]).replace("Input should be", "must be").replace("Value error, ", "")
    message = message[0].lower() + message[1:] if message else message
    return f"{message} (got {_shown(got)})", None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    if typing.get_origin(annotation) is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, dict) or args:
        for arg in args:
            found.extend(_models_in(arg))
    return found


def allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys a mapping at `loc` (whose last element is the offending key) may have."""
    candidates = [model]
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        nested = [
            sub
            for m in candidates
            if part in m.model_fields
            for sub in _models_in(m.model_fields[part].annotation)
        ]
        if nested:
            candidates = nested
            continue
        tagged = [m for m in candidates if part in _kind_literal(m)]
        candidates = tagged or candidates
    return sorted({f.alias or name for m in candidates for name, f in m.model_fields.items()})


def _kind_literal(model: type[BaseModel]) -> tuple[Any, ...]:
    """The values of a model's `kind: Literal[...]` discriminator, if it has one."""
    field = model.model_fields.get("kind")
    return typing.get_args(field.annotation) if field else ()
