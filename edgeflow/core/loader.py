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

from edgeflow.core.errors import AtRecipeKey, EdgeflowError, Problem, RecipeError
from edgeflow.core.suggest import closest, did_you_mean

M = TypeVar("M", bound=BaseModel)
COMMAND_LINE = "<command line>"


def display_path(path: Path) -> str:
    """The path as a user would type it: relative to the working directory where possible."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# Limits that keep a malformed or hostile file from hanging or crashing the loader: a recipe
# is a few hundred lines; an alias "bomb" expands a few lines into billions of values.
MAX_FILE_BYTES = 1 << 20
MAX_VALUES = 100_000  # after expanding aliases, as validation sees them
MAX_DEPTH = 64


def read_yaml(path: Path) -> Any:
    """Parse a YAML file keeping positions. Anything wrong with the file (unreadable, not
    UTF-8, too big, invalid YAML, nested too deep, aliases expanding too far) becomes a
    located RecipeError."""
    shown = display_path(path)

    def fail(line: int, col: int, message: str, hint: str | None = None) -> RecipeError:
        return RecipeError([Problem(shown, line, col, "", message, hint)])

    try:
        if path.is_dir():
            raise fail(0, 0, "is a folder, not a YAML file", "give the path of a .yaml file")
        data = path.read_bytes()
    except OSError as exc:
        raise fail(0, 0, f"cannot read file: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise fail(
            1,
            1,
            f"file is {len(data):,} bytes, more than a recipe's limit of {MAX_FILE_BYTES:,}",
            "is this the right file?",
        )
    text = _decode(data, fail)
    deep = _too_deep_flow(text)
    if deep:
        raise fail(
            *deep,
            f"YAML nested more than {MAX_DEPTH} levels deep",
            "a recipe needs a few levels; look for unbalanced [ or {",
        )
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
        raise fail(line, col, f"invalid YAML: {problem}{context}", hint) from None
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise fail(line, col, f"invalid YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise fail(
            1,
            1,
            f"YAML nested too deeply (more than about {MAX_DEPTH} levels)",
            "a recipe needs a few levels; look for unbalanced [ or {",
        ) from None
    if not isinstance(tree, CommentedMap):
        raise fail(1, 1, "expected a mapping of keys at the top level")
    _check_extent(tree, fail)
    return tree


def _decode(data: bytes, fail: Any) -> str:
    """UTF-8 text (a UTF-8 BOM is allowed); other encodings are located errors."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise fail(1, 1, "the file is UTF-16 text", "save it as UTF-8")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise fail(
            line,
            col,
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} cannot be decoded",
            "save the file as UTF-8",
        ) from None
    if "\x00" in text:
        offset = text.index("\x00")
        line = text.count("\n", 0, offset) + 1
        col = offset - (text.rfind("\n", 0, offset) + 1) + 1
        raise fail(line, col, "the file holds a NUL byte (binary data?)", "save it as text")
    return text


def _too_deep_flow(text: str) -> tuple[int, int] | None:
    """(line, col) where [ and { nest deeper than MAX_DEPTH, found before the parser, whose
    recursion on 10,000 levels takes seconds before it fails."""
    depth, quote, line, col = 0, "", 1, 0
    for char in text:
        col += 1
        if char == "\n":
            line, col = line + 1, 0
            if quote == "#":
                quote = ""
        elif quote:
            if char == quote and quote != "#":
                quote = ""
        elif char in "'\"#":
            quote = char
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return line, col
        elif char in "]}":
            depth = max(0, depth - 1)
    return None


def _check_extent(tree: CommentedMap, fail: Any) -> None:
    """Refuse trees that validation would expand too far (aliases) or too deep (recursive
    aliases, deep nesting), reporting the top-level key under which it happens."""
    for key in tree:
        line, col = tree.lc.key(key) if key in positions(tree) else (0, 0)
        count = 0
        stack: list[tuple[Any, int]] = [(tree[key], 1)]
        while stack:
            node, depth = stack.pop()
            count += 1
            if depth > MAX_DEPTH:
                raise fail(
                    line + 1,
                    col + 1,
                    f"{key}: nested more than {MAX_DEPTH} levels deep (a recursive YAML alias?)",
                    "remove the alias or the nesting",
                )
            if count > MAX_VALUES:
                raise fail(
                    line + 1,
                    col + 1,
                    f"{key}: expands to more than {MAX_VALUES:,} values (YAML aliases?)",
                    "write the values out; do not nest aliases",
                )
            if isinstance(node, dict):
                stack.extend((v, depth + 1) for v in node.values())
                stack.extend((k, depth + 1) for k in node if not isinstance(k, str | int))
            elif isinstance(node, list):
                stack.extend((v, depth + 1) for v in node)


