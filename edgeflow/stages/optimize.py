"""optimize: onnxscript's optimizer (constant folding, cleanup) and named onnxoptimizer passes.

Each of the two steps is held to the rules' contract (edgeflow.rules.contract): its output must
compute what its input did on the declared inputs, or the stage fails and names the step.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from edgeflow.core.errors import StageFailed
from edgeflow.schema.sections import fed_inputs
from edgeflow.stages.base import Stage, StageContext

TOLERANCE = 1e-4  # constant folding reorders float arithmetic (e.g. BatchNorm into Conv)


def run(ctx: StageContext) -> None:
    import onnx
    import onnxoptimizer

    from edgeflow.rules import contract
    from edgeflow.rules.onnx.simplify import simplify

    options = ctx.recipe.optimize
    model = onnx.load(str(ctx.inputs["onnx"]))
    before = Counter(n.op_type for n in model.graph.node)
    feeds = contract.probes(list(fed_inputs(ctx.recipe.source.inputs)))
    outputs = contract.onnx_outputs(model, feeds)
    if options.onnxscript:
        model, outputs = _checked(
            "onnxscript's optimizer", simplify(model), outputs, feeds, "optimize.onnxscript: false"
        )
    if options.passes:
        passes = list(options.passes)
        model, outputs = _checked(
            f"onnxoptimizer passes {', '.join(passes)}",
            onnxoptimizer.optimize(model, passes),
            outputs,
            feeds,
            "remove the pass from optimize.passes",
        )
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
            "checked": outputs.error or f"outputs within {TOLERANCE:g} on the declared inputs",
        },
    )


def _checked(step: str, model: Any, before: Any, feeds: list[Any], off: str) -> tuple[Any, Any]:
    """The step's model and outputs, unless it changed what the model computes."""
    from edgeflow.rules import contract

    after = contract.onnx_outputs(model, feeds)
    problem = contract.difference(before, after, TOLERANCE)
    if problem:
        raise StageFailed(
            "optimize",
            f"{step} changed what the model computes: {problem}",
            f"set {off} in the recipe to skip it, and report the model to that tool",
        )
    return model, after


STAGE = Stage(
    name="optimize",
    description="Clean the ONNX graph with onnxscript's optimizer and onnxoptimizer passes.",
    run=run,
    consumes=("onnx",),
    produces={
        "onnx": "model.onnx",
        "float_onnx": "model.onnx",  # what quantize and convert start from (stages/diff.py)
        "optimize": "optimize.json",
    },
    reads=("optimize", "source.inputs"),
    tools=("onnx", "onnxscript", "onnxoptimizer", "onnx-ir", "onnxruntime"),
    isolated=True,
)
