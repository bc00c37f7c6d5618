"""precheck: the model against onnx.checker, shape inference and the target profile.

Every finding is written to precheck.json and the report. A failed precheck stops the run
before conversion unless the recipe sets `precheck.continue_on_failure`.
"""

from __future__ import annotations

from edgeflow.core.errors import EdgeflowError
from edgeflow.stages.base import Stage, StageContext


def run(ctx: StageContext) -> None:
    import onnx

    from edgeflow.targets.memory import with_shapes
    from edgeflow.targets.precheck import (
        check,
        check_memory,
        errors,
        op_counts,
        render_table,
        to_json,
    )

    model = onnx.load(str(ctx.inputs["onnx"]))
    q, board = ctx.recipe.quantization, ctx.recipe.precheck.board
    mode = q.mode
    sized = "int16_act" if mode == "int8" and q.activations == "int16" else mode
    shaped = with_shapes(model)  # once for the estimate and the table
    memory, too_big = check_memory(shaped, ctx.profile, sized, board, inferred=True)
    _write_layers(ctx, shaped, sized)
    # a source rule (ast, fx) is suggested where the recipe can take it: a pytorch source
    findings = to_json(check(model, ctx.profile, mode, ctx.recipe.source.kind) + too_big)
    passed = not errors(findings)
    ctx.write_json(
        "precheck",
        {
            "target": ctx.profile.name,
            "passed": passed,
            "findings": findings,
            "memory": memory,
            "ops": op_counts(model),
        },
    )
    if passed:
        if findings:
            ctx.warn(f"precheck warnings for {ctx.profile.name}:\n{render_table(findings)}")
        return
    summary = f"the model does not pass the {ctx.profile.name} precheck:\n{render_table(findings)}"
    if ctx.recipe.precheck.continue_on_failure:
        ctx.warn(f"{summary}\ncontinuing because the recipe sets precheck.continue_on_failure")
        return
    raise EdgeflowError(
        summary,
        "apply the suggested rules in the recipe's rewrites:, choose another target, or set "
        "precheck.continue_on_failure: true in the recipe (precheck.continue_on_failure=true "
        "on the command line) to let the converter try",
    )


def _write_layers(ctx: StageContext, model: object, quantization: str) -> None:
    """layers.csv: the memory estimate per layer (a DVC plot: where the arena peaks); the
    model comes with its shapes inferred."""
    from edgeflow.targets.memory import layers

    rows = layers(model, quantization, inferred=True)
    columns = ("layer", "node", "op", "output_bytes", "alive_bytes", "weight_bytes")
    lines = [",".join(columns)]
    lines += [",".join(str(row[c]).replace(",", ";") for c in columns) for row in rows]
    ctx.output("layers").write_text("\n".join(lines) + "\n", encoding="utf-8")


STAGE = Stage(
    name="precheck",
    description="Check the ONNX model against onnx.checker and the target profile.",
    run=run,
    consumes=("onnx",),
    produces={"precheck": "precheck.json", "layers": "layers.csv"},
    reads=("target", "precheck", "quantization.mode", "quantization.activations", "source.kind"),
    tools=("onnx",),
    isolated=True,
)
