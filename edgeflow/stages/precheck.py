"""precheck: the model against onnx.checker, shape inference and the target profile.

With `rewrites: auto`, the onnx.* rules that the precheck proves remove a finding without
adding one are applied first (edgeflow.targets.auto_rewrites; rewrite_auto.json says which),
and the verdict is on their result. The stage passes the model on (rewritten, or as it came),
so that quantize and convert start from what was checked.

Every finding is written to precheck.json and the report. A failed precheck stops the run
before conversion unless the recipe sets `precheck.continue_on_failure`.
"""

from __future__ import annotations

import shutil
from typing import Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.stages.base import Stage, StageContext


def run(ctx: StageContext) -> None:
    import onnx

    from edgeflow.targets.memory import with_shapes
    from edgeflow.targets.placement import predict
    from edgeflow.targets.precheck import (
        check,
        check_memory,
        errors,
        op_counts,
        render_table,
        to_json,
    )

    model = onnx.load(str(ctx.inputs["onnx"]))
    q, board = ctx.recipe.quantization, ctx.recipe.precheck.board
    mode = q.mode
    model, chosen = _auto_rewrites(ctx, model, mode)
    if ctx.recipe.rewrites_auto:
        onnx.save(model, str(ctx.output("onnx")))
    else:  # passed on byte for byte
        shutil.copyfile(ctx.inputs["onnx"], ctx.output("onnx"))
    sized = "int16_act" if mode == "int8" and q.activations == "int16" else mode
    shaped = with_shapes(model)  # once for the estimate and the table
    memory, too_big = check_memory(shaped, ctx.profile, sized, board, inferred=True)
    _write_layers(ctx, shaped, sized)
    # a source rule (ast, fx) is suggested where the recipe can take it: a pytorch source
    findings = to_json(check(model, ctx.profile, mode, ctx.recipe.source.kind) + too_big)
    passed = not errors(findings)
    ctx.write(
        "precheck",
        {
            "target": ctx.profile.name,
            "passed": passed,
            "findings": findings,
            "memory": memory,
            "ops": op_counts(model),
            "npu": predict(shaped, ctx.profile, mode),
        },
    )
    if passed:
        if findings:
            ctx.warn(f"precheck warnings for {ctx.profile.name}:\n{render_table(findings)}")
        return
    summary = f"the model does not pass the {ctx.profile.name} precheck:\n{render_table(findings)}"
    if ctx.recipe.rewrites_auto:
        summary += f"\nafter the auto rewrites: {chosen or 'none (no rule removes a finding)'}"
    summary += _why_onnx(ctx)
    if ctx.recipe.precheck.continue_on_failure:
        ctx.warn(f"{summary}\ncontinuing because the recipe sets precheck.continue_on_failure")
        return
    raise EdgeflowError(
        summary,
        "apply the suggested rules in the recipe's rewrites: (`rewrites: auto` applies those "
        "that remove a finding; +rewrites=[auto] on the command line), choose another target, "
        "or set "
        "precheck.continue_on_failure: true in the recipe (precheck.continue_on_failure=true "
        "on the command line) to let the converter try",
    )


def _why_onnx(ctx: StageContext) -> str:
    """For a TensorFlow source on the ONNX path because its int8 settings need it (convert.via
    unset): which settings, and what TensorFlow's own converter would build instead."""
    from edgeflow.schema.source import onnx_only_settings

    recipe = ctx.recipe
    if recipe.source.kind != "tensorflow" or recipe.convert.via is not None:
        return ""
    needs = onnx_only_settings(recipe.quantization)
    if not needs or not ctx.profile.family.tensorflow_native:
        return ""
    return (
        f"\nthis TensorFlow model takes the ONNX path (tf2onnx) because {' and '.join(needs)} "
        f"{'runs' if len(needs) == 1 else 'run'} only there; TensorFlow's own converter "
        "(convert.via: native) builds it without them"
    )


def _auto_rewrites(ctx: StageContext, model: Any, mode: str) -> tuple[Any, str]:
    """The model with `rewrites: auto`'s rules applied, each with its contract checked as a
    recipe's rule is (rewrite_auto.json: the rules chosen, what each removed, what is left),
    and them in one line."""
    from edgeflow.rules.apply import apply_rules
    from edgeflow.rules.base import RewriteContext, RuleSpec
    from edgeflow.schema.sections import fed_inputs
    from edgeflow.targets.auto_rewrites import search

    if not ctx.recipe.rewrites_auto:
        ctx.write_json("rewrite_auto", {"auto": False, "chosen": []})
        return model, ""
    rewrite_ctx = RewriteContext(list(fed_inputs(ctx.recipe.source.inputs)), ctx.loaded.path.parent)
    records: list[dict[str, Any]] = []

    def apply(spec: RuleSpec, current: Any) -> Any:
        rewritten, done, _ = apply_rules(current, [spec], ("onnx",), rewrite_ctx)
        records.extend(done)
        return rewritten

    own = frozenset(spec.name for spec in ctx.recipe.rewrites)
    model, found = search(model, ctx.profile, mode, apply, own)
    ctx.write_json("rewrite_auto", {"auto": True, **found.record(), "rules": records})
    return model, ", ".join(step.entry for step in found.steps)


def _write_layers(ctx: StageContext, model: object, quantization: str) -> None:
    """layers.csv: the memory estimate per layer (a DVC plot: where the arena peaks); the
    model comes with its shapes inferred."""
    from edgeflow.targets.memory import layers

    rows = layers(model, quantization, inferred=True)
    columns = ("layer", "node", "op", "output_bytes", "alive_bytes", "weight_bytes")
    lines = [",".join(columns)]
    lines += [",".join(str(row[c]).replace(",", ";") for c in columns) for row in rows]
    ctx.output("layers").write_text("\n".join(lines) + "\n", encoding="utf-8")


STAGE = Stage(
    name="precheck",
    description="Check the ONNX model against onnx.checker and the target profile.",
    run=run,
    consumes=("onnx",),
    produces={
        "precheck": "precheck.json",
        "layers": "layers.csv",
        "rewrite_auto": "rewrite_auto.json",
        # the model checked: with `rewrites: auto` rewritten, else as it came (a copy)
        "onnx": "model.onnx",
        "float_onnx": "model.onnx",
        "source_onnx": "model.onnx",
    },
    reads=(
        "target",
        "precheck",
        "quantization.mode",
        "quantization.activations",
        "rewrites",
        "rewrites_auto",
        "source.inputs",
        "source.kind",
    ),
    tools=("onnx", "onnxscript", "onnxoptimizer", "onnx-ir", "onnxruntime"),
    rule_levels=("onnx",),
    isolated=True,
)
