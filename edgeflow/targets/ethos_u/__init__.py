"""Arm Ethos-U NPUs: the int8 .tflite of tflite_micro, compiled for the NPU by Arm's Vela."""

from edgeflow.targets.registry import like
from edgeflow.targets.tflite_micro import BACKEND as TFLITE_MICRO

# The .tflite is made as for TFLite Micro, whose reference kernels verify it (the NPU is
# specified to match them on the operators it runs) and run what Vela leaves on the CPU;
# with these differences:
BACKEND = like(
    TFLITE_MICRO,
    name="ethos_u",
    summary="Arm Ethos-U NPU: int8 .tflite compiled by Vela, verified on TFLite Micro's kernels",
    module="edgeflow.targets.ethos_u.backend",
    converter="onnx2tf, then Arm's Vela",
    operators_from="compiler",
    tools=(*TFLITE_MICRO.tools, "ethos-u-vela"),
    refused_modes={
        "none": "the Ethos-U NPU has no float path: Vela compiles int8 models only",
        "fp16": "the Ethos-U NPU has no float path: Vela compiles int8 models only",
        "int8_weights": "the Ethos-U NPU runs no hybrid kernels (int8 weights, float "
        "activations): Vela compiles full-integer int8 models only",
    },
    # not measured here: a mix's float layers (Vela leaves them to the CPU), and 16x8 models
    fallback=False,
    int16_activations=False,
    npu=True,
)
