"""Arm NN 22 (Debian's): a .tflite through its TfLite parser, run on the CpuRef backend."""

from edgeflow.targets.registry import Backend, TfliteRuntime
from edgeflow.targets.tflite import TFLITE_TOOLS

BACKEND = Backend(
    name="armnn",
    summary="Arm NN 22: .tflite through its TfLite parser, run on CpuRef (in its own process)",
    module="edgeflow.targets.armnn.backend",
    artifact=".tflite",
    converter="onnx2tf",
    operators_from="probes",
    tools=(*TFLITE_TOOLS, "debian:*armnn*"),  # Arm NN by its Debian packages' versions
    quantizes_itself=True,
    refused_modes={
        "fp16": "Arm NN's TfLite parser rejects fp16 .tflite files",
        "int8_weights": "Arm NN 22's CpuRef refuses TFLite's dynamic-range files (\"input and "
        'weights types mismatched"; a per-channel FULLY_CONNECTED aborts the process)',
    },
    calibration=("minmax", "percentile", "mse"),
    qat=False,
    int16_activations=False,
    fallback=True,
    saturating_int8=False,
    tensorflow_native=True,
    layout="channel_last",
    intermediates=True,
    bisect=True,
    tflite=TfliteRuntime(
        reference=False,
        arena=False,
        while_loops=False,
        rank0_outputs=False,
        kept_dims_fully_connected=False,
        fully_connected_without_bias=False,
        sequence_lstm=(),
        reference_int8_softmax=False,
    ),
)
