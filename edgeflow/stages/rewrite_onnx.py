"""rewrite_onnx: apply the recipe's onnx.* rules to the ONNX model, in order."""

from __future__ import annotations

from edgeflow.engine.stage import Stage, StageContext


def run(ctx: StageContext) -> None:
    import onnx

    from edgeflow.rules.apply import apply_rules
    from edgeflow.rules.base import RewriteContext

    model = onnx.load(str(ctx.inputs["onnx"]))
    rewrite_ctx = RewriteContext(list(ctx.recipe.source.inputs), ctx.loaded.path.parent)
    model, records, _ = apply_rules(model, list(ctx.recipe.rewrites), ("onnx",), rewrite_ctx)
    onnx.checker.check_model(model)
    onnx.save(model, str(ctx.output("onnx")))
    ctx.write_json("rewrite_onnx", {"rules": records})


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
