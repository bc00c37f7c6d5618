"""onnxruntime_micro's operator list, from onnxruntime itself: the kernels it registers for
its CPU execution provider (`get_all_opkernel_def()`), one entry per op and version range, with
the types its kernel takes for the op's first input (the type constraint that input uses in
the op's schema, from `get_all_operator_schema()`). A reduced ("minimal") build contains a
subset of exactly these kernels, chosen from the model itself.

    python -m edgeflow.targets.derive onnxruntime_micro [--write]
"""

from __future__ import annotations

import argparse

from edgeflow.targets.derive import MARKER

OPEN_ENDED = 2**31 - 1
# Ops with no kernel that onnxruntime resolves when it loads the model.
LOADER_OPS = ("Constant",)  # turned into initializers
DOMAINS = {"": "", "ai.onnx": "", "com.microsoft": "com.microsoft", "ai.onnx.ml": "ai.onnx.ml"}


Span = tuple[int, int | None, list[str] | None, bool]  # since, until, dtypes, expanded


def onnxruntime_kernels() -> dict[str, list[Span]]:
    """{op key: [(since, until, first-input dtypes, expanded), ...]} for the CPU execution
    provider. Default-domain ops that have no kernel for a version but an ONNX function body
    are run by expanding the body: they are listed with expanded=True."""
    import onnxruntime.capi.onnxruntime_pybind11_state as ort

    first_input: dict[tuple[str, str, int], str] = {}
    for schema in ort.get_all_operator_schema():
        if schema.inputs:
            first_input[(schema.domain, schema.name, schema.since_version)] = schema.inputs[
                0
            ].typeStr
    merged: dict[str, dict[tuple[int, int | None], set[str] | None]] = {}
    for kernel in ort.get_all_opkernel_def():
        if kernel.provider != "CPUExecutionProvider" or kernel.domain not in DOMAINS:
            continue
        domain = DOMAINS[kernel.domain]
        key = f"{domain}.{kernel.op_name}" if domain else kernel.op_name
        start, end = kernel.version_range
        span = (int(start), None if end >= OPEN_ENDED else int(end))
        constraint = first_input.get((kernel.domain, kernel.op_name, int(start)))
        types = kernel.type_constraints.get(constraint) if constraint else None
        ranges = merged.setdefault(key, {})
        if types is None:
            ranges[span] = None  # no schema or a fixed-type input: not restricted
        elif span not in ranges or ranges[span] is not None:
            # Sequences, maps and optionals are not element types of a tensor input.
            names = {t[7:-1] for t in types if t.startswith("tensor(")}
            ranges[span] = (ranges.get(span) or set()) | names
    result: dict[str, list[Span]] = {
        key: [(s, u, sorted(d) if d is not None else None, False) for (s, u), d in r.items()]
        for key, r in merged.items()
    }
    for op in LOADER_OPS:
        result[op] = [(1, None, None, False)]
    for op, spans in _function_versions().items():
        for since, until in spans:
            kernels = result.get(op, [])
            if not any(k[0] <= since <= (k[1] or since) for k in kernels if not k[3]):
                result.setdefault(op, []).append((since, until, None, True))
    return {key: sorted(spans, key=lambda s: s[0]) for key, spans in sorted(result.items())}


def _function_versions() -> dict[str, list[tuple[int, int | None]]]:
    """Default-domain schema versions that define an ONNX function body."""
    import onnx

    versions: dict[str, list[tuple[int, bool]]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain in ("", "ai.onnx"):
            body = any(  # attributes missing from onnx's type stubs
                getattr(schema, a) for a in ("has_function", "has_context_dependent_function")
            )
            versions.setdefault(schema.name, []).append((schema.since_version, body))
    spans: dict[str, list[tuple[int, int | None]]] = {}
    for op, found in versions.items():
        found.sort()
        for i, (since, body) in enumerate(found):
            if body:
                until = found[i + 1][0] - 1 if i + 1 < len(found) else None
                spans.setdefault(op, []).append((since, until))
    return spans


def render(kernels: dict[str, list[Span]]) -> str:
    import onnxruntime

    lines = [
        f"{MARKER} onnxruntime_micro --write`: do not edit below ---",
        f"# onnxruntime {onnxruntime.__version__}, CPUExecutionProvider kernel registrations:",
        f"# {len(kernels)} operators; dtypes are those of the first input; expanded: no kernel,",
        "# ORT runs the op's ONNX function body (its ops need kernels of their own).",
        "operators:",
    ]
    for key, spans in kernels.items():
        lines.append(f"  {key}:")
        lines.append("    kernels:")
        for since, until, dtypes, expanded in spans:
            parts = [f"since: {since}"]
            if until is not None:
                parts.append(f"until: {until}")
            if dtypes is not None:
                parts.append(f"dtypes: [{', '.join(dtypes)}]")
            if expanded:
                parts.append("expanded: true")
            lines.append(f"      - {{{', '.join(parts)}}}")
    return "\n".join(lines) + "\n"


def section(args: argparse.Namespace) -> str:
    """The profile's generated operators section."""
    return render(onnxruntime_kernels())
