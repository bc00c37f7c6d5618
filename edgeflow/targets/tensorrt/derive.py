"""tensorrt's operator list: TensorRT cannot run here, so it comes from the published support
matrix, onnx/onnx-tensorrt's docs/operators.md (give the file; nothing is downloaded): the
supported operators with their types, the opset range of its header, and the restrictions
that a named checker encodes (the others are kept as the operator's `note`, unchecked).

    python -m edgeflow.targets.derive tensorrt --operators-md operators.md [--write]
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from edgeflow.targets.derive import MARKER

TRT_TYPES = {
    "FP32": "float", "FP16": "float16", "BF16": "bfloat16", "DOUBLE": "double",
    "INT32": "int32", "INT64": "int64", "INT8": "int8", "INT4": "int4",
    "FP8": "float8e4m3fn", "BOOL": "bool", "UINT8": "uint8",
}  # fmt: skip
# Restriction text in operators.md -> the checker that encodes it.
TRT_CHECKERS = {
    "`axes` must be an initializer": "constant_axes",
    "zero_point` must be 0": "zero_point_zero",
    "zero_point` must be zero": "zero_point_zero",
}


def tensorrt_operators(markdown: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """(the header sentence on versions, {op: {dtypes, checks, note}}) from operators.md."""
    header = next(
        (line.strip() for line in markdown.splitlines() if "supports operators" in line), ""
    ).split(". ")[0]
    ops: dict[str, dict[str, Any]] = {}
    in_table = False
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == "Operator":
            in_table = True
            continue
        if not in_table or not line.startswith("|") or set(cells[0]) <= {"-", ":"}:
            continue
        if len(cells) < 2 or cells[1] != "Y":
            continue
        dtypes = (
            sorted({TRT_TYPES[t.strip()] for t in cells[2].split(",") if t.strip() in TRT_TYPES})
            if len(cells) > 2
            else []
        )
        restriction = cells[3].replace("<br />", " ").strip() if len(cells) > 3 else ""
        checks = sorted({c for text, c in TRT_CHECKERS.items() if text in restriction})
        unchecked = restriction
        for text in TRT_CHECKERS:  # what a checker encodes is no longer a note
            unchecked = re.sub(rf"[^.]*{re.escape(text)}[^.]*\.?", "", unchecked)
        note = unchecked.strip(" .")
        ops[cells[0]] = {"dtypes": dtypes or None, "checks": checks, "note": note}
    return header, ops


def render_tensorrt(header: str, ops: dict[str, dict[str, Any]], source: str) -> str:
    lines = [
        f"{MARKER} tensorrt --operators-md FILE --write`: do not edit below ---",
        f"# {source}: {header}",
        f"# {len(ops)} supported operators; dtypes are the matrix's supported types.",
        "operators:",
    ]
    for op, spec in ops.items():
        parts = []
        if spec["dtypes"]:
            parts.append(f"dtypes: [{', '.join(spec['dtypes'])}]")
        if spec["checks"]:
            parts.append(f"checks: [{', '.join(spec['checks'])}]")
        if spec.get("kept_float"):
            parts.append(f"kept_float: {json.dumps(spec['kept_float'])}")
        if spec["note"]:
            parts.append(f"note: {json.dumps(spec['note'])}")
        lines.append(f"  {op}: {{{', '.join(parts)}}}")
    return "\n".join(lines) + "\n"


def section(args: argparse.Namespace) -> str:
    """The profile's generated operators section, from --operators-md."""
    header, ops = tensorrt_operators(args.operators_md.read_text(encoding="utf-8"))
    return render_tensorrt(header, ops, args.source)
