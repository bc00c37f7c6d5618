"""diff: every tensor of the artifact, in its real runtime, against the source ONNX model.

Not part of the pipelines: `edgeflow diff` runs it after a build, and so does `edgeflow run`
after a build that misses an accuracy or agreement threshold (`diff.on_failure`). The source
side is the ONNX model after the recipe's rewrites (before the target's), in onnxruntime
float32; the artifact side is edgeflow.targets.taps. Counterparts are found through an oracle
(`_capture`): the float32 model the converter read, or a float32 .tflite made from it, paired
with the source by value (edgeflow.verify.layers), then with the artifact by name or operator.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.core.sources import kept_layout
from edgeflow.core.specs import fed_inputs
from edgeflow.stages.base import Stage, StageContext
from edgeflow.stages.convert import RUNTIMES


def run(ctx: StageContext) -> None:
    import onnx

    from edgeflow.targets.taps import batches_of
    from edgeflow.verify.layers import (
        DIVERGENCE_DB,
        compare,
        first_divergence,
        source_graph,
        write_csv,
    )
    from edgeflow.verify.runners import batching
    from edgeflow.verify.stream import load_steps

    recipe, profile = ctx.recipe, ctx.profile
    mode = recipe.quantization.mode
    samples = load_steps(recipe.evaluation, recipe.source, "evaluation", ctx.inputs["source_onnx"])
    batches = list(batches_of(samples, *batching(recipe.source), recipe.diff.samples))
    source = source_graph(onnx.load(str(ctx.inputs["source_onnx"])), batches)
    info = json.loads(ctx.inputs["convert"].read_text())
    work = ctx.out_dir / ".work"
    work.mkdir()
    try:
        captured, pairing, method = _capture(ctx, profile.backend, info, batches, source, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    pairs = compare(source, {t.name: t for t in captured.tensors}, captured.values, pairing)
    threshold = recipe.diff.min_sqnr_db
    if threshold is None:
        threshold = DIVERGENCE_DB[mode]
    divergence = first_divergence(source, pairs, threshold)
    write_csv(ctx.output("layers_diff"), pairs)
    worst = min(pairs, key=lambda p: p.sqnr_db, default=None)
    ctx.write_json(
        "diff",
        {
            "target": profile.name,
            "runtime": profile.backend,
            "mode": mode,
            "samples": sum(len(next(iter(b.values()))) for b in batches),
            "pairing": method,
            "source_tensors": len(source.tensors),
            "artifact_tensors": len(captured.tensors),
            "compared": len(pairs),
            "min_sqnr_db": threshold,
            "first_divergence": divergence
            and {
                "tensor": divergence.pair.source.name,
                "op": divergence.pair.source.op,
                "node": divergence.pair.source.node,
                "fused_nodes": [t.node for t in divergence.fused],
                "artifact_tensor": divergence.pair.artifact.name,
                "worst_part": divergence.pair.worst_part,
                "parts": [name for name, _, _ in divergence.pair.source.parts],
                "sqnr_db": _finite(divergence.pair.sqnr_db),
                "inputs_sqnr_db": None
                if divergence.before_db is None
                else _finite(divergence.before_db),
            },
            "line": divergence.line() if divergence else _no_divergence(pairs, threshold),
            "hint": _hint(divergence, mode),
            "worst": worst and {"tensor": worst.source.name, "sqnr_db": _finite(worst.sqnr_db)},
        },
    )


def _capture(
    ctx: StageContext,
    family: str,
    info: dict[str, Any],
    batches: list[Any],
    source: Any,
    work: Path,
) -> tuple[Any, dict[str, tuple[str, str]], str]:
    """The artifact's tensors, their source counterparts and how they were paired.

    Pairing goes through an oracle: the float32 model the converter started from (onnxruntime)
    or a float32 conversion of it (LiteRT), whose tensors equal their source counterparts
    wherever the conversion is right; the artifact's tensors are then the oracle's by name
    (onnxruntime) or operator by operator (.tflite). A runtime that computes a tensor wrong is
    thus still paired at that tensor, and so is an int8 tensor whatever its error."""
    from edgeflow.targets.taps import TFLITE_FAMILY, capture_onnx, capture_tflite

    if family == "onnxruntime_micro":
        captured = capture_onnx(ctx.inputs["onnx"], batches)
        oracle = capture_onnx(ctx.inputs["float_onnx"], batches)
        by_oracle = _oracle_pairing(source, oracle)
        pairing = {t.name: by_oracle[t.name] for t in captured.tensors if t.name in by_oracle}
        how = "by value with the float32 model the converter read, then by tensor name"
        return captured, pairing, how
    if family not in TFLITE_FAMILY:
        raise EdgeflowError(
            f"the per-layer diff cannot read the tensors of a {family} artifact here",
            "diff a build for onnxruntime_micro, tflite, tflite_micro or armnn",
        )
    artifact = ctx.inputs["artifact"] / info["artifact"]
    captured = capture_tflite(family, artifact, info["io"], batches, work)
    return captured, *_through_float32(ctx, family, captured, info, batches, source, work)


def _oracle_pairing(source: Any, oracle: Any) -> dict[str, tuple[str, str]]:
    """{oracle tensor: (source tensor, layout)}: by value, and the model's inputs and outputs
    by name where their values differ (a conversion that is wrong is then wrong there)."""
    from edgeflow.verify.layers import match_by_value

    pairing = match_by_value(source, oracle.tensors, oracle.values)
    taken = {name for name, _ in pairing.values()}
    for tensor in oracle.tensors:
        if tensor.name in source.values and tensor.name not in taken | set(pairing):
            pairing[tensor.name] = (tensor.name, "same")
    return pairing


def _through_float32(
    ctx: StageContext,
    family: str,
    captured: Any,
    info: dict[str, Any],
    batches: list[Any],
    source: Any,
    work: Path,
) -> tuple[dict[str, tuple[str, str]], str]:
    """Pair a .tflite through a float32 conversion of the model the converter read, run in
    LiteRT: paired with the source by value, then aligned with the artifact operator by
    operator (the artifact's model inputs and outputs also pair by its recorded layout)."""
    from edgeflow.core.specs import Quantization
    from edgeflow.targets import _onnx2tf, _tflite_layout
    from edgeflow.targets.base import ConvertJob
    from edgeflow.targets.taps import align, capture_tflite
    from edgeflow.verify.layers import match_by_value

    kept = kept_layout(ctx.recipe.source)
    job = ConvertJob(
        ctx.inputs["float_onnx"],
        work,
        ctx.profile,
        Quantization(),
        list(fed_inputs(ctx.recipe.source.inputs)),
        None,
        kept_layout=kept,
    )
    float32 = work / "float32.tflite"
    with _onnx2tf.outputs(job, family) as (out, _):
        shutil.copyfile(out / "model_float32.tflite", float32)
    io = _tflite_layout.io_layout(ctx.inputs["float_onnx"], float32, float32, family, kept)
    oracle = capture_tflite("tflite", float32, io, batches, work)
    by_value = match_by_value(source, oracle.tensors, oracle.values)
    floats, quants = oracle.graph, captured.graph
    assert floats is not None and quants is not None  # capture_tflite reads them
    aligned = align(floats.ops, quants.ops)
    if aligned is None:
        raise EdgeflowError(
            "the per-layer diff cannot pair the artifact's tensors: its operators differ "
            "from a float32 conversion of the model it was converted from",
            "diff the float32 build (quantization=none) to find where the conversion changes it",
        )
    aligned.update(zip(floats.inputs, quants.inputs, strict=True))
    pairing = {
        quants.names[aligned[t]]: by_value[floats.names[t]]
        for t in aligned
        if floats.names[t] in by_value
    }
    taken = {name for name, _ in pairing.values()}
    for spec in info["io"]["outputs"]:  # the model's outputs, also where they are wrong
        name = quants.names[quants.outputs[spec["index"]]]
        if spec["name"] not in taken and name not in pairing and spec["name"] in source.values:
            pairing[name] = (
                spec["name"],
                "channel_last" if spec["perm"] != sorted(spec["perm"]) else "same",
            )
    return pairing, "through a float32 conversion in LiteRT: by value, then operator by operator"


def _hint(divergence: Any, mode: str) -> str:
    """What to try for the divergence found (docs/debugging.md has the whole table)."""
    if divergence is None:
        return ""
    parts = [name for name, _, _ in divergence.pair.source.parts]
    if parts and mode == "int8":
        return (
            f"{divergence.pair.source.name} concatenates tensors of different ranges under one "
            f"int8 scale: quantize them apart (postprocess: {{cut: [{', '.join(parts)}]}}) or "
            "keep the Concat float"
        )
    if mode == "none":
        return "a float32 tensor this far off is a conversion or runtime error, not rounding"
    return "see docs/debugging.md, 'From verify failed to a fix'"


def _finite(value: float) -> float | str:
    """JSON has no inf: an exact tensor's SQNR is written as "inf"."""
    return str(value) if value in (float("inf"), float("-inf")) else round(value, 2)


def _no_divergence(pairs: list[Any], threshold: float) -> str:
    if not pairs:
        return "no tensor of the artifact could be paired with the source model"
    worst = min(pairs, key=lambda p: p.sqnr_db)
    return (
        f"no divergence: all {len(pairs)} compared tensors are above {threshold:g} dB "
        f"(lowest: {worst.source.name}, {worst.sqnr_db:.0f} dB)"
    )


# What the diff reads of the recipe (the bisection reads the same, and the calibration set).
READS = (
    "evaluation",
    "source.kind",
    "source.inputs",
    "source.state",
    "source.dynamic_batch",
    "quantization",
    "target",
    "diff",
)

STAGE = Stage(
    name="diff",
    description="Compare every tensor of the artifact, in its runtime, with the source model.",
    run=run,
    consumes=("artifact", "convert", "onnx", "float_onnx", "source_onnx"),
    produces={"layers_diff": "layers_diff.csv", "diff": "diff.json"},
    reads=READS,
    tools=("onnx", *RUNTIMES, "numpy"),
    isolated=True,
)
