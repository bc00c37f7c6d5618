"""convert: the target backend turns the ONNX model into its artifact (in a worker process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeflow.schema.sections import FALLBACK_READS, fed_inputs
from edgeflow.schema.source import kept_layout
from edgeflow.stages.base import BACKEND_TOOLS, Stage, StageContext

# The target's converter and runtime (Backend.tools), onnxruntime (the source model's
# reference outputs, and the QDQ models of the quantize stage), and whether this CPU's int8
# kernels saturate (the same int8 model computes other figures: core/host.py).
RUNTIMES = ("onnxruntime", "host:int8", BACKEND_TOOLS)


def run(ctx: StageContext) -> None:
    from edgeflow import postprocess
    from edgeflow.core import islands
    from edgeflow.targets import backend
    from edgeflow.targets.base import ConvertJob
    from edgeflow.verify.stream import load_steps

    module = backend(ctx.profile)
    recipe = ctx.recipe
    artifact_dir = ctx.output("artifact")
    artifact_dir.mkdir()
    calibration, budget = None, None
    itself = ctx.profile.family.quantizes_itself
    if itself and recipe.quantization.mode == "int8":
        calibration = load_steps(
            recipe.calibration, recipe.source, "calibration", ctx.inputs["onnx"]
        )
        if recipe.quantization.fallback == "auto":
            import onnx

            from edgeflow.verify.fallback import Budget

            model = onnx.load(str(ctx.inputs["onnx"]), load_external_data=False)
            names = [o.name for o in model.graph.output]
            budget, note = Budget.of(recipe, names, calibration.labels is not None)
            if note:
                ctx.warn(note)
    findings: list[dict[str, Any]] = []  # the converted model's operators (judge)
    quantization = ctx.profile.quantization_for(recipe.quantization)
    found = islands.recorded(ctx.inputs.get("rewrite_target")) if itself else []
    job = ConvertJob(
        onnx=ctx.inputs["onnx"],
        out_dir=artifact_dir,
        profile=ctx.profile,
        quantization=quantization,
        inputs=list(fed_inputs(recipe.source.inputs)),
        calibration=calibration,
        budget=budget,
        kept_layout=kept_layout(recipe.source),
        check=lambda artifact: judge(ctx, artifact, findings),
        keep_float=tuple(ctx.profile.keep_float(quantization, found)),
        float_islands=tuple(found),
    )
    info = module.convert(job)
    if ctx.profile.builtins:
        info["emitted"] = findings
    if recipe.quantization.mode == "int8":
        imposed = {
            k: v for k, v in ctx.profile.int8.items() if getattr(recipe.quantization, k) != v
        }
        info["imposed_by_target"] = imposed
    info["target"] = ctx.profile.name
    info["size_bytes"] = (artifact_dir / info.get("deployed", info["artifact"])).stat().st_size
    tail = ctx.inputs["host"] / postprocess.HOST_MODEL if "host" in ctx.inputs else None
    if tail is not None and tail.is_file():  # postprocess.cut: the tail runs on the host
        info["host"] = postprocess.write_host(tail, artifact_dir, info["artifact"])
        info["files"] = [*info["files"], *info["host"]["files"]]
    ctx.write("convert", info)


def judge(ctx: StageContext, artifact: Path, found: list[dict[str, Any]]) -> None:
    """The operators the converter wrote (a .tflite's, with the options that matter) against
    those the target's probes measured, before the target's runtime loads the file: the
    findings go to `found` (convert.json `emitted`); an error stops the build unless the
    recipe sets precheck.continue_on_failure."""
    from edgeflow.core.errors import EdgeflowError
    from edgeflow.targets import emitted
    from edgeflow.targets.precheck import check_builtins, errors, render_table, to_json

    profile, q = ctx.profile, ctx.recipe.quantization
    if not profile.builtins:
        return
    table = to_json(
        check_builtins(emitted.counts(artifact, profile.name), profile, q.mode, q.activations)
    )
    found[:] = table
    if not table:
        return
    if not errors(table):
        ctx.warn(f"the converted model's operators, on {profile.name}:\n{render_table(table)}")
        return
    summary = (
        f"the converter wrote operators the {profile.name} runtime was measured not to take "
        f"(the precheck of the ONNX graph did not foresee them):\n{render_table(table)}"
    )
    if ctx.recipe.precheck.continue_on_failure:
        ctx.warn(f"{summary}\ncontinuing because the recipe sets precheck.continue_on_failure")
        return
    raise EdgeflowError(
        summary,
        "a rewrite rule that keeps the graph from becoming these operators (see "
        "docs/debugging.md, 'The converter wrote an operator the runtime lacks'), another "
        "target, or precheck.continue_on_failure: true to let the runtime try",
    )


STAGE = Stage(
    name="convert",
    description="Convert the ONNX model to the target's artifact with the target's own tool.",
    run=run,
    consumes=("onnx",),
    # the float islands found before the target's rewrites (quantization.keep_float)
    optional=("host", "rewrite_target"),
    produces={"artifact": "artifact", "convert": "convert.json"},
    reads=(
        "target",
        "quantization",
        "calibration",
        "source.kind",  # a channel-last source keeps its layout (kept_layout)
        "source.inputs",
        "source.state",
        "source.dynamic_batch",  # a stateful model's calibration sequences run in batches
        "precheck",  # continue_on_failure: the converted model's operators (judge)
        *FALLBACK_READS,
    ),
    tools=("onnx", *RUNTIMES),
    isolated=True,
)
