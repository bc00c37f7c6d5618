"""`edgeflow explain RECIPE`: why the recipe's model does not trace or export, and which rules help.

Each capture path a converter depends on is tried on the recipe's model with its declared input
shapes: torch.fx.symbolic_trace, torch.export (strict and non-strict), and torch.onnx.export
(dynamo and TorchScript). Every failure is traced back to the line of the user's code that
caused it, classified in plain words, and mapped to the rules that declare they fix that class
of failure (`fixes`, see edgeflow.rules.fixes).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import tempfile
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgeflow.rules import rules_fixing
from edgeflow.rules.entries import entry, options_for, template
from edgeflow.rules.fixes import CAPTURES, Fix

# The capture failure class (edgeflow.rules.fixes.CAPTURES) by what the failing line or the
# error says; first match wins.
CAUSES: list[tuple[str, str]] = [
    (r"nonzero|torch\.where\(|masked_select|\[.*(>|<|==|!=|mask).*\]", "nonzero"),
    (r"\.item\(\)|int\(|float\(", "item"),
    (r"float64|\.double\(\)|torch\.double|Double", "float64"),
    (r"\.shape|\.size\(|len\(|\.dim\(\)|\.numel\(\)", "shape"),
    (r"^\s*for .* in |iterat", "loop"),
    (
        r"^\s*(el)?if |^\s*while |control flow|branching|guard on data-dependent|Could not guard",
        "tensor_if",
    ),
    (r"not supported|Unsupported|no symbolic|could not find an implementation", "unsupported"),
]
BAKED = "baked_branch"  # a TorchScript trace that baked a Python branch in as a constant


# ONNX ops that export fine but that no edge target runs as a static graph, with the cause.
HAZARDS: dict[str, str] = {
    "NonZero": CAPTURES["nonzero"],
    "If": "data-dependent control flow exported as If",
    "Loop": "a loop exported as Loop",
    "Scan": "a loop exported as Scan",
    "NonMaxSuppression": "NMS with a data-dependent number of boxes",
}


# The capture path each `export.exporter` takes (explain's method names).
EXPORTERS = {
    "dynamo": "torch.onnx.export (dynamo)",
    "torchscript": "torch.onnx.export (torchscript)",
}


def rules_for(fix: Fix) -> list[str]:
    """The built-in rules that fix `fix`, in catalogue order, as a recipe's `rewrites:` takes
    them: a name, or a mapping with the options that make the rule remove it; a rule whose
    options only the user knows (the function to keep whole) as a template whose `<...>`
    placeholders say what to write (edgeflow.rules.entries)."""
    found = [(rule, options_for(rule, fix)) for rule in rules_fixing(fix)]
    return [template(r) if options is None else entry(r.name, options) for r, options in found]


@dataclass
class Attempt:
    method: str
    ok: bool
    cause: str = ""
    location: str = ""
    code: str = ""
    error: str = ""
    rules: list[str] = field(default_factory=list)


def explain(recipe: Any, module: Any, only: tuple[str, ...] = ()) -> list[Attempt]:
    """Try every capture path on the recipe's model (`module`: as built, or with the recipe's
    rewrites applied); `only`: those paths only, by their names (EXPORTERS' values, ...)."""
    with tempfile.TemporaryDirectory() as folder:
        return _attempts(recipe, module, Path(folder) / "probe.onnx", only)


def _attempts(recipe: Any, module: Any, onnx_path: Path, only: tuple[str, ...]) -> list[Attempt]:
    import torch

    from edgeflow.source import example_inputs

    args = example_inputs(recipe.source.inputs)
    user_files = _user_files(module)
    methods: list[tuple[str, Callable[[], object]]] = [
        ("torch.fx.symbolic_trace", lambda: torch.fx.symbolic_trace(module)),
        ("torch.export (strict)", lambda: torch.export.export(module, args, strict=True)),
        ("torch.export (non-strict)", lambda: torch.export.export(module, args, strict=False)),
        (
            EXPORTERS["dynamo"],
            lambda: torch.onnx.export(
                module, args, str(onnx_path), dynamo=True, external_data=False, verbose=False
            ),
        ),
        (
            EXPORTERS["torchscript"],
            lambda: torch.onnx.export(module, args, str(onnx_path), dynamo=False),
        ),
    ]
    attempts = []
    for name, run in methods:
        if only and name not in only:
            continue
        with _quiet(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                run()
            except Exception as exc:
                attempts.append(_diagnose(name, exc, user_files))
                continue
        # "Converting a tensor to a Python boolean/integer/float/index": a value fixed at trace
        # time. Other TracerWarnings (torch.tensor of a constant, ...) do not change results,
        # nor does a decision on shapes when every input shape is declared static.
        static = recipe.source.dynamic_batch is None
        baked = [
            w
            for w in caught
            if type(w.message).__name__ == "TracerWarning"
            and str(w.message).startswith("Converting a tensor to a Python")
            and not (static and _shape_only(_source_line(w.filename, w.lineno)))
        ]
        if baked:
            w = baked[0]
            attempts.append(
                Attempt(
                    name,
                    False,
                    CAPTURES[BAKED],
                    f"{w.filename}:{w.lineno}",
                    _source_line(w.filename, w.lineno),
                    f"TracerWarning: {str(w.message).splitlines()[0]}"[:300],
                    rules_for(Fix.capture(BAKED)),
                )
            )
        hazards = _graph_hazards(onnx_path, name) if name.startswith("torch.onnx.export") else []
        attempts.extend(hazards)
        if not baked and not hazards:
            attempts.append(Attempt(name, ok=True))
    return attempts


SHAPE_ONLY = re.compile(r"\.shape\b|\.dim\(\)|\.size\(|\blen\(|\.ndim\b")
VALUE_READS = re.compile(r"\.(item|sum|any|all|max|min|mean|numel|tolist)\(")


def _shape_only(code: str) -> bool:
    """A line that decides on tensor shapes only (a heuristic on its text)."""
    return bool(SHAPE_ONLY.search(code)) and not VALUE_READS.search(code)


def _graph_hazards(path: Path, method: str) -> list[Attempt]:
    """Exported, but with ops an edge runtime cannot run statically: one row per op type."""
    import onnx

    model = onnx.load(str(path))
    counts = Counter(node.op_type for node in model.graph.node)
    found: dict[str, Attempt] = {}
    for node in model.graph.node:
        if node.op_type not in HAZARDS or node.op_type in found:
            continue
        cause, rules = HAZARDS[node.op_type], rules_for(Fix.op(node.op_type))
        meta = {p.key: p.value for p in node.metadata_props}
        trace = meta.get("pkg.torch.onnx.stack_trace", "")
        where = re.findall(r'File "([^"]+)", line (\d+)', trace)
        location = f"{where[-1][0]}:{where[-1][1]}" if where else ""
        code = trace.strip().splitlines()[-1].strip() if where else ""
        error = f"the exported graph contains {counts[node.op_type]} {node.op_type}"
        found[node.op_type] = Attempt(
            f"{method}: graph", False, cause, location, code, error, rules
        )
    return list(found.values())


def _user_files(module: Any) -> set[str]:
    files = set()
    for sub in module.modules():
        with contextlib.suppress(TypeError, OSError):
            path = inspect.getsourcefile(type(sub)) or ""
            if "site-packages" not in path and "/torch/" not in path:
                files.add(os.path.realpath(path))
    return files


def _diagnose(method: str, exc: BaseException, user_files: set[str]) -> Attempt:
    text = f"{type(exc).__name__}: {exc}"
    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    location, code = _user_location(exc, user_files)
    cause, rules = "unclassified failure", []
    for pattern, found in CAUSES:
        if re.search(pattern, code) or re.search(pattern, text, re.IGNORECASE | re.MULTILINE):
            cause, rules = CAPTURES[found], rules_for(Fix.capture(found))
            break
    return Attempt(
        method, False, cause, location, code, f"{type(exc).__name__}: {first}"[:300], rules
    )


def _user_location(exc: BaseException, user_files: set[str]) -> tuple[str, str]:
    """The last frame of the user's code in the traceback, or one named in the message."""
    frames = list(_frames(exc))
    for frame in reversed(frames):
        if os.path.realpath(frame.filename) in user_files:
            return f"{frame.filename}:{frame.lineno}", (frame.line or "").strip()
    for path, line in reversed(re.findall(r'File "([^"]+)", line (\d+)', str(exc))):
        if os.path.realpath(path) in user_files:
            return f"{path}:{line}", _source_line(path, int(line))
    return "", ""


def _frames(exc: BaseException) -> Iterator[traceback.FrameSummary]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield from traceback.extract_tb(current.__traceback__)
        current = current.__cause__ or current.__context__


def _source_line(path: str, line: int) -> str:
    with contextlib.suppress(OSError, IndexError):
        return Path(path).read_text(encoding="utf-8").splitlines()[line - 1].strip()
    return ""


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporters' own C-level and Python output while a probe runs."""
    import logging
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    level = logging.root.manager.disable
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        logging.disable(logging.CRITICAL)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            logging.disable(level)


def render_table(attempts: list[Attempt]) -> str:
    rows = [("method", "result", "cause", "where", "rules")]
    for a in attempts:
        if a.ok:
            rows.append((a.method, "ok", "", "", ""))
        else:
            rows.append(
                (
                    a.method,
                    "FAILED",
                    a.cause,
                    a.location or "(not in your code)",
                    ", ".join(a.rules),
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for a in attempts:
        if not a.ok:
            lines.append(f"\n{a.method}: {a.error}")
            if a.code:
                lines.append(f"  {a.location}: {a.code}")
    return "\n".join(lines)


def to_json(attempts: list[Attempt]) -> list[dict[str, Any]]:
    return [asdict(a) for a in attempts]


def explain_tensorflow(recipe: Any) -> list[Attempt]:
    """A TensorFlow source through both paths: TensorFlow's own TFLite converter (float32,
    builtins only: the TF ops it cannot lower, by node) and tf2onnx (the ops it cannot
    convert; then the ONNX graph's hazards), each with what would help."""
    from edgeflow.core.errors import EdgeflowError
    from edgeflow.frameworks import tensorflow as tfw
    from edgeflow.frameworks.tf2onnx import export_onnx
    from edgeflow.schema.signatures import fed_inputs
    from edgeflow.targets import _tf_native

    source = recipe.source
    model = tfw.load(source)
    problems = tfw.signature_problems(model, source.inputs)
    if problems:
        return [
            Attempt("signature", False, "the recipe's inputs", key, "", message, [])
            for key, message, _ in problems
        ]
    names = tfw.output_names(model, source.outputs)
    folder = Path(tempfile.mkdtemp())
    saved = folder / "saved_model"
    with _quiet():
        tfw.save_canonical(model, source.inputs, names, saved)
    attempts: list[Attempt] = []
    onnx_path = folder / "model.onnx"
    try:
        with _quiet():
            inputs = [s.name for s in fed_inputs(source.inputs)]
            export_onnx(saved, inputs, names, recipe.export.opset, onnx_path)
        onnx_ok = Attempt("tf2onnx (convert.via: onnx)", True)
    except EdgeflowError as exc:
        onnx_ok = Attempt(
            "tf2onnx (convert.via: onnx)",
            False,
            "TensorFlow ops without an ONNX conversion",
            error=exc.message,
        )
    tf = tfw.require()
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved), signature_keys=[tfw.SIGNATURE])
    try:
        with _quiet():
            _tf_native._run(converter, "none")
        attempts.append(Attempt("TFLiteConverter (convert.via: native)", True))
    except _tf_native.Unlowered as exc:
        nodes = ", ".join(f"{u.op} ({u.node})" if u.node else u.op for u in exc.found)
        attempts.append(
            Attempt(
                "TFLiteConverter (convert.via: native)",
                False,
                "TensorFlow ops without a TFLite builtin",
                nodes,
                "",
                exc.message,
                ["convert.via: onnx"] if onnx_ok.ok else [],
            )
        )
    except EdgeflowError as exc:
        attempts.append(
            Attempt(
                "TFLiteConverter (convert.via: native)",
                False,
                "converter error",
                "",
                "",
                exc.message,
                ["convert.via: onnx"] if onnx_ok.ok else [],
            )
        )
    attempts.append(onnx_ok)
    if onnx_ok.ok:
        attempts += _graph_hazards(onnx_path, "tf2onnx")
    return attempts
