"""ingest: the head of the ONNX pipeline; check the source file and record its outputs."""

from __future__ import annotations

import shutil

from edgeflow.engine.stage import Stage, StageContext
from edgeflow.errors import EdgeflowError
from edgeflow.stages.load import save_reference


def run(ctx: StageContext) -> None:
    import onnxruntime as ort

    from edgeflow.data import load_samples
    from edgeflow.verify.runners import OnnxRunner, batching, run_all

    source = ctx.recipe.source
    path = ctx.inputs["onnx"]
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise EdgeflowError(f"onnxruntime cannot load {path.name}: {exc}") from exc
    declared = {s.name for s in source.inputs}
    actual = {i.name for i in session.get_inputs()}
    if declared != actual:
        raise EdgeflowError(
            f"source.inputs names {sorted(declared)} but {path.name} has inputs {sorted(actual)}",
            "name source.inputs after the model's graph inputs",
        )
    samples = load_samples(ctx.recipe.evaluation, source.inputs, "evaluation")
    outputs = run_all(OnnxRunner(session), samples, *batching(source))
    shutil.copyfile(path, ctx.output("onnx"))
    save_reference(ctx, outputs, path.name, len(samples))


STAGE = Stage(
    name="ingest",
    description="Load the source ONNX model and record its reference outputs in onnxruntime.",
    run=run,
    consumes=("onnx",),
    produces={"onnx": "model.onnx", "reference": "reference.npz", "source": "source.json"},
    reads=("source.inputs", "source.dynamic_batch", "evaluation"),
    tools=("onnxruntime", "numpy"),
)
