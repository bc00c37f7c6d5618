"""diff: every tensor of the artifact, in its real runtime, against the source ONNX model.

Not part of the pipelines: `edgeflow diff` runs it after a build, and so does `edgeflow run`
after a build that misses an accuracy or agreement threshold (`diff.on_failure`). The source
side is the ONNX model after the recipe's rewrites (before the target's), in onnxruntime
float32; the artifact side is edgeflow.targets.taps. Counterparts are found through an oracle
(`_capture`): the float32 model the converter read, or a float32 .tflite made from it, paired
with the source by value (edgeflow.verify.layers), then with the artifact by name or operator;
an int8 .tflite whose operators differ from the float32 one's pairs by name, by the runs of
operators both share and by value up to int8 rounding. Where nothing inside the model pairs,
the record asks for the bisection (`bisect`), which the runner then runs.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.schema.sections import fed_inputs
from edgeflow.schema.source import kept_layout
from edgeflow.stages.base import Stage, StageContext
from edgeflow.stages.convert import RUNTIMES


def run(ctx: StageContext) -> None:
    import onnx

    from edgeflow.targets.taps import batches_of
    from edgeflow.verify.layers import (
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
    model = onnx.load(str(ctx.inputs["source_onnx"]))
    source = source_graph(model, batches)
    info = ctx.read("convert").dump()
    work = ctx.out_dir / ".work"
    work.mkdir()
    try:
        captured, pairing, paired_by, method = _capture(
            ctx, profile.backend, info, batches, source, work
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    artifact = {t.name: t for t in captured.tensors}
    pairs = compare(source, artifact, captured.values, pairing, paired_by)
    threshold = _threshold(recipe)
    divergence = first_divergence(source, pairs, threshold)
    unlocated = _unlocated(pairs, divergence, {o.name for o in model.graph.output})
    write_csv(ctx.output("layers_diff"), pairs)
    worst = min(pairs, key=lambda p: p.sqnr_db, default=None)
    placed = divergence and _npu_layer(info, divergence.pair.artifact.name)
    line = divergence.line() if divergence else _no_divergence(pairs, threshold)
    if placed:
        line += f"; Vela placed it on the {placed['target']} as {'+'.join(placed['lowered'])}"
    ctx.write(
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
            "paired_by": dict(Counter(p.paired_by for p in pairs)),
            "min_sqnr_db": threshold,
            "first_divergence": divergence
            and {
                "tensor": divergence.pair.source.name,
                "op": divergence.pair.source.op,
                "node": divergence.pair.source.node,
                "fused_nodes": [t.node for t in divergence.fused],
                "artifact_tensor": divergence.pair.artifact.name,
                "paired_by": divergence.pair.paired_by,
                "worst_part": divergence.pair.worst_part,
                "parts": [name for name, _, _ in divergence.pair.source.parts],
                "sqnr_db": _finite(divergence.pair.sqnr_db),
                "inputs_sqnr_db": None
                if divergence.before_db is None
                else _finite(divergence.before_db),
                **({"npu_layer": placed} if placed else {}),
            },
            "line": line,
            "hint": _hint(divergence, mode),
            "bisect": unlocated,
            "worst": worst and {"tensor": worst.source.name, "sqnr_db": _finite(worst.sqnr_db)},
        },
    )


def _npu_layer(info: dict[str, Any], tensor: str) -> dict[str, Any] | None:
    """The operator Vela compiled a tensor of the pre-Vela model into (an NPU build: its
    per-layer rows are named by the original operator's output tensor), or None."""
    rows = [layer for layer in (info.get("npu") or {}).get("layers", []) if layer["name"] == tensor]
    if not rows:
        return None
    return {
        "op": rows[0]["op"],
        "lowered": [r["lowered"] for r in rows],
        "target": rows[0]["target"],
        "cycles": sum(r["cycles"] for r in rows),
    }


def _capture(
    ctx: StageContext,
    family: str,
    info: dict[str, Any],
    batches: list[Any],
    source: Any,
    work: Path,
) -> tuple[Any, dict[str, tuple[str, str]], dict[str, str], str]:
    """The artifact's tensors, their source counterparts, how each was paired (io, name,
    operator, sequence, value: docs/debugging.md) and how all were.

    Pairing goes through an oracle: the float32 model the converter started from (onnxruntime)
    or a float32 conversion of it (LiteRT), whose tensors equal their source counterparts
    wherever the conversion is right; the artifact's tensors are then the oracle's by name
    (onnxruntime) or operator by operator (.tflite, `_through_float32`). A runtime that
    computes a tensor wrong is thus still paired at that tensor, and so is an int8 tensor
    whatever its error."""
    from edgeflow.targets.registry import get, offering
    from edgeflow.targets.taps import capture_onnx, capture_tflite

    backend = get(family)
    if not backend.intermediates:
        raise EdgeflowError(
            f"the per-layer diff cannot read the tensors of a {family} artifact here",
            f"diff a build for {' or '.join(offering(lambda b: b.intermediates))}",
        )
    if backend.tflite is None:  # an onnxruntime model
        captured = capture_onnx(ctx.inputs["onnx"], batches)
        oracle = capture_onnx(ctx.inputs["float_onnx"], batches)
        by_oracle = _oracle_pairing(source, oracle)
        pairing = {t.name: by_oracle[t.name] for t in captured.tensors if t.name in by_oracle}
        how = "by value with the float32 model the converter read, then by tensor name"
        return captured, pairing, dict.fromkeys(pairing, "name"), how
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
) -> tuple[dict[str, tuple[str, str]], dict[str, str], str]:
    """Pair a .tflite through a float32 conversion of the model the converter read, run in
    LiteRT and paired with the source by value: operator by operator where the two files
    have the same operators; else by tensor name and by the runs of operators they share,
    then by value up to int8 rounding (`match_near`) for what has no float32 counterpart.
    The artifact's model inputs and outputs also pair by its recorded layout."""
    from edgeflow.targets.taps import TYPE_ONLY, align, align_runs, same_names
    from edgeflow.verify.layers import match_by_value, match_near

    oracle = _float32_oracle(ctx, family, batches, work)
    by_value = match_by_value(source, oracle.tensors, oracle.values)
    floats, quants = oracle.graph, captured.graph
    assert floats is not None and quants is not None  # capture_tflite reads them
    pairing: dict[str, tuple[str, str]] = {}
    paired_by: dict[str, str] = {}

    def take(aligned: dict[int, int], how: str) -> None:
        taken = {name for name, _ in pairing.values()}
        for f, q in aligned.items():
            counterpart = by_value.get(floats.names[f])
            if counterpart and quants.names[q] not in pairing and counterpart[0] not in taken:
                pairing[quants.names[q]] = counterpart
                paired_by[quants.names[q]] = how
                taken.add(counterpart[0])

    take(dict(zip(floats.inputs, quants.inputs, strict=True)), "io")
    exact = align(floats.ops, quants.ops)
    if exact is not None:
        take(exact, "operator")
    else:
        take(same_names(floats, quants), "name")
        take(align_runs(floats, quants), "sequence")
    taken = {name for name, _ in pairing.values()}
    for spec in info["io"]["outputs"]:  # the model's outputs, also where they are wrong
        name = quants.names[quants.outputs[spec["index"]]]
        if spec["name"] not in taken and name not in pairing and spec["name"] in source.values:
            pairing[name] = (
                spec["name"],
                "channel_last" if spec["perm"] != sorted(spec["perm"]) else "same",
            )
            paired_by[name] = "io"
            taken.add(spec["name"])
    if exact is None:  # what has no float32 counterpart: by value, up to int8 rounding
        rest = [t for t in captured.tensors if t.name not in pairing and t.op not in TYPE_ONLY]
        near = match_near(source, rest, captured.values, taken, _threshold(ctx.recipe))
        pairing |= near
        paired_by |= dict.fromkeys(near, "value")
    how = "through a float32 conversion in LiteRT (paired with the source by value), "
    if exact is not None:
        return pairing, paired_by, how + "operator by operator"
    counts = [sum(1 for op in g.ops if op.name not in TYPE_ONLY) for g in (quants, floats)]
    return (
        pairing,
        paired_by,
        how + f"whose operators differ from the artifact's ({counts[0]} against {counts[1]}): "
        "by tensor name and by the runs of operators both have; then by value up to int8 "
        "rounding",
    )


