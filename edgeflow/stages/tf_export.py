"""tf_export: the ONNX path of a TensorFlow source; the canonical SavedModel to ONNX with
tf2onnx, and what that step changed (the ONNX model in onnxruntime against the TensorFlow
reference on the evaluation split)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from edgeflow.stages.base import Stage, StageContext


def run(ctx: StageContext) -> None:
    from edgeflow.frameworks.tf2onnx import export_onnx
    from edgeflow.schema.signatures import fed_inputs
    from edgeflow.stages.verify import read_reference

    source = ctx.recipe.source
    reference, names = read_reference(ctx.inputs["reference"], source.outputs)
    inputs = [s.name for s in fed_inputs(source.inputs)]
    path = ctx.output("onnx")
    info = export_onnx(ctx.inputs["saved_model"], inputs, names, ctx.recipe.export.opset, path)
    record_export(ctx, {**info, "exporter": "tf2onnx"}, reference, names)


def record_export(
    ctx: StageContext, info: dict[str, Any], reference: list[Any], names: list[str]
) -> None:
    """export.json for an exported ONNX model, with the error the export added (the ONNX model
    in onnxruntime against the source's reference on the evaluation split), and the ONNX
    model's outputs (onnx_reference.npz: verify measures the next step against them)."""
    import numpy as np
    import onnx

    from edgeflow.data import load_samples
    from edgeflow.schema.signatures import fed_inputs
    from edgeflow.verify.compare import step_errors
    from edgeflow.verify.runners import BatchAxes, OnnxRunner, batching, run_all
    from edgeflow.verify.stream import run_stream

    source = ctx.recipe.source
    path = ctx.output("onnx")
    model = onnx.load(str(path))
    runner = OnnxRunner.checking(str(path))
    samples = load_samples(ctx.recipe.evaluation, source.inputs, "evaluation", source.state)
    axes = BatchAxes.of(ctx.recipe.evaluation.outputs, names)  # as the reference: batch-first
    if source.state:
        outputs = run_stream(runner, samples, source, names, axes).outputs
    else:
        outputs = run_all(runner, samples, *batching(source), "reference outputs", axes)
    np.savez(ctx.output("onnx_reference"), *outputs, names=np.array(names))
    ctx.write_json(
        "export",
        {
            **info,
            "inputs": [s.name for s in fed_inputs(source.inputs)],
            "outputs": names,
            "nodes": len(model.graph.node),
            "ops": dict(Counter(n.op_type for n in model.graph.node)),
            # the error this step added: the ONNX model against the source model
            "error_vs_source": step_errors(reference, outputs, names),
        },
    )


STAGE = Stage(
    name="tf_export",
    description="Convert the TensorFlow SavedModel to ONNX with tf2onnx; measure what it changed.",
    run=run,
    consumes=("saved_model", "reference"),
    produces={
        "onnx": "model.onnx",
        "export": "export.json",
        "onnx_reference": "onnx_reference.npz",
    },
    reads=(
        "source.inputs",
        "source.outputs",
        "source.state",
        "source.dynamic_batch",
        "export.opset",
        "evaluation",
    ),
    tools=("tensorflow", "tf2onnx", "onnx", "onnxruntime"),
    isolated=True,
)
