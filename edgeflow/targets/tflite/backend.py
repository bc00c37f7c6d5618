"""tflite: a .tflite model for LiteRT (TensorFlow Lite) on phones and embedded Linux.

Conversion: onnx2tf (TensorFlow's converter underneath), which also quantizes: float32,
float16 weights, or full-integer int8 calibrated on the recipe's samples. Verified with
LiteRT's own interpreter (ai_edge_litert), the runtime such devices use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.core.errors import EdgeflowError
from edgeflow.targets import _onnx2tf, _tflite_fallback
from edgeflow.targets._tflite_deps import require
from edgeflow.targets._tflite_io import CStderr, Quant, TfliteRunner
from edgeflow.targets._tflite_quant import own_int8
from edgeflow.targets.base import ConvertJob

TARGET = "tflite"


def convert(job: ConvertJob) -> dict[str, Any]:
    """Write model.tflite (float32, float16 or full-integer int8) into the job's folder."""
    return _onnx2tf.convert(job, TARGET, _tflite_fallback.hook(job, TARGET, LiteRtRunner), own_int8)


def convert_native(job: Any, check: Any) -> dict[str, Any]:
    """A TensorFlow source's .tflite by TensorFlow's own converter (convert.via: native)."""
    from edgeflow.targets import _tf_native

    return _tf_native.convert(job, TARGET, check)


def runtime_version() -> str:
    """The runtime as a measured profile's header names it."""
    from edgeflow.targets._onnx2tf import _version

    return f"ai-edge-litert {_version('ai-edge-litert')}"


def open_runner(artifact_dir: Path, info: dict[str, Any]) -> LiteRtRunner:
    return LiteRtRunner(artifact_dir / info["artifact"], info["io"])


def tflite_runner(path: Path, layout: dict[str, Any]) -> LiteRtRunner:
    """Any .tflite file (a probe's, one with every tensor an output) in this runtime."""
    return LiteRtRunner(path, layout)


class LiteRtRunner(TfliteRunner):
    """The artifact in ai_edge_litert's Interpreter (CPU, XNNPACK for float kernels)."""

    def __init__(self, path: Path, io: dict[str, Any]) -> None:
        litert = require("ai_edge_litert.interpreter", TARGET)
        err = CStderr()  # LiteRT logs to C-level stderr ("Created ... XNNPACK delegate")
        try:
            with err:
                self.interp = litert.Interpreter(model_path=str(path))
                self.interp.allocate_tensors()
        except (RuntimeError, ValueError) as exc:
            raise EdgeflowError(
                f"LiteRT cannot load {path.name}: {exc}\n{err.text()}".strip(),
                "an operator LiteRT lacks (e.g. a Flex op) needs a rewrite rule",
            ) from None
        ins, outs = self.interp.get_input_details(), self.interp.get_output_details()
        self.in_index = [d["index"] for d in ins]
        self.out_index = [d["index"] for d in outs]
        super().__init__(io, [_quant(d) for d in ins], [_quant(d) for d in outs])

    def _reset(self) -> None:
        self.interp.reset_all_variables()

    def _set(self, pos: int, data: np.ndarray) -> None:
        self.interp.set_tensor(self.in_index[pos], data)

    def _invoke(self) -> None:
        try:
            self.interp.invoke()
        except RuntimeError as exc:
            raise EdgeflowError(f"LiteRT failed to run the model: {exc}") from None

    def _get(self, pos: int) -> np.ndarray:
        return self.interp.get_tensor(self.out_index[pos])


def _quant(detail: dict[str, Any]) -> Quant:
    scale, zero_point = detail["quantization"]
    return Quant(detail["dtype"], float(scale), int(zero_point))
