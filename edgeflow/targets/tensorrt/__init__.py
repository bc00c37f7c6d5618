"""TensorRT: the ONNX model its builder parses, and the engine where a CUDA GPU is present."""

from edgeflow.targets.registry import Backend

BACKEND = Backend(
    name="tensorrt",
    summary="NVIDIA TensorRT: the ONNX model, built into an engine where a CUDA GPU is present",
    module="edgeflow.targets.tensorrt.backend",
    artifact=".onnx",
    converter="TensorRT's builder",
    operators_from="docs",
    tools=("tensorrt", "polygraphy"),
    quantizes_itself=False,
    refused_modes={
        "int8_weights": "TensorRT's parser has no DynamicQuantizeLinear, MatMulInteger or "
        "ConvInteger (onnxruntime's weight-only form)",
    },
    calibration=("minmax", "entropy", "percentile"),
    qat=True,
    int16_activations=False,
    fallback=False,
    saturating_int8=False,
    tensorflow_native=False,
    layout="declared",
    intermediates=False,  # the engine runs on a GPU this machine may not have
    bisect=False,
    npu=False,
    tflite=None,
)