def apply_overrides(tree: CommentedMap, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Set dotted keys (from the command line) in a parsed tree, creating mappings as needed;
    a key ending in `+` appends to the list there (`rewrites+`). Returns the dotted keys that
    now hold command-line values (appended items by index, `rewrites[2]`), with the values,
    for errors to name the command line instead of the file."""
    located: dict[str, Any] = {}
    for given, value in overrides.items():
        dotted = given.removesuffix("+")
        node = tree
        *parents, last = dotted.split(".")
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict):
                child = CommentedMap()
                node[part] = child
            node = child
        if not given.endswith("+"):
            node[last] = _commented(value)
            located[dotted] = value
            continue
        current = node.get(last)
        if not isinstance(current, list):  # absent, or a wrong type the schema reports
            current = CommentedSeq() if current is None else current
            node[last] = current
        if not isinstance(current, list):
            located[dotted] = value
            continue
        for item in value if isinstance(value, list) else [value]:
            located[f"{dotted}[{len(current)}]"] = item
            current.append(_commented(item))
    return located


def _commented(value: Any) -> Any:
    """Command-line values as ruamel containers (without positions), like the file's."""
    if isinstance(value, Mapping):
        return CommentedMap((k, _commented(v)) for k, v in value.items())
    if isinstance(value, list):
        return CommentedSeq(_commented(v) for v in value)
    return value


def from_command_line(key: str, overridden: Mapping[str, Any]) -> str | None:
    """`<command line> (given=value)` when an override set this dotted key or one above it."""
    for given, value in overridden.items():
        if key == given or key.startswith(given + ".") or key.startswith(given + "["):
            return f"{COMMAND_LINE} ({given}={value})"
    return None


def locate(
    tree: Any, path: Path, overridden: Mapping[str, Any], key: str, message: str, hint: str | None
) -> Problem:
    """A problem at a dotted key: at its value where the file sets it, at the command line
    where an override does, else at the nearest key above it that the file has (or at
    `target:`, which decides most defaults)."""
    shown = from_command_line(key, overridden)
    if shown:
        return Problem(shown, 0, 0, key, message, hint)
    node, line, col = tree, None, None
    for part in _key_parts(key):
        if isinstance(node, CommentedSeq) and isinstance(part, int):
            if part not in positions(node):
                break
            line, col = positions(node)[part][:2]
            node = node[part]
            continue
        if not isinstance(node, CommentedMap) or part not in node or part not in positions(node):
            break
        child = node[part]
        scalar = not isinstance(child, CommentedMap | CommentedSeq)
        line, col = node.lc.value(part) if scalar else node.lc.key(part)
        node = child
    if line is None and isinstance(tree, CommentedMap) and "target" in positions(tree):
        line, col = tree.lc.key("target")
    if line is None or col is None:
        return Problem(display_path(path), 1, 1, key, message, hint)
    return Problem(display_path(path), line + 1, col + 1, key, message, hint)


def relocated(exc: EdgeflowError, path: Path) -> EdgeflowError:
    """`exc` as it is, or, raised at a recipe key (AtRecipeKey), at that key's line in `path`."""
    if not isinstance(exc, AtRecipeKey):
        return exc
    found = locate(read_yaml(path), path, {}, exc.key, exc.problem, None)
    return EdgeflowError(found.render(), exc.hint)


def _key_parts(key: str) -> list[str | int]:
    """'source.inputs[1].shape' -> ['source', 'inputs', 1, 'shape']."""
    parts: list[str | int] = []
    for word in key.split("."):
        name, *indices = word.split("[")
        if name:
            parts.append(name)
        parts += [int(i.rstrip("]")) for i in indices if i.rstrip("]").isdigit()]
    return parts


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
    if kind == "edgeflow" and ctx.get("at"):  # a key of the model that raised it
        loc = (*loc, *(int(k) if k.isdigit() else k for k in ctx["at"].split(".")))
    if kind == "union_tag_invalid":  # at the tag's own value, not the mapping holding it
        loc = (*loc, str(ctx.get("discriminator", "kind")).strip("'"))
    keys, line, col = _locate(tree, at + loc, point_at_key=kind == "extra_forbidden")
    if kind == "union_tag_not_found":
        keys.append(str(ctx.get("discriminator", "kind")).strip("'"))
    dotted = _dotted(keys)
    message, hint = _describe(model, loc, err, keys)
    shown = from_command_line(dotted, overridden)
    if shown:
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
            if part in positions(node):
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
            position = positions(node).get(part)  # None for an item set on the command line
            if position is not None:
                line, col = position[0] + 1, position[1] + 1
            node = node[part]
            keys.append(part)
        elif isinstance(node, CommentedMap) and (last or isinstance(part, int)):
            keys.append(part)  # a missing key: report it at its parent
        # otherwise a union tag that pydantic put into the location: it is not in the YAML
    return keys, line, col


def positions(node: CommentedMap | CommentedSeq) -> dict[Any, Any]:
    """ruamel's positions of a container's keys or items (none for one made in code)."""
    return getattr(node.lc, "data", None) or {}


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
        if keys and keys[0] == "source":
            return "missing required key", "say which kind of source this is, e.g. kind: pytorch"
        parent = _dotted(keys[:-1]) or "the top level"
        return "missing required key", f"add '{last}:' under {parent}"
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
