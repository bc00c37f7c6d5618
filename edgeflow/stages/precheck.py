"""precheck: onnx.checker, strict shape inference and the target profile's basic limits."""

from __future__ import annotations

from collections import Counter
from typing import Any

from edgeflow.engine.stage import Stage, StageContext
from edgeflow.errors import EdgeflowError
from edgeflow.targets.profile import TargetProfile

CONTROL_FLOW = {"If", "Loop", "Scan"}


def check(model: Any, profile: TargetProfile) -> list[dict[str, Any]]:
    """Every problem found, as {operator, count, reason, nodes}; empty when the model fits."""
    import onnx

    findings: list[dict[str, Any]] = []

    def add(operator: str, reason: str, nodes: list[str]) -> None:
        findings.append(
            {"operator": operator, "count": len(nodes), "reason": reason, "nodes": nodes[:10]}
        )

    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as exc:
        add("(model)", f"onnx.checker: {str(exc).splitlines()[0]}", [])
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as exc:
        add("(model)", f"shape inference: {str(exc).splitlines()[0]}", [])
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not profile.opset.min <= opset <= profile.opset.max:
        add(
            "(model)",
            f"opset {opset} outside the target's {profile.opset.min}..{profile.opset.max}",
            [],
        )
    by_op: dict[str, list[str]] = {}
    for i, node in enumerate(model.graph.node):
        by_op.setdefault(node.op_type, []).append(node.name or f"#{i}")
    if profile.operators is not None:
        for op, nodes in sorted(by_op.items()):
            if op not in profile.operators:
                add(op, f"not supported by {profile.name}", nodes)
    if not profile.control_flow:
        for op in sorted(CONTROL_FLOW & by_op.keys()):
            add(op, "control flow is not supported by this target", by_op[op])
    if not profile.dynamic_shapes:
        dynamic = [
            i.name
            for i in model.graph.input
            if any(d.dim_param or d.dim_value <= 0 for d in i.type.tensor_type.shape.dim)
        ]
        if dynamic:
            add("(inputs)", "dynamic input shapes are not supported by this target", dynamic)
    return findings


def run(ctx: StageContext) -> None:
    import onnx

    model = onnx.load(str(ctx.inputs["onnx"]))
    findings = check(model, ctx.profile)
    ops = Counter(n.op_type for n in model.graph.node)
    ctx.write_json(
        "precheck",
        {
            "target": ctx.profile.name,
            "passed": not findings,
            "findings": findings,
            "ops": dict(ops),
        },
    )
    if findings:
        table = "\n".join(
            f"  {f['operator']}: {f['reason']} ({f['count']} nodes)" for f in findings
        )
        raise EdgeflowError(
            f"the model does not pass the {ctx.profile.name} precheck:\n{table}",
            "fix the model or choose another target; see docs/debugging.md",
        )


STAGE = Stage(
    name="precheck",
    description="Check the ONNX model against onnx.checker and the target profile.",
    run=run,
    consumes=("onnx",),
    produces={"precheck": "precheck.json"},
    reads=("target",),
    tools=("onnx",),
)
