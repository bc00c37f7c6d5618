"""quantize: static int8 QDQ quantization with onnxruntime (calibrated), fp16, or nothing."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from edgeflow.engine.stage import Stage, StageContext

METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}


def run(ctx: StageContext) -> None:
    import onnx

    q = ctx.recipe.quantization
    src, dst = ctx.inputs["onnx"], ctx.output("onnx")
    info: dict[str, Any] = {"mode": q.mode}
    from edgeflow.targets import backend

    if q.mode == "none" or backend(ctx.profile).QUANTIZES_ITSELF:
        shutil.copyfile(src, dst)  # the float model; such a backend quantizes while converting
        info["delegated_to_converter"] = q.mode != "none"
    elif q.mode == "fp16":
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
        onnx.save(model, str(dst))
    else:
        info.update(_int8(ctx, src, dst))
    ops = Counter(n.op_type for n in onnx.load(str(dst)).graph.node)
    info.update(nodes=sum(ops.values()), ops=dict(ops))
    ctx.write_json("quantize", info)


def _int8(ctx: StageContext, src: Path, dst: Path) -> dict[str, Any]:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from edgeflow.data import load_samples
    from edgeflow.verify.runners import batching

    recipe = ctx.recipe
    q = ctx.profile.quantization_for(recipe.quantization)
    samples = load_samples(recipe.calibration, recipe.source.inputs, "calibration")

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = samples.batches(*batching(recipe.source))

        def get_next(self) -> dict | None:
            return next((feeds for feeds, _ in self.batches), None)

    prepared = ctx.out_dir / "preprocessed.onnx"
    quant_pre_process(str(src), str(prepared), skip_symbolic_shape=False)
    quantize_static(
        str(prepared),
        str(dst),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=q.per_channel,
        reduce_range=q.reduce_range,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=getattr(CalibrationMethod, METHODS[q.method]),
        extra_options={"ActivationSymmetric": q.symmetric, "WeightSymmetric": True},
    )
    prepared.unlink()
    imposed = {k: v for k, v in ctx.profile.int8.items() if getattr(recipe.quantization, k) != v}
    return {
        "imposed_by_target": imposed,
        "per_channel": q.per_channel,
        "symmetric": q.symmetric,
        "method": q.method,
        "reduce_range": q.reduce_range,
        "calibration_samples": len(samples),
    }


STAGE = Stage(
    name="quantize",
    description="Quantize with onnxruntime: static int8 QDQ (calibrated) or fp16.",
    run=run,
    consumes=("onnx",),
    produces={"onnx": "model.onnx", "quantize": "quantize.json"},
    reads=("quantization", "calibration", "source.inputs", "source.dynamic_batch", "target"),
    tools=("onnx", "onnxruntime", "numpy"),
    code=("edgeflow.data", "edgeflow.recipe.refs", "edgeflow.verify.runners"),
)
