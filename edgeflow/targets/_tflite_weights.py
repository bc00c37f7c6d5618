"""The TFLite family's float-activation files: float32, float16 weights (fp16) and int8 weights
(int8_weights), each from one TensorFlow converter as onnx2tf makes them, on every path (the
ONNX path's Keras model or SavedModel, and the native TensorFlow path).

int8_weights is TensorFlow's dynamic-range quantization: optimizations DEFAULT and no
representative dataset. Each weight of 1,024 elements or more (TensorFlow 2.21's threshold)
is stored as symmetric int8, per output channel unless quantization.per_channel is false;
activations stay float32, and the runtime's hybrid kernels (FULLY_CONNECTED, CONV_2D, ...)
quantize each input per inference (LiteRT hands them to XNNPACK). Measured 2026-12: LiteRT
runs such files; TFLite Micro has no hybrid kernels, and Arm NN 22's CpuRef refuses them
("input and weights types mismatched", and a per-channel FULLY_CONNECTED aborts the process),
so only tflite offers the mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The file of each float-activation mode in the converter's output folder (onnx2tf's names).
FILES = {
    "none": "model_float32.tflite",
    "fp16": "model_float16.tflite",
    "int8_weights": "model_dynamic_range_quant.tflite",
}


def write(converter: Any, tf: Any, out: Path, mode: str, per_channel: bool) -> None:
    """model_float32.tflite into `out`, and for fp16 or int8_weights that mode's file too,
    from the same converter (its other settings as the caller made them)."""
    (out / FILES["none"]).write_bytes(converter.convert())
    if mode in ("fp16", "int8_weights"):
        reduced(converter, tf, mode, per_channel)
        (out / FILES[mode]).write_bytes(converter.convert())


def reduced(converter: Any, tf: Any, mode: str, per_channel: bool) -> None:
    """Set the converter to write the weights of `mode`: float16 (fp16) or int8 with float
    activations (int8_weights: dynamic range, no representative dataset)."""
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if mode == "fp16":
        converter.target_spec.supported_types = [tf.float16]
    elif mode == "int8_weights":
        converter._experimental_disable_per_channel = not per_channel
    else:
        raise AssertionError(f"no reduced weights for quantization mode {mode}")


def record(float32: bytes, artifact: bytes, per_channel: bool) -> dict[str, Any]:
    """convert.json's int8_weights entry: the scheme, the int8 weight tensors the file holds
    (and how many of them are per channel), and the bytes of its constants against the
    float32 file's."""
    from edgeflow.targets._tflite_deps import require

    schema = require("ai_edge_litert.schema_py_generated", "tflite")
    model = schema.Model.GetRootAs(artifact, 0)
    tensors, channels = 0, 0
    for g in range(model.SubgraphsLength()):
        graph = model.Subgraphs(g)
        for i in range(graph.TensorsLength()):
            tensor = graph.Tensors(i)
            if tensor.Type() == schema.TensorType.INT8 and tensor.Buffer() > 0:
                tensors += 1
                quant = tensor.Quantization()
                channels += quant is not None and quant.ScaleLength() > 1
    return {
        "per_channel": per_channel,
        "scheme": (
            "TFLite dynamic range: symmetric int8 weights"
            + (" per output channel" if per_channel else " per tensor")
            + " (tensors of 1,024 elements or more), float32 activations, quantized per "
            "inference inside the hybrid kernels; nothing calibrated"
        ),
        "int8_tensors": tensors,
        "per_channel_tensors": channels,
        "weights": {"float_bytes": _constant_bytes(float32), "bytes": _constant_bytes(artifact)},
    }


def _constant_bytes(model: bytes) -> int:
    """The bytes of a .tflite's buffers (its constants)."""
    from edgeflow.targets._tflite_deps import require

    schema = require("ai_edge_litert.schema_py_generated", "tflite")
    parsed = schema.Model.GetRootAs(model, 0)
    buffers = (parsed.Buffers(i) for i in range(parsed.BuffersLength()))
    return sum(b.Size() or b.DataLength() for b in buffers)
