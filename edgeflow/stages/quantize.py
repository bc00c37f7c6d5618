"""quantize: static int8 QDQ quantization with onnxruntime (calibrated), int8 weights with
float activations (onnxruntime's dynamic quantization), fp16, or nothing."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeflow.core import progress
from edgeflow.core.errors import EdgeflowError
from edgeflow.schema.sections import FALLBACK_READS
from edgeflow.stages.base import Stage, StageContext

if TYPE_CHECKING:
    from edgeflow.targets.registry import Backend

METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
# Where onnxruntime's dynamic quantization reads an int8 weight (or table): the input position
WEIGHT_INPUT = {"MatMulInteger": 1, "ConvInteger": 1, "Gather": 0, "DequantizeLinear": 0}


def run(ctx: StageContext) -> None:
    import onnx

    q = ctx.recipe.quantization
    src, dst = ctx.inputs["onnx"], ctx.output("onnx")
    info: dict[str, Any] = {"mode": q.mode}
    if q.mode == "none" or ctx.profile.family.quantizes_itself:
        shutil.copyfile(src, dst)  # the float model; such a backend quantizes while converting
        info["delegated_to_converter"] = q.mode != "none"
    elif q.mode == "fp16":
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
        onnx.save(model, str(dst))
    elif q.mode == "int8_weights":
        info.update(_int8_weights(ctx, src, dst))
    elif q.method == "qat":
        info.update(_from_qat(src, dst))
    else:
        info.update(_int8(ctx, src, dst))
    ops = Counter(n.op_type for n in onnx.load(str(dst)).graph.node)
    info.update(nodes=sum(ops.values()), ops=dict(ops))
    ctx.write("quantize", info)


PREPARED, UPGRADED = "preprocessed.onnx", "upgraded.onnx"  # in the stage's own out_dir


def _prepared(ctx: StageContext, src: Path, opset: int, why: str) -> tuple[Path, Any, Any]:
    """(the model onnxruntime's quantizer reads, the opset conversion or None, the shape
    inference's record): src converted to `opset` where below it (`why` it must be), then
    onnxruntime's pre-processing; a warning where its symbolic shape inference failed.
    Written in the stage's out_dir, removed by _drop_prepared."""
    from edgeflow.stages import _ort_quant

    upgraded = ctx.out_dir / UPGRADED
    converted = _ort_quant.upgrade_opset(src, upgraded, opset, why)
    prepared = ctx.out_dir / PREPARED
    shapes = _ort_quant.pre_process(upgraded if converted else src, prepared)
    if not shapes["symbolic"]:
        ctx.warn(shapes["symbolic_failed"] + "; pre-processed with onnx's shape inference only")
    return prepared, converted, shapes


def _drop_prepared(ctx: StageContext) -> None:
    """Remove what _prepared wrote (its names, in this stage's own out_dir), not the outputs."""
    (ctx.out_dir / PREPARED).unlink()
    (ctx.out_dir / UPGRADED).unlink(missing_ok=True)


def _warn_refused(ctx: StageContext, refused: list[dict[str, str]]) -> None:
    """A warning per node onnxruntime's quantizer raised on, which the build keeps float."""
    for r in refused:
        ctx.warn(
            f"onnxruntime's quantizer cannot quantize node '{r['node']}' ({r['op']}): "
            f"{r['error'].rstrip('.')}; it is kept float"
        )


def _int8(ctx: StageContext, src: Path, dst: Path) -> dict[str, Any]:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
    )

    from edgeflow.stages import _ort_quant
    from edgeflow.verify.runners import batching
    from edgeflow.verify.stream import load_steps

    recipe = ctx.recipe
    q = ctx.profile.quantization_for(recipe.quantization)
    samples = load_steps(recipe.calibration, recipe.source, "calibration", src)
    batch, fixed = batching(recipe.source)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            total = -(-len(samples) // batch)
            batches = samples.batches(batch, fixed)
            self.batches = progress.track(batches, "calibration", total, unit="batches")

        def get_next(self) -> dict | None:
            return next((feeds for feeds, _ in self.batches), None)

    prepared, opset, shapes = _prepared(ctx, src, _ort_quant.QDQ_OPSET, _ort_quant.QDQ_WHY)
    reduce_range, why = _reduce_range(q.reduce_range, ctx.profile.family)
    extra: dict[str, Any] = {"ActivationSymmetric": q.symmetric, "WeightSymmetric": True}
    method = q.method
    if method == "entropy":  # its ranges as overrides; min/max for nothing else
        extra["TensorQuantOverrides"] = _ort_quant.entropy_ranges(
            prepared, Reader(), q.symmetric, ctx.out_dir
        )
        method = "minmax"
    options: dict[str, Any] = {
        "quant_format": QuantFormat.QDQ,
        "per_channel": q.per_channel,
        "reduce_range": reduce_range,
        "activation_type": QuantType.QInt8,
        "weight_type": QuantType.QInt8,
        "calibrate_method": getattr(CalibrationMethod, METHODS[method]),
        "extra_options": extra,
    }

    import onnx

    from edgeflow.core import islands

    graph = onnx.load(str(prepared))
    outputs = _ort_quant.output_writers(graph) if q.float_outputs else []
    infinite = _ort_quant.float_infinities(graph)  # what reads an -inf mask value: float

    found = islands.recorded(ctx.inputs.get("rewrite_target"))
    kinds = ctx.profile.keep_float(q, found)
    kept, lost = islands.kept_nodes(found, kinds, *islands.onnx_nodes(graph))
    float_islands = [node for nodes in kept.values() for inside in nodes for node in inside]
    refused: list[dict[str, str]] = []  # nodes the quantizer fails on: kept float in every mix

    def quantize(path: Path, float_nodes: list[str]) -> None:
        excluded = [*outputs, *infinite, *float_islands, *float_nodes]
        _ort_quant.quantize(prepared, path, Reader, refused, nodes_to_exclude=excluded, **options)

    quantize(dst, [])
    _warn_refused(ctx, refused)
    mixed = None
    if q.fallback == "auto":
        from edgeflow.stages import _ort_fallback

        mixed = _ort_fallback.search(ctx, prepared, dst, quantize, samples)
    _drop_prepared(ctx)
    imposed = {k: v for k, v in ctx.profile.int8.items() if getattr(recipe.quantization, k) != v}
    return {
        "imposed_by_target": imposed,
        "per_channel": q.per_channel,
        "symmetric": q.symmetric,
        "method": q.method,
        "entropy_bins": _ort_quant.ENTROPY_BINS if q.method == "entropy" else None,
        "reduce_range": reduce_range,
        "reduce_range_auto": why,  # why auto chose as it did (None: set in the recipe)
        "calibration_samples": len(samples),
        "float_outputs": outputs,  # the nodes writing the outputs, kept float
        "float_infinities": infinite,  # nodes reading an infinite constant, kept float
        "refused_by_quantizer": refused,  # nodes onnxruntime's quantizer failed on, kept float
        "float_islands": islands.record(kept, lost, kinds),  # quantization.keep_float
        "opset_converted": opset,  # {from, to}: the source was below opset 13
        "shape_inference": shapes,
        "fallback": mixed,
    }


def _int8_weights(ctx: StageContext, src: Path, dst: Path) -> dict[str, Any]:
    """int8 weights, float activations: onnxruntime's dynamic quantization. Each MatMul (a
    Gemm as MatMul and Add) and Conv with a constant weight stores it as int8 (symmetric;
    per_channel: one scale per output column of a MatMul, while onnxruntime quantizes a
    Conv's weight per tensor) and runs as DynamicQuantizeLinear, which quantizes the input
    to uint8 on each inference, then MatMulInteger / ConvInteger (for a MatMul the .ort
    conversion fuses them into com.microsoft.DynamicQuantizeMatMul); a Gather of a constant
    table (an embedding) stores it as int8 too. Nothing is calibrated. What stays float:
    `kept_float`."""
    import onnx
    from onnxruntime.quantization import QuantType

    from edgeflow.stages import _ort_quant

    q = ctx.recipe.quantization
    why = f"int8_weights needs opset {_ort_quant.DYNAMIC_OPSET} (DynamicQuantizeLinear)"
    prepared, opset, shapes = _prepared(ctx, src, _ort_quant.DYNAMIC_OPSET, why)
    reduce_range, why_range = _reduce_range(q.reduce_range, ctx.profile.family)
    graph = onnx.load(str(prepared))
    if _name_nodes(graph):  # onnxruntime's quantizer keeps nodes float by name
        onnx.save(graph, str(prepared))
    infinite = _ort_quant.float_infinities(graph)
    kept = kept_float(graph)
    refused: list[dict[str, str]] = []
    _ort_quant.quantize_weights(
        prepared,
        dst,
        refused,
        nodes_to_exclude=[*infinite, *kept["small"], *kept["grouped"]],
        per_channel=q.per_channel,
        reduce_range=reduce_range,
        weight_type=QuantType.QInt8,
        extra_options={"WeightSymmetric": True},
    )
    _warn_refused(ctx, refused)
    weights, int8_tensors = weight_bytes(prepared, dst)
    _drop_prepared(ctx)
    return {
        "per_channel": q.per_channel,
        "reduce_range": reduce_range,
        "reduce_range_auto": why_range,
        "scheme": (
            "onnxruntime dynamic quantization: symmetric int8 weights"
            + (" (MatMul per output column, Conv per tensor)" if q.per_channel else "")
            + ", float32 activations, each quantized to uint8 per inference inside the "
            "integer kernels; nothing calibrated"
        ),
        "weights": weights,
        "int8_tensors": int8_tensors,
        "kept_float": kept,
        "float_infinities": infinite,
        "refused_by_quantizer": refused,
        "opset_converted": opset,
        "shape_inference": shapes,
    }


# Weights below this many elements stay float in int8_weights, as TensorFlow's dynamic-range
# converter keeps them (measured on onnxruntime_micro, docs/recipe.md#int8_weights: their
# DynamicQuantizeLinear, scales and casts cost more bytes than the int8 weights save).
MIN_WEIGHT_ELEMENTS = 1024


def kept_float(model: Any) -> dict[str, list[str]]:
    """The nodes int8_weights keeps float on onnxruntime: those whose constant weight (a
    Gather's table) has fewer than MIN_WEIGHT_ELEMENTS elements (`small`), and grouped
    convolutions (`grouped`: onnxruntime quantizes a Conv's weight per tensor, and one scale
    over a depthwise convolution's channels starves the small ones). Measured on the digits
    MobileNet: quantized, 24.9 dB and 1.10 x the float file; kept float, 46.4 dB and 0.80 x."""
    import numpy as np

    sizes = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    small, grouped = [], []
    for node in model.graph.node:
        weight = node.input[0 if node.op_type == "Gather" else 1] if len(node.input) > 1 else ""
        if node.op_type not in ("Conv", "MatMul", "Gemm", "Gather") or weight not in sizes:
            continue
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        if sizes[weight] < MIN_WEIGHT_ELEMENTS:
            small.append(node.name)
        elif node.op_type == "Conv" and group > 1:
            grouped.append(node.name)
    return {"small": small, "grouped": grouped}


def _name_nodes(model: Any) -> int:
    """Name every unnamed node of the main graph after its op type (fresh names); how many."""
    from edgeflow.core.onnxgraph import Namer

    unnamed = [node for node in model.graph.node if not node.name]
    if unnamed:
        fresh = Namer(model)
        for node in unnamed:
            node.name = fresh(node.op_type)
    return len(unnamed)


def weight_bytes(before: Path, after: Path) -> tuple[dict[str, int], int]:
    """The bytes of the initializers before and after weight quantization, and how many
    int8 weights (or tables) the quantized model stores."""
    import onnx
    from onnx import numpy_helper

    def total(model: Any) -> int:
        return sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)

    quantized = onnx.load(str(after))
    int8 = {t.name for t in quantized.graph.initializer if t.data_type == onnx.TensorProto.INT8}
    stored = {  # the int8 tensors read as weights or tables (not zero points)
        node.input[WEIGHT_INPUT[node.op_type]]
        for node in quantized.graph.node
        if node.op_type in WEIGHT_INPUT
    }
    weights = {"float_bytes": total(onnx.load(str(before))), "bytes": total(quantized)}
    return weights, len(int8 & stored)


