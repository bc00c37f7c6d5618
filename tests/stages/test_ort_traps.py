"""What onnxruntime's int8 turns into NaN, kept float (edgeflow/stages/_ort_quant.py
float_infinities): a masked softmax's -inf mask value, which no int8 grid holds.

The model, a spectrum classifier as pitch and audio models are built: x[1, 16] spectra
spanning four decades -> MatMul -> + 1e-8 -> Log -> MatMul -> Where(mask, ., -inf) ->
Pad(-inf) -> Softmax -> probabilities[1, 10]."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeflow.stages import _ort_quant

SAMPLES = 64


def spectrum_classifier() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    mask = np.array([[True] * 6 + [False] * 2])
    inits = [
        numpy_helper.from_array(np.abs(rng.normal(size=(16, 16))).astype(np.float32), "w1"),
        numpy_helper.from_array(np.array(1e-8, np.float32), "eps"),
        numpy_helper.from_array(rng.normal(size=(16, 8)).astype(np.float32) * 0.3, "w2"),
        numpy_helper.from_array(mask, "mask"),
        numpy_helper.from_array(np.array(-np.inf, np.float32), "minus_inf"),
        numpy_helper.from_array(np.array([0, 0, 0, 2], np.int64), "pads"),
    ]
    node = helper.make_node
    nodes = [
        node("MatMul", ["x", "w1"], ["power"], name="mel"),
        node("Add", ["power", "eps"], ["floored"], name="floor"),
        node("Log", ["floored"], ["log"], name="log"),
        node("MatMul", ["log", "w2"], ["scores"], name="head"),
        node("Where", ["mask", "scores", "minus_inf"], ["masked"], name="mask_out"),
        node("Pad", ["masked", "pads", "minus_inf"], ["padded"], name="pad"),
        node("Softmax", ["padded"], ["probabilities"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "spectrum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def spectra() -> np.ndarray:
    """Four decades of power per bin, a quarter of the bins silent (exactly 0)."""
    rng = np.random.default_rng(1)
    x = 10.0 ** rng.uniform(-4, 0, (SAMPLES, 16))
    x[rng.random((SAMPLES, 16)) < 0.25] = 0.0
    return x.astype(np.float32)


def test_the_trapped_nodes_are_found_from_the_graph() -> None:
    model = spectrum_classifier()
    assert _ort_quant.float_infinities(model) == ["mask_out", "pad", "softmax"]


RECIPE = """
    source: {kind: onnx, model: model.onnx, inputs: [{name: x, shape: [1, 16]}]}
    evaluation:
      dataset: data.npz
      metric: agreement
      outputs: {probabilities: {kind: probability, threshold: 0.5}}
    calibration: {dataset: data.npz}
    quantization: {mode: int8}
    target: onnxruntime_micro
    verify: {min_sqnr_db: 10, latency_runs: 1, warmup_runs: 0}
"""


@pytest.mark.slow
def test_an_int8_build_with_an_infinite_mask_value_stays_finite(
    tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Measured 2026-12: with the mask's readers kept float, 36.4 dB; without, 0 dB (the Where's
    int8 grid has an infinite scale, and its DequantizeLinear writes NaN). The Log of the
    spectrum needs nothing: its eps Add stays float in onnxruntime's Q/DQ model."""
    from edgeflow.cli import main

    onnx.save(spectrum_classifier(), str(tmp_path / "model.onnx"))
    np.savez(tmp_path / "data.npz", x=spectra())
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(RECIPE))
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    code = main(args)
    build = tmp_path / "b" / "recipe" / "onnxruntime_micro-int8"
    metrics = json.loads((build / "metrics.json").read_text())
    assert code == 0, capsys.readouterr().err
    assert metrics["verified"] and metrics["agreement"]["min_sqnr_db"] > 20
    report = (build / "report.md").read_text()
    assert "3 nodes float: they read an infinite constant" in report
