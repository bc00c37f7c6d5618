"""LiteRT (TensorFlow Lite): a .tflite written by onnx2tf, run in ai-edge-litert."""

from edgeflow.targets.registry import Backend, TfliteRuntime

BACKEND = Backend(
    name="tflite",
    summary="LiteRT (TensorFlow Lite): .tflite run in ai-edge-litert",
    module="edgeflow.targets.tflite.backend",
    artifact=".tflite",
    converter="onnx2tf",
    operators_from="probes",
    # its files come from onnx2tf or TensorFlow's converter (targets/_onnx2tf.py,
    # _tf_native.py), as for tflite_micro and armnn, which declare what differs from this
    tools=("tensorflow", "onnx2tf", "ai-edge-litert", "flatbuffers"),
    quantizes_itself=True,  # onnx2tf calibrates int8 itself from the recipe's samples
    refused_modes={},
    calibration=("minmax", "percentile", "mse"),
    # onnx2tf calibrates again and cannot carry Q/DQ scales into a .tflite (its issue 680)
    qat=False,
    int16_activations=True,
    fallback=True,
    saturating_int8=False,
    tensorflow_native=True,
    layout="channel_last",
    intermediates=True,
    bisect=True,
    npu=False,
    tflite=TfliteRuntime(
        reference=True,
        arena=False,
        while_loops=True,
        rank0_outputs=True,
        kept_dims_fully_connected=True,
        fully_connected_without_bias=True,
        # LiteRT's int8 UNIDIRECTIONAL_SEQUENCE_LSTM computes stacked layers wrong
        sequence_lstm=("none", "fp16"),
        reference_int8_softmax=False,
    ),
)
