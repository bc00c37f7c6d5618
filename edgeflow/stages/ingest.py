"""ingest: the head of the ONNX pipeline; check the source file and record its outputs."""

from __future__ import annotations

import shutil

from edgeflow.core.errors import EdgeflowError, first_line
from edgeflow.stages.base import Stage, StageContext
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
    declared = {s.name: s for s in source.inputs}
    actual = {i.name: i for i in session.get_inputs()}
    if set(declared) != set(actual):
        raise EdgeflowError(
            f"source.inputs names {sorted(declared)} but {path.name} has inputs {sorted(actual)}",
            "name source.inputs after the model's graph inputs",
        )
    if not session.get_outputs():
        raise EdgeflowError(f"{path.name} has no graph outputs", "export the model again")
    for name, spec in declared.items():
        fixed = actual[name].shape
        clash = len(fixed) != len(spec.shape) or any(
            isinstance(d, int) and d > 0 and d != want
            for d, want in zip(fixed, spec.shape, strict=False)
        )
        if clash:
            raise EdgeflowError(
                f"source.inputs declares {name} as {spec.shape}, but {path.name} has it as {fixed}",
                "declare the model's own input shape (symbolic dims may take any size)",
            )
    samples = load_samples(ctx.recipe.evaluation, source.inputs, "evaluation")
    try:
        outputs = run_all(OnnxRunner(session), samples, *batching(source))
    except Exception as exc:  # onnxruntime's errors are not typed: the model fails on the data
        raise EdgeflowError(
            f"onnxruntime cannot run {path.name} on the evaluation samples: {first_line(exc)}",
            "check source.inputs (shapes, dtypes) against the model's inputs",
        ) from exc
    shutil.copyfile(path, ctx.output("onnx"))
    names = [o.name for o in session.get_outputs()]
    save_reference(ctx, outputs, path.name, len(samples), names)


STAGE = Stage(
    name="ingest",
    description="Load the source ONNX model and record its reference outputs in onnxruntime.",
    run=run,
    consumes=("onnx",),
    produces={"onnx": "model.onnx", "reference": "reference.npz", "source": "source.json"},
    reads=("source.inputs", "source.dynamic_batch", "evaluation"),
    tools=("onnxruntime", "numpy"),
    isolated=True,
)
