"""Arm NN 22 (Debian's): a .tflite through its TfLite parser, run on the CpuRef backend."""

from edgeflow.targets.registry import TfliteRuntime, like
from edgeflow.targets.tflite import BACKEND as LITERT

# onnx2tf's .tflite, as for LiteRT (edgeflow/targets/tflite/__init__.py), with these differences
BACKEND = like(
    LITERT,
    name="armnn",
    summary="Arm NN 22: .tflite through its TfLite parser, run on CpuRef (in its own process)",
    module="edgeflow.targets.armnn.backend",
    tools=(*LITERT.tools, "debian:*armnn*"),  # Arm NN by its Debian packages' versions
    refused_modes={
        "fp16": "Arm NN's TfLite parser rejects fp16 .tflite files",
        "int8_weights": "Arm NN 22's CpuRef refuses TFLite's dynamic-range files (\"input and "
        'weights types mismatched"; a per-channel FULLY_CONNECTED aborts the process)',
    },
    int16_activations=False,
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
