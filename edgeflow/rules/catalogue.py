"""The rule catalogue, generated from the registry: `edgeflow rules` and docs/rules.md.

Refresh the document after changing a rule: `python -m edgeflow.rules.catalogue --write`.
"""

from __future__ import annotations

import argparse
import inspect
import types
import typing
from pathlib import Path
from typing import Any

from pydantic_core import PydanticUndefined

from edgeflow.rules import builtin_rules
from edgeflow.rules.fixes import CAPTURES, FINDINGS, Fix

DOC = Path(__file__).resolve().parents[2] / "docs" / "rules.md"
LEVELS = {
    "ast": "Python source (before tracing)",
    "fx": "torch.fx graph",
    "onnx": "ONNX graph (after export)",
}

HEADER = """\
# Rule catalogue

<!-- Generated from the rule registry by `python -m edgeflow.rules.catalogue --write`;
     tests/rules/test_catalogue.py fails when this file is out of date. -->

A recipe's `rewrites:` list names rules in the order they apply; rules run in level order
(all `ast.*`, then `fx.*`, then `onnx.*`), and a rule that must run before or after another
says so below ("Runs before"): the recipe loader checks both; a recipe's onnx rule that one
of the target's defaults must precede runs again after it:

```yaml
rewrites:
  - ast.float64_to_float32                               # a rule by name
  - {rule: fx.replace_activation, from: silu, to: x_sigmoid}  # a rule with options
  - mypkg.rules:MyRule                                   # your own rule, by import path
```

Entries are checked when the recipe loads: an unknown rule or option is an error with its
file:line:col and a "did you mean". `edgeflow rules` lists the same rules in the terminal.
The `rewrite` stage (ast, fx) checks that the rewritten module computes what the original does
on the declared input shapes, within each rule's stated tolerance; `rewrite_onnx` applies the
onnx rules after export. A target profile can add onnx rules of its own, which run after the
recipe's (`rewrite_target`; see "Default rewrites" in [targets.md](targets.md)). What each
rule changed is in the build's report.

A rule's "Fixes" line says what it removes, in the words of the tools that report it (see
[What rules fix](#what-rules-fix)): the precheck suggests a rule that declares what it found,
`edgeflow explain` lists all that declare the capture failure or exported operator it found.
"""

FIXES_SECTION = """\
## What rules fix

A rule declares what it removes (`fixes`, see [writing-rules.md](writing-rules.md)); the
precheck and `edgeflow explain` suggest the built-in rules that declare what they report. The
precheck suggests one rule per finding: the first onnx rule in this catalogue's order that
fixes it (it applies to the very model checked), else, for a pytorch source, the first of
another level; for a finding about an operator that no rule declares (a failed check, a
type), a rule that removes the operator. It prints the rule as a `rewrites:` entry with the
options that make it remove the finding (a rule's `fix_options`, or what the finding computed,
such as the opset), and passes over a rule whose options only the user knows. `edgeflow
explain` lists every rule that fixes what it found, in this catalogue's order; such a rule as
a template: `{rule: fx.wrap_leaf, functions: <list>}`. `rewrites: auto` applies them for you:
each round the rule that removes the most of the precheck's errors without adding one, and
on a PyTorch source the ast/fx rules explain names for an export failure
([recipe.md](recipe.md#rewrites-auto)).

- `Fix.op("Erf")`: an operator, as the precheck reports it ("not supported by ...") and as
  `edgeflow explain` flags it in an exported graph (NonZero, If, Loop, Scan, NonMaxSuppression);
- `Fix.check("Conv", "not_grouped")`: a node failing one of the precheck's named checkers
  ([targets.md](targets.md), "Operators");
- `Fix.finding("float64")`: a precheck finding about the model, `(float64)` in its table;
- `Fix.capture("nonzero")`: the cause of a failed trace or export, as `edgeflow explain`
  names it.
"""


