"""onnxruntime_micro: an .ort model plus the operator config of a reduced ONNX Runtime build.

Conversion uses onnxruntime's own tool (`onnxruntime.tools.convert_onnx_models_to_ort`, fixed
optimizations, type reduction), its output made byte-reproducible (`_ort_format`); the
artifact is verified by loading the .ort file in onnxruntime, which runs ORT-format models
with the same kernels a minimal build contains.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path
from typing import Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.targets.base import ConvertJob
from edgeflow.targets.onnxruntime_micro._ort_format import canonical
from edgeflow.verify.runners import OnnxRunner

ARTIFACT = "model.ort"
OPS_CONFIG = "required_operators_and_types.config"


def convert(job: ConvertJob) -> dict[str, Any]:
    """Write model.ort and required_operators_and_types.config into the job's folder."""
    onnx_path, out_dir = job.onnx, job.out_dir
    from onnxruntime.tools.convert_onnx_models_to_ort import (
        OptimizationStyle,
        convert_onnx_models_to_ort,
    )

    work = out_dir / ".work"
    work.mkdir()
    shutil.copyfile(onnx_path, work / "model.onnx")
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            convert_onnx_models_to_ort(
                work / "model.onnx",
                output_dir=work / "out",
                optimization_styles=[OptimizationStyle.Fixed],
                enable_type_reduction=True,
            )
    except Exception as exc:
        raise EdgeflowError(f"convert_onnx_models_to_ort failed: {exc}\n{log.getvalue()}") from exc
    # the converter's bytes vary from run to run (hash-map order): identical models, identical
    # files, so a rebuild can be compared byte for byte
    (out_dir / ARTIFACT).write_bytes(canonical((work / "out" / ARTIFACT).read_bytes()))
    config = (work / "out" / "model.required_operators_and_types.config").read_text()
    # The tool writes the temporary path it read into the header; keep the artifact reproducible.
    lines = [ln if not ln.startswith("# - ") else f"# - {ARTIFACT}" for ln in config.splitlines()]
    (out_dir / OPS_CONFIG).write_text("\n".join(lines) + "\n")
    shutil.rmtree(work)
    operators = [ln.split("{")[0] for ln in lines if ln and not ln.startswith("#")]
    return {"artifact": ARTIFACT, "files": [ARTIFACT, OPS_CONFIG], "operators": operators}


def open_runner(artifact_dir: Path, info: dict[str, Any]) -> OnnxRunner:
    return OnnxRunner.from_file(str(artifact_dir / ARTIFACT))
