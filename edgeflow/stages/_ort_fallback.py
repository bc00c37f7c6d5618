"""quantization.fallback: auto with onnxruntime's quantizer: quantize_static's nodes_to_exclude.

Each candidate mix is quantized again with its layers excluded (a Conv with the Relu that
onnxruntime folds into it) and run in onnxruntime on the calibration samples; a mix
onnxruntime does not load is a trial that misses, named (seen on rxnmapper's ALBERT:
"Attempt to replace the existing tensor" from its graph optimizer, which loads with the
optimizations off). The search and the sensitivity are edgeflow.verify.fallback's.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeflow.core.errors import first_line
from edgeflow.stages.base import StageContext
from edgeflow.verify import fallback

SENSITIVITY_SAMPLES = 64  # calibration samples whose every tensor is read for the ranking
FOLDED = ("Relu", "Clip")  # activations onnxruntime's QDQ quantizer removes after a Conv/Gemm


def search(
    ctx: StageContext,
    prepared: Path,
    dst: Path,
    quantize: Callable[[Path, list[str]], None],
    samples: Any,
) -> dict[str, Any]:
    """Keep the fewest layers of `prepared` float so the recipe's budget holds; `dst` holds
    the all-int8 model on entry and the chosen mix on return. Returns the fallback record."""
    import onnx

    from edgeflow.targets.taps import batches_of, capture_onnx
    from edgeflow.verify.layers import source_graph
    from edgeflow.verify.runners import BatchAxes, OnnxRunner, batching, run_all

    started = time.monotonic()
    recipe = ctx.recipe
    batch, fixed = batching(recipe.source)
    names = [o.name for o in onnx.load(str(prepared), load_external_data=False).graph.output]
    budget, note = fallback.Budget.of(recipe, names, samples.labels is not None)
    if note:
        ctx.warn(note)
    axes = BatchAxes.of(recipe.evaluation.outputs, names)  # batch-first, as verify has them
    reference = run_all(OnnxRunner.checking(str(prepared)), samples, batch, fixed, axes=axes)
    budget.measurable(reference)
    feeds, _ = next(samples.batches(batch, fixed=True))
    work = ctx.out_dir / ".fallback"
    work.mkdir()
    layers = candidates(onnx.load(str(prepared)), onnx.load(str(dst)))
    by_name = {layer.name: layer for layer in layers}

    files: dict[tuple[str, ...], Path] = {(): dst}
    done: dict[tuple[str, ...], fallback.Trial] = {}

    def evaluate(names: tuple[str, ...]) -> fallback.Trial:
        if names in done:
            return done[names]
        if names not in files:
            files[names] = work / f"trial-{len(files)}.onnx"
            quantize(files[names], [node for n in names for node in by_name[n].excludes])
        try:
            runner = OnnxRunner.from_file(str(files[names]))
        except Exception as exc:  # onnxruntime refuses the quantizer's mix: a failed trial
            if not names:
                raise  # the build's own int8 file
            done[names] = fallback.Trial(
                names, {}, (f"the mix does not load in onnxruntime: {first_line(exc)}",), math.inf
            )
            return done[names]
        outputs = run_all(runner, samples, batch, fixed, axes=axes)
        cost = fallback.cost(runner, feeds, files[names])
        done[names] = budget.judge(names, reference, outputs, samples.labels, cost)
        return done[names]

    full = evaluate(())
    ranking: list[fallback.Sensitivity] = []
    if full.passed:
        outcome = fallback.Outcome(full, full, [full])
    else:
        batches = list(batches_of(samples, batch, fixed, SENSITIVITY_SAMPLES))
        floats = source_graph(onnx.load(str(prepared)), batches).values
        int8 = capture_onnx(dst, batches).values
        qdq_out = {n.name: n.output[0] for n in onnx.load(str(dst)).graph.node if n.name}
        # every tensor both models hold by name (a quantized one as its DequantizeLinear
        # gives it), then each layer's output as the quantized node writes it
        db = {
            name: fallback.sqnr_db(values, [v[name] for v in int8])
            for name, values in floats.items()
            if name in int8[0]
        }
        db.update(
            {
                layer.output: fallback.sqnr_db(
                    floats[layer.output], [v[qdq_out[layer.name]] for v in int8]
                )
                for layer in layers
                if layer.output in floats and qdq_out.get(layer.name) in int8[0]
            }
        )
        ranking, blocks = fallback.plan(layers, db)
        bounds = fallback.Bounds.of(recipe.quantization)
        outcome = fallback.search([s.layer.name for s in ranking], evaluate, bounds, blocks)
        if outcome.chosen.float_layers:
            shutil.copyfile(files[outcome.chosen.float_layers], dst)
    shutil.rmtree(work)
    outcome.seconds = time.monotonic() - started  # the sensitivity's run included
    measured_on = f"calibration samples ({len(samples)}), against the float32 model in onnxruntime"
    return fallback.summary(outcome, budget, ranking, measured_on, "the QDQ .onnx (before .ort)")


def candidates(float_model: Any, qdq_model: Any) -> list[fallback.Layer]:
    """The float model's nodes whose output the quantizer quantized, each with the Relu/Clip
    onnxruntime folded into it (removed from the QDQ model): the layers that can stay float."""
    from edgeflow.targets.taps import dequantized_names

    quantized = dequantized_names(qdq_model)
    qdq_nodes = {n.name: n for n in qdq_model.graph.node if n.name}
    consumers: dict[str, list[Any]] = {}
    for node in float_model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    layers = []
    for node in float_model.graph.node:
        twin = qdq_nodes.get(node.name)
        if twin is None or twin.op_type != node.op_type or twin.output[0] not in quantized:
            continue
        output, excludes = node.output[0], [node.name]
        after = consumers.get(output, [])
        if len(after) == 1 and after[0].op_type in FOLDED and after[0].name not in qdq_nodes:
            output = after[0].output[0]
            excludes.append(after[0].name)
        inputs = tuple(i for i in node.input if i)
        layers.append(fallback.Layer(node.name, node.op_type, output, inputs, tuple(excludes)))
    return layers
