"""Recipes as data: the schema's kind of each key, paths in a recipe tree, and block YAML."""

from __future__ import annotations

import copy
import json
import math
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# --------------------------------------------------------------------------- YAML writing


@dataclass(frozen=True)
class Raw:
    """YAML text put into a recipe verbatim (deep nesting, anchors and aliases)."""

    text: str


def to_yaml(data: Any) -> str:
    """Block-style YAML for plain data: one key per line, so that problems have a line."""
    return "\n".join(_block(data, 0)) + "\n"


def _is_block(value: Any) -> bool:
    """Whether a value is written as a block (a non-empty map, or a list holding one)."""
    if isinstance(value, dict):
        return bool(value)
    return isinstance(value, list) and any(isinstance(v, dict) and v for v in value)


def _block(node: Any, indent: int) -> list[str]:
    """The lines of a node in block style at `indent`."""
    pad = " " * indent
    if isinstance(node, dict) and node:
        lines = []
        for key, value in node.items():
            if _is_block(value):
                lines += [f"{pad}{_key(key)}:", *_block(value, indent + 2)]
            else:
                lines.append(f"{pad}{_key(key)}: {_flow(value)}")
        return lines
    if _is_block(node):
        lines = []
        for item in node:
            sub = _block(item, indent + 2) if _is_block(item) else [f"{pad}  {_flow(item)}"]
            lines += [f"{pad}- {sub[0].lstrip()}", *sub[1:]]
        return lines
    return [pad + _flow(node)]


def _key(key: Any) -> str:
    """A mapping key: bare when YAML reads it back as the same string, else quoted."""
    plain = isinstance(key, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key)
    if plain and key.lower() not in ("true", "false", "null", "yes", "no", "on", "off"):
        return str(key)
    return _scalar(key)


def _flow(value: Any) -> str:
    """A value in flow style on one line (Raw text as it is)."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return _scalar(value)


def _scalar(value: Any) -> str:
    """A scalar as YAML reads it back: null, booleans, ints, floats (.nan, .inf), strings."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        mantissa, _, exponent = text.partition("e")
        return f"{mantissa}.0e{exponent}" if exponent and "." not in mantissa else text
    return json.dumps(str(value))


def shown(value: Any) -> str:
    """A value as the mutation wrote it into the recipe, for the report."""
    text = _flow(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text):,} chars)"


# --------------------------------------------------------------------------- recipe trees

# the per-output verify thresholds: numbers, null valid (min_sqnr_db null: no int8 default)
SQNR_AND_AGREEMENT = ("min_sqnr_db", "min_decision_agreement", "min_sequence_agreement")

# The recipe schema as docs/recipe.md states it: the expected kind of each key (list items
# as `[]`). Keys below FREE_ROOTS are keyword arguments that validation cannot judge.
KINDS: dict[str, str] = {
    "": "map",
    "name": "str",
    "description": "str",
    "source": "map",
    "source.kind": "str",
    "source.model": "str",
    "source.init": "map",
    "source.weights": "str",
    "source.inputs": "list",
    "source.inputs[]": "map",
    "source.inputs[].name": "str",
    "source.inputs[].shape": "list",
    "source.inputs[].shape[]": "number",
    "source.inputs[].dtype": "str",
    "source.outputs": "list",
    "source.outputs[]": "str",
    "source.dynamic_batch": "map",
    "source.dynamic_batch.min": "number",
    "source.dynamic_batch.max": "number",
    "export": "map",
    "export.opset": "number",
    "export.exporter": "str",
    "rewrites": "list",
    "rewrites[]": "rule",
    "rewrites[].rule": "str",
    "postprocess": "map",
    "postprocess.cut": "list",
    "postprocess.cut[]": "str",
    "target_rewrites": "bool",
    "optimize": "map",
    "optimize.onnxscript": "bool",
    "optimize.passes": "list",
    "optimize.passes[]": "str",
    "quantization": "map",
    "quantization.mode": "str",
    "quantization.per_channel": "bool",
    "quantization.symmetric": "bool",
    "quantization.method": "str",
    "quantization.reduce_range": "bool",
    "quantization.activations": "str",
    "target": "str",
    "precheck": "map",
    "precheck.continue_on_failure": "bool",
    "precheck.board": "str",
    "verify": "map",
    "verify.detections": "map",
    "verify.detections.box_units": "str",
    **{f"verify.{k}": "number" for k in ("max_abs_diff", "max_relative_diff", "max_latency_ms")},
    **{f"verify.{k}": "number" for k in ("max_accuracy_drop", "min_top1_agreement")},
    **{f"verify.{k}": "number" for k in SQNR_AND_AGREEMENT},
    **{f"verify.{k}": "number" for k in ("max_size_bytes", "latency_runs", "warmup_runs")},
    **{
        f"verify.detections.{k}": "number"
        for k in ("max_detections", "box_atol", "score_atol", "min_match_rate")
    },
    **{f"{d}": "map" for d in ("calibration", "evaluation")},
    **{f"{d}.{k}": "str" for d in ("calibration", "evaluation") for k in ("dataset", "split")},
    **{f"{d}.samples": "number" for d in ("calibration", "evaluation")},
    **{f"{d}.options": "map" for d in ("calibration", "evaluation")},
    "evaluation.metric": "str",
    "evaluation.outputs": "map",
}
FREE_ROOTS = ("source.init", "calibration.options", "evaluation.options")
# Keys whose documented default is "none": null is a valid value there.
NULLABLE = {
    "name",
    "source.weights",
    "source.outputs",
    "source.dynamic_batch",
    "postprocess",
    "precheck.board",
    *(f"{d}.{k}" for d in ("calibration", "evaluation") for k in ("split", "samples")),
    *(f"verify.{k}" for k in ("max_abs_diff", "max_relative_diff", "max_accuracy_drop")),
    *(f"verify.{k}" for k in ("min_top1_agreement", "max_latency_ms", "max_size_bytes")),
    *(f"verify.{k}" for k in SQNR_AND_AGREEMENT),
}
Path_ = tuple[str | int, ...]  # a path in a tree: keys and list indices


