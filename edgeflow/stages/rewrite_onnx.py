"""rewrite_onnx: apply the recipe's onnx.* rules to the ONNX model, in order."""

from __future__ import annotations

from typing import Any

from edgeflow.engine.stage import Stage, StageContext


def run(ctx: StageContext) -> None:
    records = rewrite(ctx, list(ctx.recipe.rewrites))
    ctx.write_json("rewrite_onnx", {"rules": records})


def rewrite(ctx: StageContext, specs: list[Any]) -> list[dict[str, Any]]:
    """Apply onnx.* rule specs to the stage's input model, write the checked result to its
    "onnx" output, and return what each rule did (for the report)."""
    import onnx

    from edgeflow.rules.apply import apply_rules
    from edgeflow.rules.base import RewriteContext

    model = onnx.load(str(ctx.inputs["onnx"]))
    rewrite_ctx = RewriteContext(list(ctx.recipe.source.inputs), ctx.loaded.path.parent)
    model, records, _ = apply_rules(model, specs, ("onnx",), rewrite_ctx)
    onnx.checker.check_model(model)
    onnx.save(model, str(ctx.output("onnx")))
    return records


STAGE = Stage(
    name="rewrite_onnx",
    description="Apply onnx.* rules to the ONNX model.",
    run=run,
    consumes=("onnx",),
    produces={"onnx": "model.onnx", "rewrite_onnx": "rewrite_onnx.json"},
    reads=("rewrites", "source.inputs"),
    tools=("onnx", "onnxscript", "onnxoptimizer", "onnx-ir"),
    code=("edgeflow.rules.apply", "edgeflow.rules.base"),
)
