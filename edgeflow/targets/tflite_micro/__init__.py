"""TensorFlow Lite Micro: a .tflite run in the tflite-micro interpreter, with its arena."""

from edgeflow.targets.registry import Backend, TfliteRuntime
from edgeflow.targets.tflite import TFLITE_TOOLS

BACKEND = Backend(
    name="tflite_micro",
    summary="TensorFlow Lite Micro: .tflite run in the tflite-micro interpreter, arena measured",
    module="edgeflow.targets.tflite_micro.backend",
    artifact=".tflite",
    converter="onnx2tf",
    operators_from="probes",
    tools=(*TFLITE_TOOLS, "tflite-micro"),
    quantizes_itself=True,
    refused_modes={
        "fp16": "TFLite Micro has no float16 kernels",
        "int8_weights": "TFLite Micro has no hybrid kernels (int8 weights with float activations)",
    },
    calibration=("minmax", "percentile", "mse"),
    qat=False,
    int16_activations=True,
    fallback=True,
    saturating_int8=False,
    tensorflow_native=True,
    layout="channel_last",
    intermediates=True,
    bisect=True,
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