def walk(node: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """Every node of a tree with its path of keys and list indices."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, (*path, i))


def pattern_of(path: Path_) -> str:
    """("source", "inputs", 0, "shape", 2) -> "source.inputs[].shape[]"."""
    out = ""
    for part in path:
        out += "[]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def dotted(path: Path_) -> str:
    """("source", "inputs", 0, "shape", 2) -> "source.inputs[0].shape[2]"."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(the whole recipe)"


def kind_of(path: Path_) -> str:
    """What a key takes: a KINDS kind, "free" (keyword arguments) or "option" (rule options)."""
    pattern = pattern_of(path)
    if any(pattern.startswith((f"{root}.", f"{root}[")) for root in FREE_ROOTS):
        return "free"
    if pattern.startswith("rewrites[].") and pattern != "rewrites[].rule":
        return "option"
    return KINDS.get(pattern, "unknown")


def needs_calibration(tree: Any) -> bool:
    """int8 with computed scales needs a calibration dataset (the schema's rule)."""
    q = tree.get("quantization") if isinstance(tree, dict) else None
    q = q if isinstance(q, dict) else {}
    return q.get("mode") == "int8" and q.get("method") != "qat"


def nullable(tree: Any, path: Path_) -> bool:
    """Whether null is a valid value at `path`."""
    pattern = pattern_of(path)
    return pattern in NULLABLE or (pattern == "calibration" and not needs_calibration(tree))


def get_in(tree: Any, path: Path_) -> Any:
    """The node at `path`."""
    for part in path:
        tree = tree[part]
    return tree


def with_value(tree: Any, path: Path_, value: Any) -> Any:
    """A copy of the tree with `path` set (missing mappings on the way are created)."""
    if not path:
        return value
    tree = copy.deepcopy(tree)
    node = tree
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
    node[path[-1]] = value
    return tree


def without(tree: Any, path: Path_) -> Any:
    """A copy of the tree with `path` removed."""
    tree = copy.deepcopy(tree)
    del get_in(tree, path[:-1])[path[-1]]
    return tree


def concrete(tree: Any, pattern: str, rng: random.Random) -> Path_ | None:
    """A path in this tree for a pattern (a random index for each `[]`); None if absent.
    The last key may be missing (it is then added); the mappings above it must exist."""
    node, path = tree, []
    tokens = re.findall(r"\[\]|[^.\[\]]+", pattern)
    for i, token in enumerate(tokens):
        if token == "[]":
            if not isinstance(node, list) or not node:
                return None
            path.append(rng.randrange(len(node)))
            node = node[path[-1]]
        elif not isinstance(node, dict):
            return None
        elif token not in node:
            return (*path, token) if i == len(tokens) - 1 else None
        else:
            path.append(token)
            node = node[token]
    return tuple(path)
