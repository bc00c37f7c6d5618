"""optimize: onnxscript's optimizer (constant folding, cleanup) and named onnxoptimizer passes."""

from __future__ import annotations

from collections import Counter

from edgeflow.engine.stage import Stage, StageContext


def run(ctx: StageContext) -> None:
    import onnx
    import onnxoptimizer

    options = ctx.recipe.optimize
    model = onnx.load(str(ctx.inputs["onnx"]))
    before = Counter(n.op_type for n in model.graph.node)
    if options.onnxscript:
        import onnxscript.optimizer

        model = onnxscript.optimizer.optimize(model)
    if options.passes:
        model = onnxoptimizer.optimize(model, list(options.passes))
    onnx.checker.check_model(model)
    onnx.save(model, str(ctx.output("onnx")))
    after = Counter(n.op_type for n in model.graph.node)
    ctx.write_json(
        "optimize",
        {
            "onnxscript": options.onnxscript,
            "passes": list(options.passes),
            "nodes_before": sum(before.values()),
            "nodes_after": sum(after.values()),
            "ops_before": dict(before),
            "ops_after": dict(after),
        },
    )


STAGE = Stage(
    name="optimize",
    description="Clean the ONNX graph with onnxscript's optimizer and onnxoptimizer passes.",
    run=run,
    consumes=("onnx",),
    produces={"onnx": "model.onnx", "optimize": "optimize.json"},
    reads=("optimize",),
    tools=("onnx", "onnxscript", "onnxoptimizer", "onnx-ir"),
)
