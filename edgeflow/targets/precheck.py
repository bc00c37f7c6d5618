"""Check an ONNX model against a target profile before any converter runs.

Every problem is reported, never only the first: one finding per operator (or model-level
issue) with its count, the reason, the nodes, and the edgeflow rule that would remove it: one
that declares it fixes the finding (`fixes`, see edgeflow.rules.fixes).
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from dataclasses import asdict
from typing import Any

from edgeflow.rules import builtin_rules, rules_fixing
from edgeflow.rules.entries import entry, options_for
from edgeflow.rules.fixes import Fix
from edgeflow.targets import placement
from edgeflow.targets.findings import (
    DTYPE_FINDINGS,
    Finding,
    GraphFacts,
    graph_initializers,
    graph_values,
    model_finding,
    named_nodes,
)
from edgeflow.targets.profile import TargetProfile

CONTROL_FLOW = ("If", "Loop", "Scan")
FLOAT, DOUBLE, FLOAT16 = 1, 11, 10  # onnx.TensorProto data types


def check(
    model: Any, profile: TargetProfile, quantization: str = "none", source: str = "onnx"
) -> list[Finding]:
    """Every way the model does not fit the profile when built in this quantization mode;
    empty when it fits. A finding's suggested onnx rule is one that, applied to this model,
    removes it without bringing a new error (`_confirm`). `source`: the recipe's source kind
    (an ONNX file checked on its own is "onnx"); a rule that rewrites PyTorch code before
    export (ast, fx) is suggested for a pytorch source only, where a recipe can take it."""
    findings = _check(model, profile, quantization)
    _confirm(model, findings, profile, quantization)
    if source != "pytorch":
        rules = builtin_rules()
        for finding in findings:
            if finding.rule in rules and rules[finding.rule].level != "onnx":
                finding.rule, finding.options = "", {}
    return findings


def _confirm(
    model: Any, findings: list[Finding], profile: TargetProfile, quantization: str
) -> None:
    """Try each error's candidate onnx rules on a copy of the model, in catalogue order, and
    keep the first that removes it and adds no error of its own; where none does, say which
    were tried and suggest a source (ast, fx) rule that declares it, if any. A rule that
    cannot run on the model as it is (one that needs the recipe's input shapes) stays
    suggested: it cannot be judged here."""
    before = {(f.operator, f.reason) for f in findings if _judged(f)}
    after: dict[str, set[tuple[str, str]] | None] = {}

    def errors_after(rule: type[Any], options: dict[str, Any]) -> set[tuple[str, str]] | None:
        key = entry(rule.name, options)
        if key not in after:
            rewritten = _applied(rule, model, options)
            if rewritten is None:
                after[key] = None
            else:
                found = _check(rewritten, profile, quantization)
                after[key] = {(f.operator, f.reason) for f in found if _judged(f)}
        return after[key]

    for finding in findings:
        # each onnx rule that declares it, with the options its entry would give (None: the
        # user's to choose, so it is neither tried nor suggested)
        candidates: dict[type[Any], dict[str, Any] | None] = {}
        for fix in finding.fixes:
            for r in rules_fixing(fix):
                if r.level == "onnx" and r not in candidates:
                    given = finding.options if r.name == finding.rule else None
                    candidates[r] = options_for(r, fix, given)
        if not _judged(finding) or finding.rule not in {r.name for r in candidates}:
            continue  # a warning, a recipe setting, or a rule of another level
        # a rule whose output breaks a build in this mode is not tried (rule.breaks)
        tried = [
            f"{r.name} (breaks {quantization} builds)"
            for r in candidates
            if quantization in r.breaks
        ]
        for rule, options in candidates.items():
            if quantization in rule.breaks or options is None:
                continue
            left = errors_after(rule, options)
            if left is None:  # could not be applied here: keep the suggestion unjudged
                break
            if (finding.operator, finding.reason) not in left and left <= before:
                finding.rule, finding.options = rule.name, options
                break
            tried.append(rule.name)
        else:  # a source rule (ast, fx) cannot be tried on the ONNX model: it stays offered
            others = [
                (r.name, options)
                for f in finding.fixes
                for r in rules_fixing(f)
                if r.level != "onnx" and (options := options_for(r, f)) is not None
            ]
            finding.rule, finding.options = others[0] if others else ("", {})
            finding.tried = tried


def _judged(finding: Finding) -> bool:
    """Whether a rule is suggested for the finding only where it removes it from the model."""
    return finding.severity == "error" or finding.confirm


def _applied(rule: type[Any], model: Any, options: dict[str, Any]) -> Any | None:
    """The model rewritten by the rule with these options (the others at their defaults), or
    None where it cannot be applied as it is (an exception: say, it needs the recipe's static
    input shapes, or options the finding does not give)."""
    import copy

    from edgeflow.rules.base import RewriteContext

    try:
        specs = _input_specs(model)
        opts = rule.Options.model_validate(options)
        return rule().apply(copy.deepcopy(model), opts, RewriteContext(specs)).model
    except Exception:  # the rule's own verdict on an unusual model is not the precheck's
        return None


def _input_specs(model: Any) -> list[Any]:
    """The graph's inputs as the recipe would declare them (static shapes only)."""
    import onnx

    from edgeflow.schema.sections import TensorSpec

    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        t = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name
        shape = [d.dim_value for d in t.shape.dim]
        specs.append(
            TensorSpec.model_validate({"name": value.name, "shape": shape, "dtype": dtype})
        )
    return specs


def _check(model: Any, profile: TargetProfile, quantization: str = "none") -> list[Finding]:
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
        nearest = min(max(opset, profile.opset.min), profile.opset.max)
        findings.append(model_finding("opset", reason, count=1, options={"opset": nearest}))
    by_op: dict[str, list[str]] = {}
    for name, node in named_nodes(model.graph):
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        by_op.setdefault(key, []).append(name)
    facts = GraphFacts.of(inferred)  # once: it reads every constant of the graph
    if profile.operators is not None:
        findings += _operator_findings(inferred, profile, quantization, facts)
    if placement.applies(profile, quantization):
        findings += placement.findings(model, profile, facts)
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
    names = [t.name for t in graph_initializers(model.graph) if t.data_type == dtype]
    for value in graph_values(model.graph):
        if value.type.tensor_type.elem_type == dtype:
            names.append(value.name)
    return sorted(set(names))


def _operator_findings(
    model: Any, profile: TargetProfile, quantization: str, facts: GraphFacts
) -> list[Finding]:
    """Per node of a shape-inferred model: is the op supported, in this version, for this
    input type and quantization mode, and do its attributes and inputs pass the profile's
    named checkers?"""
    import onnx

    from edgeflow.targets.checkers import CHECKERS

    assert profile.operators is not None
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    groups: dict[tuple[str, str], Finding] = {}

    def add(
        op: str,
        key: str,
        reason: str,
        at: str,
        fix: Fix | None = None,
        severity: str = "error",
        options: dict[str, Any] | None = None,
        fixes: list[Fix] | None = None,
    ) -> None:
        finding = groups.get((op, key))
        if finding is None:
            # the rule that removes this finding, else one that removes the operator
            if fixes is None:
                fixes = [*([fix] if fix else []), Fix.op(op)]
            finding = groups[op, key] = Finding(
                op, reason, severity=severity, fixes=fixes, options=options or {}
            )
            if not fixes:  # nothing to fix: what the build itself does
                finding.rule, finding.options = "", {}
        finding.nodes.append(at)
        finding.count = len(finding.nodes)

    for name, node in facts.nodes:
        domain = node.domain or "ai.onnx"
        op = node.op_type if domain == "ai.onnx" else f"{node.domain}.{node.op_type}"
        if op == "Constant":
            # A value, not a kernel: ONNX Runtime makes it an initializer when it loads the
            # model, edgeflow hands onnx2tf initializers (targets/_onnx2tf.py), TensorRT folds it.
            continue
        spec = profile.operators.get(op)
        probed = profile.family.operators_from in ("probes", "compiler")
        if spec is None and probed and op not in probed_ops():
            why = (
                f"not measured for {profile.name}: no probe graph has it, so its list cannot "
                "say (precheck.continue_on_failure: true lets the converter try)"
            )
            add(op, "unmeasured", why, name)
            continue
        if spec is None:
            add(op, "", f"not supported by {profile.name}", name)
            continue
        if spec.quantization is not None and quantization not in spec.quantization:
            modes = ", ".join(spec.quantization)
            why = f"not supported in quantization mode {quantization} (only {modes})"
            add(op, "quantization", why, name)
        if quantization == "int8" and spec.kept_float:  # what the build does: no rule
            why = f"int8: {spec.kept_float}"
            add(op, "kept float", why, name, severity="warning", fixes=[])
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
                # onnx.convert_opset moves the default domain, to an opset with a kernel
                opset = None
                if domain == "ai.onnx":
                    current = opsets.get(domain, 0)
                    opset = _kernel_opset(op, spec.kernels, profile.opset, current)
                if opset is None:
                    add(op, "version", why, name)
                else:
                    add(op, "version", why, name, Fix.finding("opset"), options={"opset": opset})
                continue
            if all(k.dtypes is not None for k in kernels):
                dtypes = sorted({d for k in kernels for d in k.dtypes or []})
        dtype = facts.types.get(node.input[0]) if node.input and node.input[0] else None
        if dtypes is not None and dtype is not None:
            type_name = onnx.TensorProto.DataType.Name(dtype).lower()
            fallback = profile.dtype_fallbacks.get(type_name)
            if type_name not in dtypes and fallback not in dtypes:
                why = f"no kernel for {type_name} inputs (takes {', '.join(dtypes)})"
                typed = DTYPE_FINDINGS.get(type_name)
                add(op, f"dtype {type_name}", why, name, Fix.finding(typed) if typed else None)
        for check in spec.checks:
            problem = CHECKERS[check](facts.node(node))
            if problem is not None:
                add(op, check, f"{check}: {problem}", name, Fix.check(op, check))
        # an int8 kernel's trap that the build avoids, where the node's float tensors are int8
        traps = profile.int8_warnings.get(op, {}) if quantization == "int8" else {}
        for check, why in traps.items() if dtype in (None, FLOAT) else ():
            problem = CHECKERS[check](facts.node(node))
            if problem is not None:
                add(op, check, f"int8: {problem}: {why}", name, severity="warning")
    return list(groups.values())


@functools.cache
def probed_ops() -> frozenset[str]:
    """The operators the probe graphs (edgeflow.targets.probes) exercise: what the measured
    operator lists of the TFLite family can speak for."""
    from edgeflow.targets.probes import probes

    return frozenset(c.op or c.model.graph.node[0].op_type for c in probes())


def _kernel_opset(op: str, kernels: list[Any], opsets: Any, current: int) -> int | None:
    """The opset nearest the model's own (`current`; the lower one of two as near), within
    the profile's range, at which the default-domain `op` resolves to a version one of its
    kernels has (None: none does)."""
    for opset in sorted(range(opsets.min, opsets.max + 1), key=lambda o: (abs(o - current), o)):
        since = _schema_version(op, opset, "")
        if since is not None and any(k.since <= since <= (k.until or since) for k in kernels):
            return opset
    return None


def _schema_version(op: str, opset: int, domain: str) -> int | None:
    """since_version of the schema a node of this opset resolves to; None when unknown."""
    import onnx

    try:
        return int(onnx.defs.get_schema(op, opset, domain).since_version)
    except onnx.defs.SchemaError:
        return None


def _tensors_above_rank(model: Any, rank: int) -> list[str]:
    """Tensors of a shape-inferred model above `rank`."""
    names = [v.name for v in graph_values(model.graph) if len(v.type.tensor_type.shape.dim) > rank]
    names += [t.name for t in graph_initializers(model.graph) if len(t.dims) > rank]
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

    tflite = profile.family.tflite
    est = estimate(model, quantization, tflite is not None and tflite.arena, inferred)
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
    if est.unknown:  # the arena is a lower bound: say so, never "arena 0 B"
        shown = ", ".join(est.unknown[:3]) + (", ..." if len(est.unknown) > 3 else "")
        reason = (
            f"the arena is not known: {len(est.unknown)} tensors have no static size "
            f"({shown}); {est.arena_bytes:,} B is what the others take"
        )
        findings.append(model_finding("memory", reason, est.unknown, severity="warning", count=1))
    smaller = "quantization.mode: int8" if quantization != "int8" else ""
    bigger = _boards_that_fit(profile, name, est.arena_bytes, est.weights_bytes)
    if limits and limits.ram_bytes and est.arena_bytes > limits.ram_bytes:
        reason = (
            f"needs a {est.arena_bytes:,}-byte arena (activations peak at {est.peak_node}); "
            f"board {name} has {limits.ram_bytes:,} bytes of RAM{bigger}"
        )
        findings.append(model_finding("ram", reason, count=1, rule=smaller))
    if limits and limits.flash_bytes and est.weights_bytes > limits.flash_bytes:
        reason = (
            f"{est.weights_bytes:,} bytes of weights at {quantization}; board {name} has "
            f"{limits.flash_bytes:,} bytes of flash{bigger}"
        )
        findings.append(model_finding("flash", reason, count=1, rule=smaller))
    return summary, findings


def _boards_that_fit(profile: TargetProfile, chosen: str | None, arena: int, weights: int) -> str:
    """ "; it fits <board> (precheck.board: ...)" for the profile's boards with room for both
    the arena and the weights, smallest first, or that none has room."""
    fits = [
        (b.ram_bytes or 0, board)
        for board, b in profile.boards.items()
        if board != chosen
        and (b.ram_bytes is None or b.ram_bytes >= arena)
        and (b.flash_bytes is None or b.flash_bytes >= weights)
    ]
    if fits:
        names = [board for _, board in sorted(fits)]
        return f"; it fits {', '.join(names)} (precheck.board: {names[0]})"
    sized = [(b.ram_bytes, board) for board, b in profile.boards.items() if b.ram_bytes]
    if not sized:
        return ""
    ram, largest = max(sized)
    return f"; no board of {profile.name} has room (the largest, {largest}, has {ram:,} B)"


def errors(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings that fail the precheck (warnings do not)."""
    return [f for f in findings if f.get("severity", "error") == "error"]


def op_counts(model: Any) -> dict[str, int]:
    return dict(Counter(n.op_type for _, n in named_nodes(model.graph)))


def to_json(findings: list[Finding]) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in asdict(f).items() if k not in ("fixes", "confirm")}
        | {"nodes": f.nodes[:20]}
        for f in findings
    ]


def render_table(findings: list[dict[str, Any]]) -> str:
    """The findings as a Markdown table: Operator | Count | Reason | Nodes | Suggested rule."""
    lines = ["| Operator | Count | Reason | Nodes | Suggested rule |", "|---|---|---|---|---|"]
    for f in findings:
        nodes = ", ".join(f["nodes"][:5]) + (", ..." if len(f["nodes"]) > 5 else "")
        rule = f"`{entry(f['rule'], f.get('options') or {})}`" if f["rule"] else ""
        if f.get("tried"):  # rules that declare it and did not remove it from this model
            rule += f" ({', '.join(f['tried'])} tried: leaves it or adds an error)"
        severity = f.get("severity", "error")  # warning, or a report's passed check
        reason = f["reason"] if severity == "error" else f"({severity}) {f['reason']}"
        lines.append(f"| {f['operator']} | {f['count']} | {reason} | {nodes} | {rule} |")
    return "\n".join(lines)


def check_builtins(
    counts: dict[str, int],
    profile: TargetProfile,
    mode: str,
    activations: str = "int8",
    remedy: str = "",
) -> list[Finding]:
    """A .tflite's operators (targets/emitted.py: a builtin, with an option where it has one
    that matters) against those the profile measured in this mode: one measured to fail is
    an error, one no probe had is a warning (verify runs it). An operator whose option no
    probe had is judged by its builtin. fp16 runs the float kernels (weights dequantized),
    int8_weights the float ones too (hybrid: int8 weights, float activations; a DEQUANTIZE
    where one has no hybrid form); 16x8 was not measured, so nothing in it is more than a
    warning. `remedy`: the table's suggestion for an operator measured to fail (the native
    path's "(convert.via: onnx)"; none on the ONNX path, whose rules the precheck of the ONNX
    graph suggested)."""
    from edgeflow.targets._tflite_traps import float_kernels
    from edgeflow.targets.emitted import base

    if not profile.builtins:
        return []
    measured = profile.builtins.get("int8" if mode == "int8" else "none")
    if measured is None:
        return []
    # an int8 build runs the builtins without an int8 kernel float (_tflite_traps; not 16x8)
    eight = mode == "int8" and activations != "int16"
    floats = float_kernels(profile.builtins) if eight else frozenset()
    judged: dict[str, int] = {}
    for name, count in counts.items():
        if name not in measured.runs and name not in measured.fails:
            name = base(name)
        judged[name] = judged.get(name, 0) + count
    sixteen = mode == "int8" and activations == "int16"
    findings = []
    for name, count in sorted(judged.items()):
        dequantized = mode in ("fp16", "int8_weights") and name == "DEQUANTIZE"
        if name in measured.runs or name in floats or dequantized:
            continue
        why = measured.fails.get(name)
        if name.startswith("CUSTOM:") and why is None:
            why = "a custom (or Select TF) operator, which this runtime does not register"
        where = f"{profile.name} {'16x8' if sixteen else mode}"
        findings.append(
            Finding(
                operator=name,
                reason=(
                    f"measured to fail on {where}: {why}"
                    if why is not None
                    else f"not measured on {where}: no probe artifact had it"
                ),
                count=count,
                rule=remedy if why is not None else "",
                severity="error" if why is not None and not sixteen else "warning",
                fixes=[Fix.op(name)],
            )
        )
    return findings
