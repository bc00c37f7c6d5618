"""benchmarks/loss_matrix.py: its cases, one real build's row and the table it prints."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "edgeflow_loss_matrix_benchmark", REPO / "benchmarks" / "loss_matrix.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_cases_skip_modes_a_target_does_not_offer() -> None:
    bench = _benchmark()
    keras = bench.cases("digits_keras", ["tflite_micro", "onnxruntime_micro"], list(bench.MODES))
    found = {(c["target"], c["mode"], c["path"]) for c in keras}
    assert ("tflite_micro", "fp16", "native") not in found  # TFLite Micro has no fp16
    assert ("onnxruntime_micro", "int8_a16", "onnx") not in found  # 16x8: TFLite only
    assert ("onnxruntime_micro", "none", "native") not in found  # native: the TFLite family
    assert {("tflite_micro", "int8_a16", "native"), ("tflite_micro", "int8_a16", "onnx")} <= found
    jax = bench.cases("digits_jax", ["tflite"], ["none"])
    assert [c["path"] for c in jax] == ["onnx"]
    assert "convert.via" not in jax[0]["overrides"]


@pytest.mark.slow
def test_one_build_row_and_table(tmp_path: Path) -> None:
    bench = _benchmark()
    (case,) = [c for c in bench.cases("digits_keras", ["tflite"], ["none"]) if c["path"] == "onnx"]
    row = bench.build(case, tmp_path / "cache", tmp_path / "build")
    assert "failed" not in row, row.get("failed")
    for key in ("accuracy", "drop", "max_abs_diff", "max_relative_diff", "sqnr_db"):
        assert isinstance(row[key], float), key
    for key in ("source_to_onnx", "onnx_to_target"):  # tf2onnx, then the ONNX pipeline
        assert isinstance(row[key], float) and row[key] < 1e-3, key
    assert isinstance(row["size_bytes"], int) and row["size_bytes"] > 0
    text = bench.table([row])
    header = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    assert header == list(bench.COLUMNS)
    cells = [c.strip() for c in text.splitlines()[2].strip("|").split("|")]
    assert len(cells) == len(bench.COLUMNS)
    assert cells[:5] == ["digits_keras", "Keras", "onnx", "tflite", "none"]
