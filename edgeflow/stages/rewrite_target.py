"""rewrite_target: the target profile's default onnx.* rules, after the recipe's own.

A profile lists the rewrites every model needs on its runtime (e.g. armnn decomposes the
activations its TfLite parser lacks), so a recipe need not know each runtime's quirks. The
recipe turns them off with `target_rewrites: false`; a rule the recipe lists itself is not
applied again (the recipe's options win), unless one of the defaults must run before it
(edgeflow.rules.order): it then runs again after that default, with the recipe's options.
Before them, the float islands are found (edgeflow.core.islands, for
quantization.keep_float) and recorded in rewrite_target.json.
"""

from __future__ import annotations

from edgeflow.stages.base import Stage, StageContext


def run(ctx: StageContext) -> None:
    import shutil

    import onnx

    from edgeflow.core import islands
    from edgeflow.rules.order import after_the_targets
    from edgeflow.stages.rewrite_onnx import rewrite

    recipe = ctx.recipe
    own = {spec.name for spec in recipe.rewrites}
    target_specs = ctx.profile.rewrite_specs()
    specs = after_the_targets(recipe.rewrites, target_specs)
    skipped = [s.name for s in target_specs if s.name in own]
    info: dict[str, object] = {
        "target": ctx.profile.name,
        "rules": [],
        "replaced_by_recipe": skipped,
        # the recipe's own rules run again after a default that must precede them
        "again": [s.name for s in specs if s.name in own],
    }
    # before the target's rules, which may decompose them (an Erf into its approximation)
    found = islands.find(onnx.load(str(ctx.inputs["onnx"]), load_external_data=False))
    info["islands"] = [island.record() for island in found]
    if not recipe.target_rewrites or not specs:
        info["off"] = not recipe.target_rewrites
        shutil.copyfile(ctx.inputs["onnx"], ctx.output("onnx"))
    else:
        info["rules"] = rewrite(ctx, specs)
    ctx.write_json("rewrite_target", info)


STAGE = Stage(
    name="rewrite_target",
    description="Apply the target profile's default onnx.* rules.",
    run=run,
    consumes=("onnx",),
    produces={
        "onnx": "model.onnx",
        # the per-layer diff's source side (stages/diff.py): after the target's rewrites too,
        # which may rescale intermediates (onnx.equalize_channels) while keeping the outputs
        "source_onnx": "model.onnx",
        "rewrite_target": "rewrite_target.json",
    },
    reads=("target", "target_rewrites", "rewrites", "source.inputs"),
    tools=("onnx", "onnxscript", "onnxoptimizer", "onnx-ir"),
    rule_levels=("onnx",),
    isolated=True,
)
