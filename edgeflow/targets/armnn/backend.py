"""armnn: a .tflite model run by Arm NN's TfLite parser on its CpuRef backend.

Conversion is the tflite target's (onnx2tf), with the int8 settings Arm NN takes: per-tensor
(the profile sets `int8: {per_channel: false}`; Arm NN aborts the process on per-channel int8
fully-connected layers). The artifact runs in Debian's Arm NN (python3-pyarmnn,
libarmnn-cpuref-backend22, libarmnntfliteparser22), which is built for the system Python, not
edgeflow's: `_armnn_worker.py` runs under that interpreter (EDGEFLOW_ARMNN_PYTHON, default
/usr/bin/python3) in its own process, fed over a pipe. When Arm NN aborts, the pipe closes and
the stage fails with Arm NN's own message and the signal, instead of taking the pipeline down.
Arm NN is also seen to compute some graphs wrongly without an error (grouped convolutions):
verify compares every output with the source model, as for every target.

Latency figures include the pipe transfer of inputs and outputs (an .npz each way).
"""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import subprocess
import tempfile
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.core.errors import EdgeflowError, ToolCrashed
from edgeflow.targets import _onnx2tf, _tflite_fallback
from edgeflow.targets._tflite_io import Quant, TfliteRunner
from edgeflow.targets._tflite_quant import own_int8
from edgeflow.targets.base import ConvertJob

TARGET = "armnn"
WORKER = Path(__file__).with_name("_armnn_worker.py")
BACKEND = "CpuRef"
PACKAGES = "python3-pyarmnn libarmnn-cpuref-backend22 libarmnntfliteparser22"
INSTALL = f"install Arm NN with: apt-get update && apt-get install -y {PACKAGES}"


def convert(job: ConvertJob) -> dict[str, Any]:
    """Write model.tflite, as the tflite target does, with Arm NN's int8 settings."""
    _modes(job.quantization.mode)
    return _onnx2tf.convert(job, TARGET, _tflite_fallback.hook(job, TARGET, ArmnnRunner), own_int8)


def convert_native(job: Any, check: Any) -> dict[str, Any]:
    """A TensorFlow source's .tflite by TensorFlow's own converter (convert.via: native),
    which Arm NN's TfLite parser reads as it reads onnx2tf's."""
    from edgeflow.targets import _tf_native

    _modes(job.quantization.mode)
    return _tf_native.convert(job, TARGET, check)


def _modes(mode: str) -> None:
    """int8_weights, whatever a profile lists: Arm NN's CpuRef refuses hybrid layers
    (tests/targets/test_int8_weights.py)."""
    if mode == "int8_weights":
        raise EdgeflowError(
            f"target {TARGET} has no int8_weights kernels: Arm NN's CpuRef refuses TFLite's "
            "dynamic-range layers (input and weights types mismatched)",
            "use quantization.mode int8 (or none)",
        )


def runtime_version() -> str:
    """The runtime as a measured profile's header names it (pyarmnn's, under its Python)."""
    try:
        run = subprocess.run(
            [python(), "-c", "import pyarmnn; print(pyarmnn.ARMNN_VERSION)"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "Arm NN not installed (CpuRef)"
    return f"Arm NN {run.stdout.strip()} (CpuRef)"


def kernel_symbols() -> tuple[Path, str, str]:
    """Where the runtime registers its kernels: (library, symbol pattern, what they are)."""
    library = Path("/usr/lib/x86_64-linux-gnu/libarmnnTfLiteParser.so.22")
    return library, r"TfLiteParser::Parse([A-Za-z0-9]+)\(", "TfLite parser functions"


def open_runner(artifact_dir: Path, info: dict[str, Any]) -> ArmnnRunner:
    return ArmnnRunner(artifact_dir / info["artifact"], info["io"])


def python() -> str:
    return os.environ.get("EDGEFLOW_ARMNN_PYTHON", "/usr/bin/python3")


def tflite_runner(path: Path, layout: dict[str, Any]) -> ArmnnRunner:
    """Any .tflite file (a probe's, one with every tensor an output) in this runtime."""
    return ArmnnRunner(path, layout)


class ArmnnRunner(TfliteRunner):
    """The artifact in Arm NN (CpuRef), behind a pipe to a worker process."""

    def __init__(self, path: Path, io_layout: dict[str, Any]) -> None:
        if not Path(python()).is_file():
            raise EdgeflowError(
                f"target armnn needs Debian's Python with pyarmnn; no Python at {python()}",
                INSTALL,
            )
        self.errors = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the worker
        self.proc = subprocess.Popen(
            [python(), str(WORKER), str(path), BACKEND],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
        )
        # closed when the runner is collected, or at interpreter exit while the subprocess
        # module still works (a __del__ then found its globals cleared)
        weakref.finalize(self, _close, self.proc)
        received = self._receive()
        if received is None:
            raise self._failure("loading the model")
        meta = json.loads(str(received[0]))
        self.version = meta["version"]
        quant = [
            [Quant(np.dtype(t["dtype"]), t["scale"], t["zero_point"]) for t in meta[side]]
            for side in ("inputs", "outputs")
        ]
        super().__init__(io_layout, quant[0], quant[1])
        self.feeds: dict[int, np.ndarray] = {}
        self.results: list[np.ndarray] = []

    def _reset(self) -> None:
        pass  # Arm NN 22's parser has no operator that keeps a state between runs

    def _set(self, pos: int, data: np.ndarray) -> None:
        self.feeds[pos] = data

    def _invoke(self) -> None:
        self._send([self.feeds[i] for i in range(len(self.inputs))])
        results = self._receive()
        if results is None:
            raise self._failure("running the model")
        self.results = results

    def _get(self, pos: int) -> np.ndarray:
        return self.results[pos]

    def extra_metrics(self) -> dict[str, Any]:
        return {"armnn_version": self.version, "armnn_backend": BACKEND}

    def _send(self, arrays: list[np.ndarray]) -> None:
        buf = io.BytesIO()
        np.savez(buf, *arrays)
        body = buf.getvalue()
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(struct.pack("<Q", len(body)) + body)
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._failure("receiving the inputs") from None

    def _receive(self) -> list[np.ndarray] | None:
        assert self.proc.stdout is not None
        head = self.proc.stdout.read(8)
        if len(head) < 8:
            return None
        (size,) = struct.unpack("<Q", head)
        with np.load(io.BytesIO(self.proc.stdout.read(size))) as data:
            if "meta" in data.files:
                return [data["meta"]]
            return [data[f"arr_{i}"] for i in range(len(data.files))]

    def _failure(self, doing: str) -> EdgeflowError:
        """Arm NN ended the worker: its message, and how it ended."""
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.errors.seek(0)
        text = self.errors.read().decode(errors="replace")
        if "No module named 'pyarmnn'" in text:
            return EdgeflowError(f"target armnn needs pyarmnn ({python()}): {INSTALL}")
        lines = [ln for ln in text.splitlines() if "does not support" not in ln]
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        tail = "\n".join(lines[-15:]) or "(no message)"
        return ToolCrashed(
            f"Arm NN failed while {doing} ({how}):\n{tail}",
            "Arm NN lacks or mishandles an operator of this graph; see the armnn target in "
            "docs/targets.md (its int8 settings, known failures)",
        )


def _close(proc: subprocess.Popen[bytes]) -> None:
    """End a worker: its stdin closed, killed if it has not exited in 10 s."""
    if proc.poll() is None:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
