"""quantization.fallback: auto for the TFLite family: a mixed int8/float .tflite.

onnx2tf's full-integer file is tried first. Where it misses the budget, onnx2tf's float32 file
is calibrated once with TensorFlow's calibrator (what its converter's
`_experimental_calibrate_only` returns, as TensorFlow's QuantizationDebugger uses it), and
each mix is TensorFlow's MLIR quantizer run on that calibrated model with the float layers as
`denylisted_nodes` (their output tensor names): int8 I/O, DEQUANTIZE before and QUANTIZE after
each float operator. Each mix runs in the target's own runtime (LiteRT, TFLite Micro, Arm NN)
on the calibration samples; the ranking reads every tensor of the all-int8 and the calibrated
float model in LiteRT (`experimental_preserve_all_tensors`).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edgeflow.schema.source import batch_size
from edgeflow.targets import _onnx2tf, _tflite_layout, _tflite_quant
from edgeflow.targets._tflite_tensors import all_tensors
from edgeflow.targets.base import ConvertJob
from edgeflow.verify import fallback

SENSITIVITY_SAMPLES = 64
TYPE_ONLY = ("QUANTIZE", "DEQUANTIZE")
Mix = Callable[[Path, dict[str, Any], list[str]], tuple[bytes | None, dict[str, Any]]]


def hook(job: ConvertJob, target: str, open_runner: Callable[[Path, dict[str, Any]], Any]) -> Any:
    """The mixing step for _onnx2tf.convert, or None when the recipe asks for no fallback."""
    if job.quantization.mode != "int8" or job.quantization.fallback != "auto":
        return None

    def mix(
        out: Path, layout: dict[str, Any], kept: list[str]
    ) -> tuple[bytes | None, dict[str, Any]]:
        return search(job, target, out, layout, open_runner, kept)

    return mix


def search(
    job: ConvertJob,
    target: str,
    out: Path,
    layout: dict[str, Any],
    open_runner: Callable[[Path, dict[str, Any]], Any],
    kept: Sequence[str] = (),
) -> tuple[bytes | None, dict[str, Any]]:
    """(the mixed model, or None where the build's int8 file meets the budget; the record).
    `kept`: operators every mix keeps float (quantization.keep_float's islands)."""

    from edgeflow.verify.runners import BatchAxes, OnnxRunner, run_all

    started = time.monotonic()
    samples, budget = job.calibration, job.budget
    if samples is None or budget is None:
        raise AssertionError("fallback without calibration samples or a budget")
    batch = batch_size(job.inputs)
    names = budget.comparison.names
    axes = BatchAxes.of(budget.comparison.declared, names)  # batch-first, as verify has them
    reference = run_all(OnnxRunner.checking(str(job.onnx)), samples, batch, True, axes=axes)
    budget.measurable(reference)
    feeds, _ = next(samples.batches(batch, fixed=True))
    models: dict[tuple[str, ...], bytes] = {(): (job.out_dir / _onnx2tf.ARTIFACT).read_bytes()}
    q = job.quantization
    int8_io = not q.float_outputs  # the TFLite family's int8 I/O, unless float outputs
    float32 = (out / "model_float32.tflite").read_bytes()
    writers = _tflite_quant.output_writers(float32, target) if q.float_outputs else []
    writers = [*writers, *kept]
    dense = not job.profile.per_channel_dense  # per-tensor fully-connected weights
    layouts: dict[Any, dict[str, Any]] = {(): layout}
    excludes: dict[str, tuple[str, ...]] = {}
    calibrated = b""
    done: dict[tuple[str, ...], fallback.Trial] = {}
    work = Path(tempfile.mkdtemp(prefix="fallback-", dir=out))

    def evaluate(names: tuple[str, ...]) -> fallback.Trial:
        if names in done:
            return done[names]
        if names not in models:
            denied = [*writers, *(e for n in names for e in excludes[n])]
            models[names] = _tflite_quant.quantize(
                calibrated, q.per_channel, denied, q.float_outputs, target, dense
            )
        path = work / f"trial-{len(done)}.tflite"
        path.write_bytes(models[names])
        _onnx2tf.for_runtime(path, target)  # as the build hands it over: loops unrolled for Arm NN
        runner = open_runner(path, layouts["mlir" if names else ()])
        outputs = run_all(runner, samples, batch, True, axes=axes)
        cost = fallback.cost(runner, feeds, path)
        done[names] = budget.judge(names, reference, outputs, samples.labels, cost)
        del runner
        return done[names]

    full = evaluate(())
    where = (
        f"calibration samples ({len(samples)}), in {target}'s runtime, against the float32 "
        "model in onnxruntime"
    )
    if full.passed:
        outcome = fallback.Outcome(full, full, [full], time.monotonic() - started)
        return None, fallback.summary(outcome, budget, [], where, ".tflite", int8_io)
    calibrated = _tflite_quant.calibrate(job, out)
    int8 = _tflite_quant.quantize(
        calibrated, q.per_channel, writers, q.float_outputs, target, dense
    )
    (work / "int8.tflite").write_bytes(int8)
    layouts["mlir"] = _tflite_layout.io_layout(
        job.onnx, work / "int8.tflite", out / "model_float32.tflite", target, job.kept_layout
    )
    layers, db = sensitivity(calibrated, int8, layouts["mlir"], samples, batch)
    excludes.update({layer.name: layer.excludes for layer in layers})
    ranking, blocks = fallback.plan(layers, db)
    bounds = fallback.Bounds.of(job.quantization)
    outcome = fallback.search([s.layer.name for s in ranking], evaluate, bounds, blocks)
    outcome.seconds = time.monotonic() - started  # calibration and sensitivity included
    chosen = models[outcome.chosen.float_layers] if outcome.chosen.float_layers else None
    return chosen, fallback.summary(outcome, budget, ranking, where, ".tflite", int8_io)


def sensitivity(
    calibrated: bytes, int8: bytes, layout: dict[str, Any], samples: Any, batch: int
) -> tuple[list[fallback.Layer], dict[str, float]]:
    """The int8 model's operators as candidates, and the SQNR of every tensor both models
    write (same names: one calibrated model under both)."""
    feeds = [f for k, (f, _) in enumerate(samples.batches(batch, True)) if k < SENSITIVITY_SAMPLES]
    floats, _ = all_tensors(calibrated, layout, feeds)
    quantized, int8_ops = all_tensors(int8, layout, feeds)
    db = {
        name: fallback.sqnr_db(values, quantized[name])
        for name, values in floats.items()
        if name in quantized
    }
    layers = [
        fallback.Layer(outs[0], op, outs[0], tuple(inputs), (outs[0],))
        for op, inputs, outs in int8_ops
        if op not in TYPE_ONLY
    ]
    return layers, fallback.inherited(db, [(inputs, outs) for _, inputs, outs in int8_ops])
