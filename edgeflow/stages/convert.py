"""convert: the target backend turns the ONNX model into its artifact (in a worker process)."""

from __future__ import annotations

import json

from edgeflow.engine.stage import Stage, StageContext


def run(ctx: StageContext) -> None:
    from edgeflow.targets import backend

    artifact_dir = ctx.output("artifact")
    artifact_dir.mkdir()
    info = backend(ctx.profile).convert(ctx.inputs["onnx"], artifact_dir)
    info["target"] = ctx.profile.name
    info["size_bytes"] = (artifact_dir / info["artifact"]).stat().st_size
    ctx.output("convert").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


STAGE = Stage(
    name="convert",
    description="Convert the ONNX model to the target's artifact with the target's own tool.",
    run=run,
    consumes=("onnx",),
    produces={"artifact": "artifact", "convert": "convert.json"},
    reads=("target",),
    tools=("onnx", "onnxruntime"),
    code=("edgeflow.targets", "edgeflow.targets.onnxruntime_micro"),
    isolated=True,
)
