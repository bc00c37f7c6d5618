"""jax_export: the JAX function to ONNX with jax2onnx, and what that step changed (the ONNX
model in onnxruntime against the JAX reference on the evaluation split)."""

from __future__ import annotations

from edgeflow.stages.base import Stage, StageContext
from edgeflow.stages.tf_export import record_export


def run(ctx: StageContext) -> None:
    from edgeflow.frameworks import jax as jaxw
    from edgeflow.schema.signatures import fed_inputs
    from edgeflow.stages.verify import read_reference

    source = ctx.recipe.source
    reference, names = read_reference(ctx.inputs["reference"], source.outputs)
    model = jaxw.load_source(source)
    inputs = [(s.name, list(s.shape), s.dtype) for s in fed_inputs(source.inputs)]
    info = jaxw.export_onnx(model, inputs, names, ctx.recipe.export.opset, ctx.output("onnx"))
    record_export(ctx, {**info, "exporter": "jax2onnx"}, reference, names)


STAGE = Stage(
    name="jax_export",
    description="Export the JAX function to ONNX with jax2onnx; measure what it changed.",
    run=run,
    consumes=("reference",),
    produces={
        "onnx": "model.onnx",
        "export": "export.json",
        "onnx_reference": "onnx_reference.npz",
    },
    reads=("source", "export.opset", "evaluation"),
    tools=("jax", "jaxlib", "flax", "jax2onnx", "onnx", "onnxruntime"),
    isolated=True,
)
