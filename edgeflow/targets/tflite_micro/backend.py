"""tflite_micro: a .tflite model for TensorFlow Lite for Microcontrollers, plus its arena size.

Conversion: onnx2tf, as for `tflite` (float32 or full-integer int8; TFLM has no float16 or
hybrid kernels). Verified with the tflite-micro Python interpreter, which runs TFLM's own C++
kernels: the convert stage measures the smallest tensor arena the model allocates in, and the
verify stage runs every sample with exactly that arena. TFLM writes its real errors
("Didn't find op for builtin opcode ...") to C-level stderr; they are captured and reported.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.core.errors import EdgeflowError
from edgeflow.targets import _onnx2tf, _tflite_fallback
from edgeflow.targets._tflite_deps import require
from edgeflow.targets._tflite_io import CStderr, Quant, TfliteRunner
from edgeflow.targets._tflite_quant import own_int8
from edgeflow.targets.base import ConvertJob

TARGET = "tflite_micro"
ARENA_LIMIT = 256 * 1024 * 1024  # the largest arena tried; far above any microcontroller
_TOTAL = re.compile(r"Arena allocation total (\d+) bytes")
_ALLOC_FAILURE = ("Failed to allocate", "Failed starting model allocation")


def convert(job: ConvertJob) -> dict[str, Any]:
    """Write model.tflite; fail with TFLM's own error text when TFLM cannot load it."""
    _modes(job.quantization.mode)
    info = _onnx2tf.convert(
        job, TARGET, _tflite_fallback.hook(job, TARGET, _trial_runner), own_int8
    )
    return _with_arena(job.out_dir, info)


def convert_native(job: Any, check: Any) -> dict[str, Any]:
    """A TensorFlow source's .tflite by TensorFlow's own converter (convert.via: native)."""
    from edgeflow.targets import _tf_native

    _modes(job.quantization.mode)
    return _with_arena(job.out_dir, _tf_native.convert(job, TARGET, check))


def _modes(mode: str) -> None:
    if mode not in ("none", "int8"):
        raise EdgeflowError(
            f"target {TARGET} has no {mode} kernels", "use quantization.mode int8 (or none)"
        )


def _with_arena(out_dir: Path, info: dict[str, Any]) -> dict[str, Any]:
    """The convert info with the smallest arena the artifact allocates in."""
    minimum, recorded = measure_arena((out_dir / info["artifact"]).read_bytes())
    info["arena_bytes"] = minimum
    info["arena_recorded_bytes"] = recorded  # RecordingMicroAllocator's total, for reference
    return info


def _trial_runner(path: Path, io: dict[str, Any]) -> MicroRunner:
    """A mix of quantization.fallback in TFLM, in the smallest arena it allocates in."""
    model = path.read_bytes()
    return MicroRunner(model, io, measure_arena(model)[0])


def runtime_version() -> str:
    """The runtime as a measured profile's header names it."""
    from edgeflow.targets._onnx2tf import _version

    return f"tflite-micro {_version('tflite-micro')}"


def kernel_symbols() -> tuple[Path, str, str]:
    """Where the runtime registers its kernels: (library, symbol pattern, what they are)."""
    import tflite_micro

    library = Path(tflite_micro.__file__).parent / "python/tflite_micro/_runtime.so"
    return library, r"Register_([A-Z0-9_]+)", "registered kernels"


def open_runner(artifact_dir: Path, info: dict[str, Any]) -> MicroRunner:
    model = (artifact_dir / info["artifact"]).read_bytes()
    arena = info.get("arena_bytes") or measure_arena(model)[0]
    return MicroRunner(model, info["io"], arena)


def tflite_runner(path: Path, layout: dict[str, Any]) -> MicroRunner:
    """Any .tflite file (a probe's, one with every tensor an output) in TFLite Micro."""
    model = path.read_bytes()
    return MicroRunner(model, layout, measure_arena(model)[0])


def _load(model: bytes, arena: int, err: CStderr) -> Any:
    """A TFLM interpreter with `arena` bytes, or None when allocation fails (text in err)."""
    runtime = require("tflite_micro", TARGET).runtime
    with err:
        try:
            return runtime.Interpreter.from_bytes(model, arena_size=arena)
        except RuntimeError:
            return None


