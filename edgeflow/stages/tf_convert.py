"""tf_convert: the native path of a TensorFlow source; TensorFlow's own TFLite converter on
the canonical SavedModel, and the precheck of its builtins against the target profile.

The precheck of this path cannot run before the converter: TensorFlow decides which
builtins a Keras layer becomes. So the stage converts, checks the .tflite's builtins against
the builtins the profile measured (targets/*.yaml `builtins:`), writes precheck.json in the
table the ONNX path's precheck writes, and stops there when an error is found (unless
precheck.continue_on_failure), before the target's runtime first loads the file.
"""

from __future__ import annotations

from typing import Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.schema.sections import fed_inputs
from edgeflow.stages.base import Stage, StageContext
from edgeflow.stages.convert import RUNTIMES


def run(ctx: StageContext) -> None:
    from edgeflow.data import load_samples
    from edgeflow.stages.verify import read_reference
    from edgeflow.targets import backend, emitted
    from edgeflow.targets._tf_native import NativeJob, Unlowered
    from edgeflow.targets.precheck import check_builtins, errors, render_table, to_json

    recipe, profile = ctx.recipe, ctx.profile
    module = backend(profile)
    if not hasattr(module, "convert_native"):
        raise AssertionError(f"the {profile.backend} backend has no native TensorFlow path")
    _, names = read_reference(ctx.inputs["reference"], recipe.source.outputs)
    artifact_dir = ctx.output("artifact")
    artifact_dir.mkdir()
    calibration = None
    if recipe.quantization.mode == "int8":
        calibration = load_samples(recipe.calibration, recipe.source.inputs, "calibration")
    job = NativeJob(
        saved_model=ctx.inputs["saved_model"],
        out_dir=artifact_dir,
        profile=profile,
        quantization=profile.quantization_for(recipe.quantization),
        inputs=list(fed_inputs(recipe.source.inputs)),
        output_names=names,
        calibration=calibration,
    )
    q = recipe.quantization

    def precheck(counts: dict[str, int], unlowered: list[Any]) -> None:
        """precheck.json from the converter's builtins (or the TF ops it could not lower)."""
        from edgeflow.targets.findings import Finding

        findings = []
        for op in sorted({u.op for u in unlowered}):
            found = [u for u in unlowered if u.op == op]
            findings.append(
                Finding(
                    operator=f"tf.{op}",
                    reason="TensorFlow op without a TFLite builtin (would need Select TF ops, "
                    "which this runtime cannot run)",
                    nodes=[u.node for u in found if u.node],
                    count=len(found),
                    rule="(convert.via: onnx)",
                )
            )
        findings += check_builtins(counts, profile, q.mode, q.activations, "(convert.via: onnx)")
        table = to_json(findings)
        passed = not errors(table)
        ctx.write(
            "precheck",
            {
                "target": profile.name,
                "passed": passed,
                "findings": table,
                "memory": None,
                "ops": counts,
                "path": "native: the builtins TensorFlow's converter wrote",
            },
        )
        if passed:
            if table:
                ctx.warn(f"precheck warnings for {profile.name}:\n{render_table(table)}")
            return
        summary = (
            f"the converted model does not pass the {profile.name} precheck:\n{render_table(table)}"
        )
        if recipe.precheck.continue_on_failure and not unlowered:
            ctx.warn(f"{summary}\ncontinuing because the recipe sets precheck.continue_on_failure")
            return
        raise EdgeflowError(
            summary,
            "set convert.via: onnx (tf2onnx, then the ONNX rules that replace operators), "
            "choose another target, or set precheck.continue_on_failure: true to let the "
            "runtime try",
        )

    try:
        info = module.convert_native(
            job, lambda artifact: precheck(emitted.counts(artifact, profile.name), [])
        )
    except Unlowered as exc:
        precheck({}, exc.found)
        raise
    if recipe.quantization.mode == "int8":
        imposed = {k: v for k, v in profile.int8.items() if getattr(recipe.quantization, k) != v}
        info["imposed_by_target"] = imposed
    info["target"] = profile.name
    info["size_bytes"] = (artifact_dir / info["artifact"]).stat().st_size
    ctx.write("convert", info)


STAGE = Stage(
    name="tf_convert",
    description="Convert the TensorFlow SavedModel with TensorFlow's own TFLite converter; "
    "check its builtins against the target.",
    run=run,
    consumes=("saved_model", "reference"),
    produces={"artifact": "artifact", "convert": "convert.json", "precheck": "precheck.json"},
    reads=(
        "target",
        "quantization",
        "calibration",
        "precheck",
        "source.inputs",
        "source.outputs",
    ),
    tools=("tensorflow", *RUNTIMES),
    isolated=True,
)