def _float32_oracle(ctx: StageContext, family: str, batches: list[Any], work: Path) -> Any:
    """onnx2tf's float32 conversion of the model the converter read, captured in LiteRT."""
    from edgeflow.schema.sections import Quantization
    from edgeflow.targets import _onnx2tf, _tflite_layout
    from edgeflow.targets.base import ConvertJob
    from edgeflow.targets.registry import reference_tflite
    from edgeflow.targets.taps import capture_tflite

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
    return capture_tflite(reference_tflite(), float32, io, batches, work)


def _threshold(recipe: Any) -> float:
    """Below this SQNR a tensor has diverged: the recipe's diff.min_sqnr_db, else the mode's."""
    from edgeflow.verify.layers import DIVERGENCE_DB

    found = recipe.diff.min_sqnr_db
    return DIVERGENCE_DB[recipe.quantization.mode] if found is None else float(found)


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


def _unlocated(pairs: list[Any], divergence: Any, outputs: set[str]) -> str | None:
    """Why the bisection is to find the divergence (the runner runs it), or None where the
    diff locates it: where no tensor inside the model pairs, a divergent output only says
    that some node before it is wrong."""
    if not pairs:
        return "no tensor of the artifact pairs with one of the source model"
    inside = [p for p in pairs if p.source.op != "input" and p.source.name not in outputs]
    if inside or divergence is None or not divergence.fused:
        return None
    return (
        "the diff pairs no tensor inside the model, so it cannot tell which of the "
        f"{len(divergence.nodes)} nodes up to {divergence.pair.source.name} diverges"
    )


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
