"""tensorrt: an ONNX model TensorRT accepts, plus a serialized engine where a GPU is present.

The artifact is the optimized ONNX model as the quantize stage left it: float32, float16, or
int8 as explicit QuantizeLinear/DequantizeLinear pairs with zero point 0 (the profile imposes
symmetric int8, which TensorRT requires). Where the `tensorrt` package and a CUDA GPU are
present, the TensorRT builder parses it and builds `model.engine` (FP16 or INT8 flags to
match), and the verify stage runs the engine through polygraphy's TensorRT runner. Where they
are not (CI, most laptops), the build still writes the ONNX artifact, and verify reports
"not verified" with the reason, in metrics.json (verified: false) and report.md: nothing is
compared that did not run on TensorRT.

benchmarks/tensorrt_gpu.sh installs what TensorRT needs and runs this target end to end on a
GPU machine.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.targets.base import ConvertJob, NotVerified

ARTIFACT = "model.onnx"
ENGINE = "model.engine"
WORKSPACE = 1 << 30


def gpu_unavailable() -> str | None:
    """Why no TensorRT engine can be built or run here; None when one can."""
    import ctypes.util

    if ctypes.util.find_library("cuda") is None:
        return "no GPU (no CUDA driver, libcuda, on this machine)"
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return "no TensorRT: install it with benchmarks/tensorrt_gpu.sh (pip install tensorrt)"
    try:
        from polygraphy.backend.trt import TrtRunner  # noqa: F401
    except ImportError:
        return "no polygraphy: install it (pip install polygraphy) to run TensorRT engines"
    return None


def convert(job: ConvertJob) -> dict[str, Any]:
    if job.quantization.mode == "int8_weights":  # whatever a profile lists
        raise EdgeflowError(
            "target tensorrt has no int8_weights form: TensorRT's parser has no "
            "DynamicQuantizeLinear, MatMulInteger or ConvInteger",
            "use quantization.mode int8, fp16 (or none)",
        )
    shutil.copyfile(job.onnx, job.out_dir / ARTIFACT)
    info: dict[str, Any] = {"artifact": ARTIFACT, "files": [ARTIFACT]}
    why = gpu_unavailable()
    if why is not None:
        info["engine"] = None
        info["not_verified"] = why
        return info
    info.update(_build_engine(job))
    info["files"].append(ENGINE)
    return info


def _build_engine(job: ConvertJob) -> dict[str, Any]:
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse((job.out_dir / ARTIFACT).read_bytes()):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise EdgeflowError(
            "TensorRT's ONNX parser rejects the model:\n" + "\n".join(errors),
            "see the tensorrt profile's operator notes; docs/targets.md",
        )
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE)
    mode = job.quantization.mode
    if mode == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    if mode == "int8":
        config.set_flag(trt.BuilderFlag.INT8)  # explicit quantization: scales come from QDQ
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise EdgeflowError("the TensorRT builder failed; its log is above")
    (job.out_dir / ENGINE).write_bytes(bytes(engine))
    return {"engine": ENGINE, "tensorrt": trt.__version__}


def open_runner(artifact_dir: Path, info: dict[str, Any]) -> Any:
    if not info.get("engine"):
        raise NotVerified(info.get("not_verified") or "no TensorRT engine was built")
    why = gpu_unavailable()
    if why is not None:  # built elsewhere, verified here: still no GPU
        raise NotVerified(why)
    return EngineRunner((artifact_dir / ENGINE).read_bytes())


class EngineRunner:
    """A TensorRT engine behind the runner interface (feeds -> list of output arrays)."""

    def __init__(self, engine: bytes) -> None:
        import tensorrt as trt
        from polygraphy.backend.trt import EngineFromBytes, TrtRunner

        self.runner = TrtRunner(EngineFromBytes(engine))
        self.runner.activate()
        built = self.runner.engine
        names = [built.get_tensor_name(i) for i in range(built.num_io_tensors)]
        self.names = [n for n in names if built.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]

    def run(self, feeds: dict[str, Any]) -> list[Any]:
        outputs = self.runner.infer(feeds)
        return [outputs[name] for name in self.names]
