"""TensorFlow's own converter on the SavedModel onnx2tf wrote, where edgeflow calibrates
instead of onnx2tf: the fallback's calibration and MLIR quantization
(edgeflow.targets._tflite_fallback), and the int8 / 16x8 builds of models with an input
batched on another axis than 0 (onnx2tf cuts every input's calibration data in windows of
axis 0: a [layers, batch, hidden] state cannot be calibrated through it) or with a recurrent
layer (onnx2tf's int8 run converts the model seven times over, see _onnx2tf.outputs)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeflow.core import progress
from edgeflow.core.errors import EdgeflowError
from edgeflow.core.sources import batch_size
from edgeflow.targets import _onnx2tf
from edgeflow.targets._tflite_deps import require
from edgeflow.targets.base import ConvertJob

if TYPE_CHECKING:
    from edgeflow.core.specs import TensorSpec
    from edgeflow.data import Samples

Feeds = dict[str, np.ndarray]


def own_int8(job: ConvertJob, out: Path, target: str, why: str) -> bytes:
    """The int8 model of the SavedModel onnx2tf wrote, calibrated on batches cut on each
    input's own batch axis: TensorFlow's converter and MLIR quantizer as the fallback uses
    them, or for int16 activations its 16x8 mode, with the I/O types onnx2tf would give.
    `why`: what needed it, for the error."""
    if job.quantization.activations != "int16":
        return quantize(calibrate(job, out, why), job, [])
    tf = require("tensorflow", target)
    converter = _converter(job, out, tf)
    sixteen_by_eight(converter, tf)
    return _run(converter, f"{why}: TensorFlow's converter could not quantize it to 16x8", "")


def calibrate(job: ConvertJob, out: Path, why: str = "quantization.fallback") -> bytes:
    """The SavedModel onnx2tf wrote, converted with calibration statistics recorded (`why`:
    what needed edgeflow's own calibration, for the error)."""
    converter = _converter(job, out, require("tensorflow", "tflite"))
    converter._experimental_calibrate_only = True
    hint = "build without quantization.fallback to keep onnx2tf's own int8 file"
    return _run(
        converter,
        f"{why}: TensorFlow's converter could not calibrate it",
        hint if why == "quantization.fallback" else "",
    )


def _converter(job: ConvertJob, out: Path, tf: Any) -> Any:
    """TensorFlow's converter of the SavedModel in `out`, optimizing with the calibration
    batches, per channel as the recipe says."""
    converter = tf.lite.TFLiteConverter.from_saved_model(str(out))
    calibrated_on(converter, tf, lambda: representative(job), job.quantization.per_channel)
    return converter


def calibrated_on(
    converter: Any, tf: Any, batches: Callable[[], Iterator[Feeds]], per_channel: bool
) -> None:
    """Set TensorFlow's converter to quantize with these calibration batches (its
    representative dataset, as tensors), per channel or not."""

    def dataset() -> Iterator[dict[str, Any]]:
        for batch in batches():
            yield {name: tf.constant(data) for name, data in batch.items()}

    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = dataset
    converter._experimental_disable_per_channel = not per_channel


def sixteen_by_eight(converter: Any, tf: Any) -> None:
    """TensorFlow's 16x8 mode: int8 weights, int16 activations, int16 I/O."""
    converter.target_spec.supported_ops = [
        tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
    ]
    converter.inference_input_type = converter.inference_output_type = tf.int16


def _run(converter: Any, what: str, hint: str) -> bytes:
    """The converter's model, or an EdgeflowError: `what`, and the converter's first line."""
    try:
        with _onnx2tf._contained():
            return bytes(converter.convert())
    except Exception as exc:  # TensorFlow's converter raises its own ConverterError types
        raise EdgeflowError(
            f"{what} (the SavedModel onnx2tf wrote): {type(exc).__name__}: "
            f"{str(exc).splitlines()[0]}",
            hint or "see docs/debugging.md",
        ) from None


def whole_batches(calibration: Samples | None, inputs: list[TensorSpec]) -> Iterator[Feeds]:
    """The calibration samples in whole batches of the model's batch size (a short last one
    left out); an error when there is not even one. What TensorFlow's converter calibrates
    on (its representative dataset), counted as the calibration's progress."""
    if calibration is None:
        raise AssertionError("int8 conversion without calibration samples")
    batch = batch_size(inputs)
    usable = _onnx2tf.usable(calibration, inputs)
    if usable == 0:
        raise EdgeflowError(
            f"int8 calibration needs at least {batch} samples (the model's batch size); "
            f"got {len(calibration)}",
            "raise calibration.samples",
        )
    batches = (feeds for feeds, size in calibration.batches(batch, fixed=True) if size == batch)
    yield from progress.track(batches, "calibration", usable // batch, unit="batches")


def representative(job: ConvertJob) -> Iterator[Feeds]:
    """Calibration batches as the SavedModel onnx2tf wrote takes them: whole batches of the
    model's batch size, each input cut on its own batch axis and laid out channel-last,
    under onnx2tf's names."""
    for feeds in whole_batches(job.calibration, job.inputs):
        yield {
            _onnx2tf.tf_name(s.name): np.asarray(feeds[s.name], np.float32).transpose(
                job.input_perm(s)
            )
            for s in job.inputs
        }


def quantize(calibrated: bytes, job: ConvertJob, float_nodes: list[str]) -> bytes:
    """The calibrated model quantized to int8 (int8 I/O), `float_nodes` (output tensor
    names) kept float."""
    tf = require("tensorflow", "tflite")
    from tensorflow.lite.python import convert

    return bytes(
        convert.mlir_quantize(
            calibrated,
            disable_per_channel=not job.quantization.per_channel,
            fully_quantize=True,
            input_data_type=tf.int8,
            output_data_type=tf.int8,
            denylisted_nodes=float_nodes or None,
        )
    )
