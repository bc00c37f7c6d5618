"""rewrite_onnx: apply the recipe's onnx.* rules to the ONNX model, in order."""

from __future__ import annotations

import json
from typing import Any

from edgeflow.schema.sections import fed_inputs
from edgeflow.stages.base import Stage, StageContext


def run(ctx: StageContext) -> None:
    import onnx

    model, records = rewritten(ctx, list(ctx.recipe.rewrites))
    info: dict[str, Any] = {"rules": records}
    host = ctx.output("host")
    host.mkdir()
    if ctx.recipe.postprocess is not None:
        model, info["postprocess"] = split_host(ctx, model)
    onnx.save(model, str(ctx.output("onnx")))
    # Never an empty folder: DVC does not restore one (a `dvc exp run` then lacks the input).
    (host / "host.json").write_text(json.dumps(info.get("postprocess"), indent=2) + "\n")
    ctx.write_json("rewrite_onnx", info)


def split_host(ctx: StageContext, model: Any) -> tuple[Any, dict[str, Any]]:
    """postprocess.cut: (the head, the target's part; what the host gets). The tail goes to
    the "host" folder, checked in ONNX Runtime to compute what the whole graph did."""
    import numpy as np
    import onnx

    from edgeflow import postprocess

    head, tail = postprocess.split(model, list(ctx.recipe.postprocess.cut))
    rng = np.random.default_rng(0)
    feeds = {
        spec.name: rng.standard_normal(spec.shape).astype(spec.dtype)
        for spec in fed_inputs(ctx.recipe.source.inputs)
    }
    postprocess.check_split(model, head, tail, feeds)
    onnx.save(tail, str(ctx.output("host") / postprocess.HOST_MODEL))
    return head, {**postprocess.summary(tail), "head_nodes": len(head.graph.node)}


def rewrite(ctx: StageContext, specs: list[Any]) -> list[dict[str, Any]]:
    """Apply onnx.* rule specs to the stage's input model, write the checked result to its
    "onnx" output, and return what each rule did (for the report)."""
    import onnx

    model, records = rewritten(ctx, specs)
    onnx.save(model, str(ctx.output("onnx")))
    return records


def rewritten(ctx: StageContext, specs: list[Any]) -> tuple[Any, list[dict[str, Any]]]:
    """The stage's input model with onnx.* rule specs applied and checked, and what each
    rule did (for the report)."""
    import onnx

    from edgeflow.rules.apply import apply_rules
    from edgeflow.rules.base import RewriteContext

    model = onnx.load(str(ctx.inputs["onnx"]))
    inputs = list(fed_inputs(ctx.recipe.source.inputs))
    rewrite_ctx = RewriteContext(inputs, ctx.loaded.path.parent)
    model, records, _ = apply_rules(model, specs, ("onnx",), rewrite_ctx)
    onnx.checker.check_model(model)
    return model, records


STAGE = Stage(
    name="rewrite_onnx",
    description="Apply onnx.* rules to the ONNX model.",
    run=run,
    consumes=("onnx",),
    produces={
        "onnx": "model.onnx",
        "source_onnx": "model.onnx",  # the diff's source side, until rewrite_target's
        "host": "host",
        "rewrite_onnx": "rewrite_onnx.json",
    },
    reads=("rewrites", "postprocess", "source.inputs"),
    tools=("onnx", "onnxscript", "onnxoptimizer", "onnx-ir", "onnxruntime"),
    rule_levels=("onnx",),
    isolated=True,
)
