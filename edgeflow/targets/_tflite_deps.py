"""The TFLite family's optional tools: imported when first needed (TensorFlow costs seconds
and ~550 MB), or a MissingDependency that names the pip package."""

from __future__ import annotations

import importlib
from types import ModuleType

from edgeflow.core.errors import MissingDependency

# module -> the pip distribution that provides it
PACKAGES = {
    "onnx2tf": "onnx2tf",
    "tensorflow": "tensorflow",
    "tf_keras": "tf-keras",
    "onnx_graphsurgeon": "onnx-graphsurgeon",
    "sng4onnx": "sng4onnx",
    "psutil": "psutil",
    "ai_edge_litert": "ai-edge-litert",
    "tflite_micro": "tflite-micro",
    "ethosu": "ethos-u-vela",  # Arm's Vela (the ethos_u target)
}


def require(module: str, target: str) -> ModuleType:
    """Import an optional tool (slow: TensorFlow costs seconds), or say how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = (exc.name or module).split(".")[0]
        raise MissingDependency(
            f"target {target}", PACKAGES.get(missing, missing), "tflite"
        ) from exc
