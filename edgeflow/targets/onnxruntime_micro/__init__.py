"""ONNX Runtime minimal builds: the model as .ort with its required-operators config."""

from edgeflow.targets.registry import Backend

BACKEND = Backend(
    name="onnxruntime_micro",
    summary="ONNX Runtime minimal build: .ort file and its required-operators config",
    module="edgeflow.targets.onnxruntime_micro.backend",
    artifact=".ort",
    converter="onnxruntime's convert_onnx_models_to_ort",
    operators_from="kernels",
    # flatbuffers: edgeflow rewrites the .ort kernel type table (_ort_format.py)
    tools=("onnxruntime", "flatbuffers", "host:int8"),
    quantizes_itself=False,
    refused_modes={},
    calibration=("minmax", "entropy", "percentile"),
    qat=True,
    int16_activations=False,
    fallback=True,
    saturating_int8=True,
    tensorflow_native=False,
    layout="declared",
    intermediates=True,
    bisect=True,
    npu=False,
    tflite=None,
)
