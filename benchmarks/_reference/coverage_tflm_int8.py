"""By hand, in one process: a coverage model's build for tflite_micro int8 (128x128 input).

The same tool calls as edgeflow's build of benchmarks/coverage.py's recipe for the model
with `target=tflite_micro quantization=int8`: the model (benchmarks/coverage_models.py,
seeded random weights) on the 16 evaluation crops (the reference outputs), the dynamo ONNX
export (opset 18), onnx2tf with the options edgeflow/targets/_onnx2tf.py passes (per-channel
full-integer int8, int8 input and output, the 16 calibration crops as NHWC .npy, the stand-in
sample file onnx2tf would otherwise download), the int8 .tflite run in the tflite-micro
interpreter on the evaluation crops, 2 warm-up and 10 timed latency runs. The arena is the
coverage board's 8 MiB (edgeflow also measures the smallest arena that allocates). Prints
what it measured.

    python benchmarks/_reference/coverage_tflm_int8.py OUT_DIR [--model resnet18] [--size 128]

Needs torchvision (docs/coverage.md: run it in the coverage environment).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
from pathlib import Path

import numpy as np

from edgeflow.datasets import sample_image_crops

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _export import reference_and_export  # beside this script
from coverage_models import build

ARENA = 8 * 1024 * 1024  # the coverage benchmark's board
SAMPLE_FILE = "calibration_image_sample_data_20x128x128x3_float32.npy"


def main(out: Path, name: str, size: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = build(name, image_size=size)
    options = {"size": [size, size], "count": 16, "input_name": "image"}
    test = sample_image_crops("test", **options)["image"]
    calibration = sample_image_crops("calibration", **options)["image"]

    onnx_path = out / "model.onnx"
    reference = reference_and_export(model, test, onnx_path, "output")

    # TensorFlow after torch and torchvision: torchvision imported after it crashes (SIGSEGV)
    import onnx2tf
    from tflite_micro import runtime

    work = out / "onnx2tf"
    work.mkdir(exist_ok=True)
    np.save(work / "calibration.npy", calibration.transpose(0, 2, 3, 1))  # NHWC
    rng = np.random.default_rng(0)  # onnx2tf reads this file instead of downloading it
    np.save(work / SAMPLE_FILE, rng.random((20, 32, 32, 3), dtype=np.float32))
    log = io.StringIO()
    home = os.getcwd()
    os.chdir(work)
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            onnx2tf.convert(
                input_onnx_file_path=str(onnx_path),
                output_folder_path=str(work / "out"),
                verbosity="warn",
                output_integer_quantized_tflite=True,
                quant_type="per-channel",
                custom_input_op_name_np_data_path=[
                    ["image", str(work / "calibration.npy"), 0.0, 1.0]
                ],
                input_quant_dtype="int8",
                output_quant_dtype="int8",
            )
    finally:
        os.chdir(home)
    artifact = work / "out" / "model_full_integer_quant.tflite"

    interp = runtime.Interpreter.from_file(str(artifact), arena_size=ARENA)
    inp, outp = interp.get_input_details(0), interp.get_output_details(0)
    in_q, out_q = inp["quantization_parameters"], outp["quantization_parameters"]
    in_scale, in_zero = in_q["scales"][0], in_q["zero_points"][0]
    out_scale, out_zero = out_q["scales"][0], out_q["zero_points"][0]

    def run(x: np.ndarray) -> np.ndarray:
        nhwc = x[None].transpose(0, 2, 3, 1)
        q = np.clip(np.round(nhwc / in_scale + in_zero), -128, 127).astype(np.int8)
        interp.set_input(q, 0)
        interp.invoke()
        return (np.array(interp.get_output(0)).astype(np.float32) - out_zero) * out_scale

    outputs = np.concatenate([run(x) for x in test])
    for _ in range(2):
        run(test[0])
    times = []
    for _ in range(10):
        start = time.perf_counter()
        run(test[0])
        times.append((time.perf_counter() - start) * 1e3)
    agreement = float((outputs.argmax(1) == reference.argmax(1)).mean())
    relative = float(np.abs(outputs - reference).max() / np.abs(reference).max())
    print(
        f"{name} {size}x{size}: top-1 agreement {agreement:.4f}, relative diff {relative:.3f}, "
        f"p50 {float(np.median(times)):.1f} ms, {artifact.stat().st_size:,} bytes"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--size", type=int, default=128)
    args = parser.parse_args()
    main(args.out, args.model, args.size)
