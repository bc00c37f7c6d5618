"""Check an ONNX model against a target profile before any converter runs.

Every problem is reported, never only the first: one finding per operator (or model-level
issue) with its count, the reason, the nodes, and the edgeflow rule that would remove it: one
that declares it fixes the finding (`fixes`, see edgeflow.rules.fixes).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from edgeflow.rules import rules_fixing
from edgeflow.rules.fixes import FINDINGS, Fix
from edgeflow.targets.profile import TargetProfile

CONTROL_FLOW = ("If", "Loop", "Scan")
# What a finding suggests when no rule removes it: a recipe setting.
SETTINGS = {"float16": "quantization.mode: none"}
DOUBLE, FLOAT16 = 11, 10  # onnx.TensorProto data types
# An operator's input type without a kernel, by its onnx name, as a finding rules declare.
DTYPE_FINDINGS = {"double": "float64", "int64": "int64"}


@dataclass
class Finding:
    operator: str
    reason: str
    nodes: list[str] = field(default_factory=list)
    count: int = 0
    rule: str = ""
    # error: the target cannot take this; warning: it runs, but was measured inaccurate in
    # some graphs (verify will tell), so it does not fail the precheck
    severity: str = "error"

    def __post_init__(self) -> None:
        self.count = self.count or len(self.nodes) or 1
        self.rule = self.rule or suggest(Fix.op(self.operator))


def model_finding(
    key: str, reason: str, nodes: list[str] | None = None, rule: str = "", **kw: Any
) -> Finding:
    """A finding about the model rather than one operator: "(float64)" for FINDINGS' float64,
    with the rule that declares it fixes it (or the recipe setting that avoids it)."""
    assert key in FINDINGS, key
    rule = rule or suggest(Fix.finding(key)) or SETTINGS.get(key, "")
    return Finding(f"({key})", reason, nodes or [], rule=rule, **kw)


def suggest(*fixes: Fix) -> str:
    """The rule to suggest for a finding: for the first of `fixes` that a built-in rule
    declares, the first onnx rule in catalogue order that does (it applies to the very model
    checked), else the first of another level."""
    for fix in fixes:
        rules = rules_fixing(fix)
        if rules:
            return next((r for r in rules if r.level == "onnx"), rules[0]).name
    return ""


def check(model: Any, profile: TargetProfile, quantization: str = "none") -> list[Finding]:
    """Every way the model does not fit the profile when built in this quantization mode;
    empty when it fits."""
    import onnx

    findings: list[Finding] = []
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # ValidationError, or InferenceError from the full check
        findings.append(model_finding("model", f"onnx.checker: {str(exc).splitlines()[0]}"))
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as exc:  # onnx raises several types; each is a finding, not a crash
        findings.append(model_finding("model", f"shape inference: {str(exc).splitlines()[0]}"))
    inferred = model  # shapes and types of intermediates, for the checks below; once
    with contextlib.suppress(Exception):  # a failure is the finding above: go on without
        inferred = onnx.shape_inference.infer_shapes(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not profile.opset.min <= opset <= profile.opset.max:
        reason = f"opset {opset} is outside the target's {profile.opset.min}..{profile.opset.max}"
        findings.append(model_finding("opset", reason, count=1))
    by_op: dict[str, list[str]] = {}
    for i, node in enumerate(model.graph.node):
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        by_op.setdefault(key, []).append(node.name or f"#{i}")
    if profile.operators is not None:
        findings += _operator_findings(inferred, profile, quantization)
    if not profile.control_flow:
        for op in CONTROL_FLOW:
            if op in by_op and (profile.operators is None or op in profile.operators):
                findings.append(Finding(op, "control flow is not supported", by_op[op]))
    if profile.max_rank is not None:
        deep = _tensors_above_rank(inferred, profile.max_rank)
        if deep:
            reason = f"tensors of rank above {profile.max_rank}, the most its kernels take"
            findings.append(model_finding("rank", reason, deep))
    if not profile.dynamic_shapes:
        dynamic = [i.name for i in model.graph.input if _is_dynamic(i)]
        if dynamic:
            reason = "dynamic input shapes are not supported"
            findings.append(model_finding("inputs", reason, dynamic))
    for dtype, key, allowed in (
        (DOUBLE, "float64", profile.float64),
        (FLOAT16, "float16", profile.float16),
    ):
        names = [] if allowed else _tensors_of_type(inferred, dtype)
        if names:
            findings.append(model_finding(key, f"{key} tensors are not supported", names))
    return findings


def _is_dynamic(value: Any) -> bool:
    return any(d.dim_param or d.dim_value <= 0 for d in value.type.tensor_type.shape.dim)


def _tensors_of_type(model: Any, dtype: int) -> list[str]:
    """Initializers, graph values and (shape-inferred) intermediates of `dtype`."""
    graph = model.graph
    names = [t.name for t in graph.initializer if t.data_type == dtype]
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.tensor_type.elem_type == dtype:
            names.append(value.name)
    return sorted(set(names))


def _operator_findings(model: Any, profile: TargetProfile, quantization: str) -> list[Finding]:
    """Per node of a shape-inferred model: is the op supported, in this version, for this
    input type and quantization mode, and do its attributes and inputs pass the profile's
    named checkers?"""
    import onnx
    from onnx import numpy_helper

    from edgeflow.targets.checkers import CHECKERS, Node

    assert profile.operators is not None
    graph = model.graph
    types: dict[str, int] = {t.name: t.data_type for t in graph.initializer}
    ranks: dict[str, int] = {t.name: len(t.dims) for t in graph.initializer}
    for value in (*graph.input, *graph.output, *graph.value_info):
        t = value.type.tensor_type
        if t.elem_type:
            types[value.name] = t.elem_type
        if t.HasField("shape"):
            ranks[value.name] = len(t.shape.dim)
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    groups: dict[tuple[str, str], Finding] = {}

    def add(
        op: str, key: str, reason: str, at: str, fix: Fix | None = None, severity: str = "error"
    ) -> None:
        finding = groups.get((op, key))
        if finding is None:
            # the rule that removes this finding, else one that removes the operator
            rule = suggest(*([fix] if fix else []), Fix.op(op))
            finding = groups[op, key] = Finding(op, reason, rule=rule, severity=severity)
        finding.nodes.append(at)
        finding.count = len(finding.nodes)

    for i, node in enumerate(graph.node):
        name = node.name or f"#{i}"
        domain = node.domain or "ai.onnx"
        op = node.op_type if domain == "ai.onnx" else f"{node.domain}.{node.op_type}"
        if op == "Constant":
            # A value, not a kernel: ONNX Runtime makes it an initializer when it loads the
            # model, edgeflow hands onnx2tf initializers (targets/_onnx2tf.py), TensorRT folds it.
            continue
        spec = profile.operators.get(op)
        if spec is None:
            add(op, "", f"not supported by {profile.name}", name)
            continue
        if spec.quantization is not None and quantization not in spec.quantization:
            modes = ", ".join(spec.quantization)
            why = f"not supported in quantization mode {quantization} (only {modes})"
            add(op, "quantization", why, name)
        if quantization in spec.inaccurate:
            why = f"{quantization} may be inaccurate: {spec.inaccurate[quantization]}"
            add(op, "inaccurate", why, name, severity="warning")
        since = _schema_version(node.op_type, opsets.get(domain, 0), node.domain)
        dtypes = spec.dtypes
        if spec.kernels is not None and since is not None:
            kernels = [k for k in spec.kernels if k.since <= since <= (k.until or since)]
            if not kernels:
                have = ", ".join(f"{k.since}-{k.until or ''}" for k in spec.kernels)
                why = f"no kernel for version {since} of {op} (has versions {have})"
                add(op, "version", why, name, Fix.finding("opset"))
                continue
            if all(k.dtypes is not None for k in kernels):
                dtypes = sorted({d for k in kernels for d in k.dtypes or []})
        dtype = types.get(node.input[0]) if node.input and node.input[0] else None
        if dtypes is not None and dtype is not None:
            type_name = onnx.TensorProto.DataType.Name(dtype).lower()
            fallback = profile.dtype_fallbacks.get(type_name)
            if type_name not in dtypes and fallback not in dtypes:
                why = f"no kernel for {type_name} inputs (takes {', '.join(dtypes)})"
                typed = DTYPE_FINDINGS.get(type_name)
                add(op, f"dtype {type_name}", why, name, Fix.finding(typed) if typed else None)
        for check in spec.checks:
            problem = CHECKERS[check](Node(node, constants, ranks))
            if problem is not None:
                add(op, check, f"{check}: {problem}", name, Fix.check(op, check))
    return list(groups.values())


def _schema_version(op: str, opset: int, domain: str) -> int | None:
    """since_version of the schema a node of this opset resolves to; None when unknown."""
    import onnx

    try:
        return int(onnx.defs.get_schema(op, opset, domain).since_version)
    except onnx.defs.SchemaError:
        return None


def _tensors_above_rank(model: Any, rank: int) -> list[str]:
    """Tensors of a shape-inferred model above `rank`."""
    graph = model.graph
    values = (*graph.input, *graph.output, *graph.value_info)
    names = [v.name for v in values if len(v.type.tensor_type.shape.dim) > rank]
    names += [t.name for t in graph.initializer if len(t.dims) > rank]
    return sorted(set(names))


def check_memory(
    model: Any,
    profile: TargetProfile,
    quantization: str = "none",
    board: str | None = None,
    inferred: bool = False,
) -> tuple[dict[str, Any], list[Finding]]:
    """The memory estimate (see edgeflow.targets.memory) against the board's budgets."""
    from edgeflow.targets.memory import estimate

    est = estimate(model, quantization, profile.backend, inferred)
    chosen = profile.board(board)
    name, limits = chosen if chosen else (None, None)
    summary: dict[str, Any] = {
        "quantization": quantization,
        "weights_bytes": est.weights_bytes,
        "activations_bytes": est.activations_bytes,
        "overhead_bytes": est.overhead_bytes,
        "arena_bytes": est.arena_bytes,
        "peak_node": est.peak_node,
        "unknown_sizes": est.unknown[:20],
        "board": name,
        "ram_bytes": limits.ram_bytes if limits else None,
        "flash_bytes": limits.flash_bytes if limits else None,
    }
    findings = []
    smaller = "quantization.mode: int8" if quantization != "int8" else ""
    if limits and limits.ram_bytes and est.arena_bytes > limits.ram_bytes:
        reason = (
            f"needs a {est.arena_bytes:,}-byte arena (activations peak at {est.peak_node}); "
            f"board {name} has {limits.ram_bytes:,} bytes of RAM"
        )
        findings.append(model_finding("ram", reason, count=1, rule=smaller))
    if limits and limits.flash_bytes and est.weights_bytes > limits.flash_bytes:
        reason = (
            f"{est.weights_bytes:,} bytes of weights at {quantization}; board {name} has "
            f"{limits.flash_bytes:,} bytes of flash"
        )
        findings.append(model_finding("flash", reason, count=1, rule=smaller))
    return summary, findings