def options_rows(options: type[Any]) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for each option of a rule."""
    rows = []
    for name, field in options.model_fields.items():
        key = field.alias or name
        kind = _type_name(field.annotation)
        if field.default is PydanticUndefined and field.default_factory is None:
            default = "required"
        else:
            default = repr(field.get_default(call_default_factory=True))
        rows.append((key, kind, default, field.description or ""))
    return rows


def _type_name(annotation: Any) -> str:
    """A readable type: Literal choices, container[item], Optional as `X \\| None`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is not None and args:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def render_markdown() -> str:
    rules = builtin_rules()
    out = [HEADER]
    for level, title in LEVELS.items():
        of_level = [r for r in rules.values() if r.level == level]
        out.append(f"\n## `{level}.*`: {title}\n")
        if not of_level:
            out.append("No rules of this level yet.\n")
        for rule in of_level:
            out.append(_render_rule(rule))
    out.append(_render_vocabulary())
    return "\n".join(out).rstrip() + "\n"


def _render_vocabulary() -> str:
    lines = [FIXES_SECTION, "| precheck finding | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {meaning} |" for name, meaning in FINDINGS.items()]
    lines += ["", "| capture failure | the cause `edgeflow explain` names |", "|---|---|"]
    lines += [f"| `{name}` | {cause} |" for name, cause in CAPTURES.items()]
    return "\n".join(lines) + "\n"


def fixes_text(fixes: tuple[Fix, ...]) -> str:
    """A rule's declared fixes in words, grouped by kind: "operators `Erf`, `Gelu`; ..."."""
    words = {
        "op": ("operator", "operators"),
        "check": ("failed check", "failed checks"),
        "finding": ("precheck finding", "precheck findings"),
        "capture": ("capture failure", "capture failures"),
    }
    parts = []
    for kind, (one, many) in words.items():
        names = [f"`{fix}`" for fix in fixes if fix.kind == kind]
        if names:
            parts.append(f"{one if len(names) == 1 else many} {', '.join(names)}")
    return "; ".join(parts)


def _render_rule(rule: type[Any]) -> str:
    lines = [f"### `{rule.name}`", "", rule.description, ""]
    doc = inspect.cleandoc(rule.__doc__ or "")
    if doc and doc.splitlines()[0] != rule.description:
        lines += [doc, ""]
    if rule.fixes:
        lines += [f"Fixes: {fixes_text(rule.fixes)}.", ""]
    for mode, why in rule.breaks.items():  # the precheck does not suggest it for these
        lines += [f"Breaks {mode} builds (not suggested for them): {why}.", ""]
    for where, declared in (("before", rule.runs_before), ("after", rule.runs_after)):
        for name, why in declared.items():  # checked when the recipe loads (rules.order)
            lines += [f"Runs {where} `{name}`: {why}.", ""]
    rows = options_rows(rule.Options)
    if rows and any(m for *_, m in rows):
        lines += ["| option | type | default | meaning |", "|---|---|---|---|"]
        lines += [f"| `{k}` | {t} | `{d}` | {m} |" for k, t, d, m in rows]
        lines.append("")
    elif rows:
        lines += ["| option | type | default |", "|---|---|---|"]
        lines += [f"| `{k}` | {t} | `{d}` |" for k, t, d, _ in rows]
        lines.append("")
    else:
        lines += ["No options.", ""]
    options_doc = rule.Options.__dict__.get("__doc__")
    if rows and options_doc:
        lines += [inspect.cleandoc(options_doc), ""]
    if rule.example:
        before, after = rule.example
        fence = "python" if rule.level == "ast" else "text"
        lines += ["Before:", "", f"```{fence}", before.strip(), "```", ""]
        lines += ["After:", "", f"```{fence}", after.strip(), "```", ""]
    return "\n".join(lines)


def render_terminal() -> str:
    rules = builtin_rules()
    if not rules:
        return "no rules registered"
    width = max(len(name) for name in rules)
    lines = []
    for name, rule in rules.items():
        lines.append(f"{name:<{width}}  {rule.description}")
        if rule.fixes:
            lines.append(f"{'':<{width}}    fixes: {fixes_text(rule.fixes).replace('`', '')}")
        for key, kind, default, _ in options_rows(rule.Options):
            lines.append(f"{'':<{width}}    {key}: {kind} = {default}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {DOC}")
    args = parser.parse_args(argv)
    text = render_markdown()
    if args.write:
        DOC.write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