def _reduce_range(setting: bool | str, family: Backend) -> tuple[bool, str | None]:
    """The reduce_range to quantize with, and for `auto` why: 7-bit weights where the
    artifact's int8 kernels run on this CPU and saturate with 8-bit ones (Backend.
    saturating_int8: onnxruntime's on x86 without VNNI), 8-bit everywhere else (TensorRT's
    kernels do not saturate)."""
    if setting != "auto":
        return bool(setting), None
    if not family.saturating_int8:
        return False, f"{family.name}'s int8 kernels do not saturate: 8-bit weights"
    from edgeflow.core import host

    saturates = host.int8_saturation()
    if saturates:
        return True, f"7-bit weights: onnxruntime's int8 kernels saturate on this {saturates}"
    return False, "8-bit weights: onnxruntime's int8 kernels do not saturate on this CPU"


def _from_qat(src: Path, dst: Path) -> dict[str, Any]:
    """The exported Q/DQ of a QAT model, as it is, with quantized weights stored as int8:
    every node computed from constants alone (a weight's QuantizeLinear, the clamp of a 7-bit
    range, a transpose) becomes the initializer it computes, evaluated with onnx's reference
    implementation; DequantizeLinear stays, so the weights stay int8."""
    import onnx
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(src))
    graph = model.graph
    if not any(n.op_type == "QuantizeLinear" for n in graph.node):
        raise EdgeflowError(
            "quantization.method qat needs a model exported with QuantizeLinear/"
            "DequantizeLinear (a QAT model's fake-quantize modules); this one has none",
            "add ast.freeze_fake_quant to the recipe's rewrites, or use method minmax",
        )
    opsets = list(model.opset_import)
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    folded = 0
    for node in list(graph.node):
        if node.op_type == "DequantizeLinear" or not all(i in consts for i in node.input if i):
            continue
        single = onnx.helper.make_model(
            onnx.helper.make_graph(
                [node],
                "fold",
                [onnx.helper.make_tensor_value_info(i, 0, None) for i in node.input if i],
                [onnx.helper.make_tensor_value_info(o, 0, None) for o in node.output],
            ),
            opset_imports=opsets,
        )
        values = ReferenceEvaluator(single).run(None, {i: consts[i] for i in node.input if i})
        for name, value in zip(node.output, values, strict=True):
            consts[name] = value
            graph.initializer.append(numpy_helper.from_array(value, name))
        graph.node.remove(node)
        folded += node.op_type == "QuantizeLinear"
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for init in list(graph.initializer):
        if init.name not in used:
            graph.initializer.remove(init)
    onnx.save(model, str(dst))
    return {"qat": True, "weights_folded_to_int8": folded}


STAGE = Stage(
    name="quantize",
    description="Quantize with onnxruntime: static int8 QDQ (calibrated), int8 weights, or fp16.",
    run=run,
    consumes=("onnx",),
    optional=("rewrite_target",),  # the float islands found before the target's rewrites
    produces={"onnx": "model.onnx", "quantize": "quantize.json"},
    reads=(
        "quantization",
        "calibration",
        "source.inputs",
        "source.state",  # calibration on the states of real sequences
        "source.dynamic_batch",
        "target",
        *FALLBACK_READS,
    ),
    tools=("onnx", "onnxruntime", "numpy", "host:int8"),  # reduce_range: auto, fallback
    isolated=True,
)
