"""ethos_u: the int8 .tflite of tflite_micro, compiled by Arm's Vela for an Ethos-U NPU.

Conversion: exactly the tflite_micro build (onnx2tf, full-integer int8; its arena
measured), then Vela (targets/ethos_u/_vela.py) with the profile's accelerator, system
configuration and memory mode writes `model_vela.tflite`, the file the device loads, and
reports where each operator runs (NPU or CPU, with Vela's reason), the SRAM and flash it
plans, and cycles it estimates. Both .tflite files are the build's artifact.

Verification: no Ethos-U hardware or simulator is reachable here. The pre-Vela model runs
in TFLite Micro's reference kernels against the source (the verify stage, as for
tflite_micro), and Arm tests Vela by comparing the NPU's results with those reference
kernels bit for bit; the operators Vela leaves on the CPU run in TFLite Micro on the device
too, and the verify stage ran them there. The NPU's figures of time are Vela's estimates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.targets import tflite_micro
from edgeflow.targets.base import ConvertJob
from edgeflow.targets.ethos_u import _vela
from edgeflow.targets.tflite_micro.backend import MicroRunner

TARGET = "ethos_u"
NPU_OPERATOR = "CUSTOM:ethos-u"  # what Vela makes of each part it places on the NPU


def convert(job: ConvertJob) -> dict[str, Any]:
    """model.tflite as for tflite_micro, then model_vela.tflite by Vela."""
    _vela.version()  # before the conversion: the missing compiler is said first
    return _compiled(job, tflite_micro.backend.convert(job))


def convert_native(job: Any, check: Any) -> dict[str, Any]:
    """A TensorFlow source's .tflite by TensorFlow's own converter, then Vela."""
    _vela.version()
    return _compiled(job, tflite_micro.backend.convert_native(job, check))


def _compiled(job: ConvertJob, info: dict[str, Any]) -> dict[str, Any]:
    if job.profile is None or job.profile.npu is None:  # a probe's or prefix's trial
        return info
    npu = _vela.compile_for(job.out_dir / info["artifact"], job.profile.npu, job.out_dir)
    npu["cpu_builtins"] = _left_to_the_cpu(job, info["artifact"], npu["deployed"])
    info["files"] = [*info["files"], *npu.pop("files")]
    info["deployed"] = npu["deployed"]  # what the device loads; the artifact is verified
    info["npu"] = npu
    info["converter"] = f"{info.get('converter', 'onnx2tf')}, then {npu['compiler']}"
    return info


def _left_to_the_cpu(job: ConvertJob, verified: str, deployed: str) -> list[str]:
    """The builtins Vela left in model_vela.tflite for the CPU, each one TFLite Micro was seen
    to run: in the verified model.tflite (the verify stage runs it whole), or measured by the
    profile's probes in this mode. Any other stops the build: the device could not run it."""
    from edgeflow.targets import emitted

    left = left_on_cpu(job.out_dir / deployed)
    ran = set(emitted.counts(job.out_dir / verified, TARGET))
    measured = job.profile.builtins.get(job.quantization.mode)
    probed = set(measured.runs) if measured else set()
    unseen = [n for n in left if n not in ran and n.split("(")[0] not in probed]
    if unseen:
        raise EdgeflowError(
            f"Vela left {', '.join(unseen)} on the CPU, which TFLite Micro was not seen to run "
            f"in {job.quantization.mode}: neither the verified model.tflite has it nor the "
            "profile's probes",
            "an Ethos-U85 places more operators on the NPU (target.accelerator=ethos-u85-256); "
            "else report it with the build's vela_per_layer.csv",
        )
    return sorted(left)


def left_on_cpu(deployed: Path) -> list[str]:
    """The builtins Vela left in a compiled .tflite for the CPU (all but its NPU operator)."""
    from edgeflow.targets import emitted

    return [n for n in emitted.counts(deployed, TARGET) if n != NPU_OPERATOR]


def runtime_version() -> str:
    return tflite_micro.backend.runtime_version()


def kernel_symbols() -> tuple[Path, str, str]:
    return tflite_micro.backend.kernel_symbols()


def open_runner(artifact_dir: Path, info: dict[str, Any]) -> MicroRunner:
    """The pre-Vela model in TFLite Micro's reference kernels, in its measured arena."""
    return tflite_micro.backend.open_runner(artifact_dir, info)


def tflite_runner(path: Path, layout: dict[str, Any]) -> MicroRunner:
    return tflite_micro.backend.tflite_runner(path, layout)
