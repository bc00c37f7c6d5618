"""By hand, in one process: the demo's build for onnxruntime_micro int8 (recipes/digits_cnn.yaml).

The same tool calls as `edgeflow run recipe=digits_cnn target=onnxruntime_micro
quantization=int8`: the PyTorch model on the 360 test samples (the reference outputs), the
dynamo ONNX export, onnxruntime's quant_pre_process and quantize_static (QDQ, per-channel,
7-bit weights, MinMax, on the 180 calibration samples), convert_onnx_models_to_ort, the .ort
run on the test samples, 10 warm-up and 100 timed latency runs. Prints what it measured.

    python benchmarks/_reference/digits_ort_int8.py OUT_DIR
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from _export import reference_and_export  # beside this script
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process
from onnxruntime.tools.convert_onnx_models_to_ort import (
    OptimizationStyle,
    convert_onnx_models_to_ort,
)

from edgeflow.datasets import sklearn_digits
from edgeflow.zoo.digits import DigitsCNN

REPO = Path(__file__).resolve().parents[2]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = DigitsCNN(num_classes=10)
    weights = torch.load(REPO / "models" / "digits_cnn.pt", weights_only=True)
    model.load_state_dict(weights)
    model.eval()
    test = sklearn_digits("test")
    calibration = sklearn_digits("calibration")["image"][:180]
    images, labels = test["image"], test["label"]

    onnx_path = out / "model.onnx"
    reference = reference_and_export(model, images, onnx_path, "logits")

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter(calibration)

        def get_next(self) -> dict | None:
            x = next(self.samples, None)
            return None if x is None else {"image": x[None]}

    prepared, quantized = out / "preprocessed.onnx", out / "ort" / "model.onnx"
    quantized.parent.mkdir(exist_ok=True)
    quant_pre_process(str(onnx_path), str(prepared), skip_symbolic_shape=False)
    quantize_static(
        str(prepared),
        str(quantized),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        reduce_range=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
        extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
    )
    convert_onnx_models_to_ort(
        quantized,
        output_dir=out / "ort_out",
        optimization_styles=[OptimizationStyle.Fixed],
        enable_type_reduction=True,
    )

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        str(out / "ort_out" / "model.ort"), options, providers=["CPUExecutionProvider"]
    )
    outputs = np.concatenate([session.run(None, {"image": x[None]})[0] for x in images])
    feeds = {"image": images[:1]}
    for _ in range(10):
        session.run(None, feeds)
    times = []
    for _ in range(100):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - start) * 1e3)
    accuracy = float((outputs.argmax(1) == labels).mean())
    source = float((reference.argmax(1) == labels).mean())
    agreement = float((outputs.argmax(1) == reference.argmax(1)).mean())
    print(
        f"accuracy {accuracy:.4f} (source {source:.4f}), top-1 agreement {agreement:.4f}, "
        f"max abs diff {float(np.abs(outputs - reference).max()):.3f}, "
        f"p50 {float(np.median(times)):.3f} ms, "
        f"{(out / 'ort_out' / 'model.ort').stat().st_size:,} bytes"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
