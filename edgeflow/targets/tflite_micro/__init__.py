"""TensorFlow Lite Micro: a .tflite run in the tflite-micro interpreter, with its arena."""

from edgeflow.targets.registry import TfliteRuntime, like
from edgeflow.targets.tflite import BACKEND as LITERT

# onnx2tf's .tflite, as for LiteRT (edgeflow/targets/tflite/__init__.py), with these differences
BACKEND = like(
    LITERT,
    name="tflite_micro",
    summary="TensorFlow Lite Micro: .tflite run in the tflite-micro interpreter, arena measured",
    module="edgeflow.targets.tflite_micro.backend",
    tools=(*LITERT.tools, "tflite-micro"),
    refused_modes={
        "fp16": "TFLite Micro has no float16 kernels",
        "int8_weights": "TFLite Micro has no hybrid kernels (int8 weights with float activations)",
    },
    tflite=TfliteRuntime(
        reference=False,
        arena=True,
        while_loops=True,
        rank0_outputs=True,
        kept_dims_fully_connected=True,
        fully_connected_without_bias=True,
        sequence_lstm=("none", "fp16", "int8"),
        reference_int8_softmax=True,
    ),
)