def measure_arena(model: bytes) -> tuple[int, int]:
    """The smallest arena_size (bytes) in which TFLM allocates the model's tensors, and the
    total that TFLM's recording allocator reports (a few bytes more: alignment)."""
    err = CStderr()
    interp = _load(model, ARENA_LIMIT, err)
    if interp is None:
        text = err.text() or "(no message)"
        if any(s in text for s in _ALLOC_FAILURE):
            raise EdgeflowError(
                f"TFLite Micro cannot allocate the model in {ARENA_LIMIT:,} bytes:\n{text}",
                "the model is far too large for a microcontroller",
            )
        raise EdgeflowError(
            f"TFLite Micro rejects the model:\n{text}",
            "an operator or type TFLM lacks needs a rewrite rule; see docs/debugging.md",
        )
    with err:
        interp.print_allocations()
    found = _TOTAL.search(err.text())
    del interp
    recorded = int(found.group(1)) if found else 0
    # The recorded total usually allocates, but not always (kernels that take temporary
    # buffers in Prepare); loading with too small an arena can crash: the search tries it.
    return _search(model, recorded), recorded


def _search(model: bytes, guess: int) -> int:
    """The smallest arena that allocates, starting from a guess (below it when it allocates,
    doubling up when not). Too small an arena can crash TFLM, so the attempts run in a
    child process (_arena_search.py); a size that kills it counts as one that does not
    allocate, and the search goes on in a new child."""
    import subprocess
    import sys
    import tempfile

    script = Path(__file__).with_name("_arena_search.py")
    low, high = 0, 0  # low does not allocate; high does (0: none known yet)
    with tempfile.TemporaryDirectory(prefix="edgeflow-arena-") as tmp:
        path = Path(tmp) / "model.tflite"
        path.write_bytes(model)
        for _ in range(64):  # each crash raises `low`: a few restarts at most
            run = subprocess.run(
                # -P: not this folder on sys.path (its tflite_micro.py would shadow the package)
                [sys.executable, "-P", str(script), str(path), str(low), str(high), str(guess)],
                capture_output=True,
                text=True,
                check=False,
            )
            crashed_at = None
            for line in run.stdout.split():
                word, _, size = line.partition(":")
                if word == "min":
                    return int(size)
                crashed_at = int(size) if word == "try" else None  # a try with no answer
                if word == "fail":
                    low = max(low, int(size))
                elif word == "ok":
                    high = int(size) if high <= 0 else min(high, int(size))
            if crashed_at is not None:
                low = max(low, crashed_at)
            if high > 0 and (run.returncode == 0 or high - low <= 1):
                return high
    raise EdgeflowError(f"TFLite Micro: no arena size found between {low:,} and {high:,} bytes")


class MicroRunner(TfliteRunner):
    """The artifact in the tflite-micro interpreter with a fixed arena."""

    def __init__(self, model: bytes, io: dict[str, Any], arena_bytes: int) -> None:
        self.err = CStderr()
        self.arena_bytes = arena_bytes
        self.interp = _load(model, arena_bytes, self.err)
        if self.interp is None:
            raise EdgeflowError(
                f"TFLite Micro cannot load the model with a {arena_bytes:,}-byte arena:\n"
                f"{self.err.text()}"
            )
        n_in, n_out = len(io["inputs"]), len(io["outputs"])
        ins = [_quant(self.interp.get_input_details(i)) for i in range(n_in)]
        outs = [_quant(self.interp.get_output_details(i)) for i in range(n_out)]
        super().__init__(io, ins, outs)

    def _reset(self) -> None:
        self.interp.reset()

    def _set(self, pos: int, data: np.ndarray) -> None:
        self.interp.set_input(data, pos)

    def _invoke(self) -> None:
        with self.err:
            try:
                self.interp.invoke()
                return
            except RuntimeError:
                pass
        raise EdgeflowError(f"TFLite Micro failed to run the model:\n{self.err.text()}")

    def _get(self, pos: int) -> np.ndarray:
        return np.array(self.interp.get_output(pos))

    def extra_metrics(self) -> dict[str, Any]:
        return {"arena_bytes": self.arena_bytes}


def _quant(detail: dict[str, Any]) -> Quant:
    params = detail.get("quantization_parameters") or {}
    scales, zero_points = params.get("scales", []), params.get("zero_points", [])
    if len(scales) == 0:
        return Quant(detail["dtype"])
    return Quant(detail["dtype"], float(scales[0]), int(zero_points[0]))
