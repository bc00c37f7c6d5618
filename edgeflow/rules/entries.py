"""A `rewrites:` entry as edgeflow prints it, for a user to paste.

`entry("onnx.convert_opset", {"opset": 11})` is `{rule: onnx.convert_opset, opset: 11}`: a
YAML flow mapping that reads back as the same values in a recipe file and inside a command
line's `rewrites=[...]` / `+rewrites=[...]` (Hydra's override grammar). A suggestion is
printed with the options that make the rule remove what was found (`options_for`), or, where
those are the user's to choose (which function to keep whole), as a template whose `<...>`
placeholders say what to write (`template`).
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Mapping
from typing import Any

from edgeflow.rules.fixes import Fix

# A string written without quotes: it reads back as this string in YAML (1.1 and 1.2) and in
# Hydra's grammar. Words that either reads as a boolean, null or number are quoted.
PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/:]*")
KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")  # Hydra's keys take no quotes and no ':'
RESERVED = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "inf", "nan"}


def entry(rule: str, options: Mapping[str, Any]) -> str:
    """The entry for `rule` with these options: its name alone when it takes none."""
    if not options:
        return rule
    return flow({"rule": rule, **options})


def flow(value: Any) -> str:
    """A value in the flow form that YAML and Hydra's overrides both read back as it is."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(str(k))}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    raise TypeError(f"no flow form for {type(value).__name__} {value!r}")


def _float(value: float) -> str:
    """With a point and a signed exponent (1.0e-05): YAML 1.1 reads `1e-05` as a string."""
    if not math.isfinite(value):
        raise ValueError(f"no form both YAML and Hydra read as {value}")
    text = repr(value)
    mantissa, e, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + (e + exponent if e else "")


def _key(text: str) -> str:
    if KEY.fullmatch(text) and text.lower() not in RESERVED:
        return text
    raise ValueError(f"no key both YAML and Hydra read as {text!r}")


def _string(text: str) -> str:
    if PLAIN.fullmatch(text) and not text.endswith(":") and text.lower() not in RESERVED:
        return text
    if "'" not in text and not text.endswith("\\"):
        return f"'{text}'"  # YAML and Hydra take what is between single quotes as it is
    if "\\" not in text:
        return '"' + text.replace('"', '\\"') + '"'  # both read \" as "
    raise ValueError(f"no form both YAML and Hydra read as {text!r}")


def required(rule: type[Any]) -> list[str]:
    """The options an entry of `rule` must give, as a recipe spells them (`from`, not `from_`)."""
    fields = rule.Options.model_fields
    return [field.alias or name for name, field in fields.items() if field.is_required()]


def options_for(rule: type[Any], fix: Fix, given: Mapping[str, Any] | None = None) -> Any:
    """The options with which `rule` removes `fix`, as its entry gives them: `given` (what a
    finding computed, such as the opset to convert to) where the rule takes them, else those
    the rule declares for this fix (`fix_options`), else none where it needs none. None where
    they are the user's to choose (the function to keep whole): no entry can be suggested."""
    fields = {f.alias or name for name, f in rule.Options.model_fields.items()}
    if given and set(given) <= fields:
        return dict(given)
    declared = rule.fix_options.get(fix)
    if declared is not None:
        return dict(declared)
    return None if required(rule) else {}


def template(rule: type[Any]) -> str:
    """The entry of a rule whose required options only the user knows, with a `<...>`
    placeholder for each (`{rule: fx.wrap_leaf, functions: <list>}`): not pasteable as it is."""
    fields = {f.alias or name: f for name, f in rule.Options.model_fields.items()}
    parts = [f"{key}: <{_kind(fields[key].annotation)}>" for key in required(rule)]
    return "{" + ", ".join([f"rule: {rule.name}", *parts]) + "}"


def _kind(annotation: Any) -> str:
    """`int`, `list`, `relu|gelu` (a Literal's values): what a placeholder stands for."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _kind(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) is typing.Literal:
        return "|".join(str(v) for v in typing.get_args(annotation))
    origin = typing.get_origin(annotation) or annotation
    return getattr(origin, "__name__", "value")