def errors(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings that fail the precheck (warnings do not)."""
    return [f for f in findings if f.get("severity", "error") == "error"]


def op_counts(model: Any) -> dict[str, int]:
    return dict(Counter(n.op_type for n in model.graph.node))


def to_json(findings: list[Finding]) -> list[dict[str, Any]]:
    return [{**asdict(f), "nodes": f.nodes[:20]} for f in findings]


def render_table(findings: list[dict[str, Any]]) -> str:
    """The findings as a Markdown table: Operator | Count | Reason | Nodes | Suggested rule."""
    lines = ["| Operator | Count | Reason | Nodes | Suggested rule |", "|---|---|---|---|---|"]
    for f in findings:
        nodes = ", ".join(f["nodes"][:5]) + (", ..." if len(f["nodes"]) > 5 else "")
        rule = f"`{f['rule']}`" if f["rule"] else ""
        reason = f"(warning) {f['reason']}" if f.get("severity") == "warning" else f["reason"]
        lines.append(f"| {f['operator']} | {f['count']} | {reason} | {nodes} | {rule} |")
    return "\n".join(lines)


def memory_line(memory: dict[str, Any]) -> str:
    """The memory estimate in one line, with the board's budgets."""
    text = (
        f"memory at {memory['quantization']}: weights {memory['weights_bytes']:,} B, "
        f"arena {memory['arena_bytes']:,} B (activations {memory['activations_bytes']:,} B, "
        f"peak at {memory['peak_node']})"
    )
    if memory["board"]:
        ram, flash = (
            f"{memory[k]:,} B" if memory[k] else "unlimited" for k in ("ram_bytes", "flash_bytes")
        )
        text += f"; board {memory['board']}: RAM {ram}, flash {flash}"
    return text
