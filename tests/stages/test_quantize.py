"""int8 with onnxruntime's quantizer where float works: opset-11/12 sources, a model its
symbolic shape inference crashes on, a node it cannot quantize; and the calibration methods."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantFormat
from torch import nn

from edgeflow.core.errors import ToolCrashed
from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.recipe import find_recipe, load_recipe
from edgeflow.stages import _ort_quant
from tests.conftest import demo_onnx


class PooledLSTM(nn.Module):
    """An LSTM over the digit's 8 rows, pooled over time by max and min: at opset 18 ReduceMax
    and ReduceMin take `axes` as an input, which onnxruntime's symbolic shape inference
    cannot read (it infers each node without the initializers)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.head = nn.Linear(16, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(image.reshape(image.shape[0], 8, 8))
        return self.head(out.amax(1) * 2.0 + out.amin(1))


def _onnx_recipe(write_recipe, tmp_path: Path, model: str, mode: str = "int8") -> Path:
    from edgeflow.datasets import sklearn_digits

    np.savez(tmp_path / "calib.npz", **sklearn_digits("calibration"))
    return write_recipe(
        f"""
        source:
          kind: onnx
          model: {model}
          inputs: [{{name: image, shape: [1, 1, 8, 8]}}]
        calibration: {{dataset: calib.npz}}
        evaluation: {{dataset: "edgeflow.datasets:sklearn_digits", split: test}}
        quantization: {{mode: {mode}, reduce_range: true}}
        target: onnxruntime_micro
        verify: {{max_accuracy_drop: 0.01, min_top1_agreement: 0.98}}
        """
    )


@pytest.mark.slow
@pytest.mark.parametrize("opset", [11, 12])
def test_int8_of_an_opset_11_or_12_source_is_converted_to_opset_13(
    opset: int, tmp_path: Path, write_recipe
) -> None:
    """Before: convert failed with INVALID_GRAPH ("Unrecognized attribute: axis for operator
    DequantizeLinear"). Measured after: accuracy 0.9889 (source 0.9889), agreement 1.000."""
    path = demo_onnx(tmp_path, opset)  # as Paddle2ONNX and older exporters write them
    assert onnx.load(str(path)).opset_import[0].version == opset
    recipe = _onnx_recipe(write_recipe, tmp_path, "digits.onnx")
    result = run_build(load_recipe(recipe), Cache(tmp_path / "cache"), tmp_path / "build", print)
    assert result.failed_checks == []
    assert result.metrics["accuracy"]["source"] >= 0.97
    assert result.metrics["accuracy"]["drop"] <= 0.01
    assert result.metrics["agreement"]["top1"] >= 0.98
    entry = next((tmp_path / "cache" / "quantize").rglob("quantize.json"))
    info = json.loads(entry.read_text())
    assert info["opset_converted"] == {"from": opset, "to": 13}
    report = (result.build_dir / "report.md").read_text()
    assert f"converted from opset {opset} to 13 for int8" in report


@pytest.mark.slow
def test_int8_of_an_lstm_survives_a_symbolic_shape_inference_crash(
    tmp_path: Path, write_recipe
) -> None:
    """Before: quantize failed with an internal TypeError ("object of type 'NoneType' has no
    len()") in onnxruntime's symbolic_shape_infer.py. Measured after: top-1 agreement 0.9944
    with the float model (random weights, so agreement is the metric)."""
    source = "import torch\nfrom torch import nn\n\n\n" + inspect.getsource(PooledLSTM)
    (tmp_path / "lstm.py").write_text(source, encoding="utf-8")
    recipe = write_recipe(
        """
        source:
          kind: pytorch
          model: lstm.py:PooledLSTM
          inputs: [{name: image, shape: [1, 1, 8, 8]}]
        calibration: {dataset: "edgeflow.datasets:sklearn_digits", split: calibration, samples: 64}
        evaluation: {dataset: "edgeflow.datasets:sklearn_digits", split: test, metric: agreement}
        quantization: {mode: int8}
        target: onnxruntime_micro
        verify: {min_top1_agreement: 0.97}
        """
    )
    lines: list[str] = []
    result = run_build(
        load_recipe(recipe), Cache(tmp_path / "cache"), tmp_path / "build", lines.append
    )
    assert result.failed_checks == []
    assert result.metrics["agreement"]["top1"] >= 0.97
    warning = next(line for line in lines if "symbolic shape inference failed" in line)
    assert "(no shape inferred for the output of ReduceMax" in warning
    entry = next((tmp_path / "cache" / "quantize").rglob("quantize.json"))
    shapes = json.loads(entry.read_text())["shape_inference"]
    assert shapes["symbolic"] is False and "NoneType" in shapes["symbolic_failed"]


def _gemm_with_2d_bias(path: Path) -> None:
    """Flatten -> Gemm whose bias C is [1, 10] (valid ONNX: C broadcasts), which
    onnxruntime 1.32's per-channel quantizer fails on while it quantizes the bias -> MatMul."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["image"], ["flat"], name="flatten"),
            helper.make_node("Gemm", ["flat", "w", "c"], ["hidden"], name="classifier", transB=1),
            helper.make_node("MatMul", ["hidden", "v"], ["logits"], name="head"),
        ],
        "g",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        [
            numpy_helper.from_array(rng.standard_normal((10, 64)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal((1, 10)).astype(np.float32), "c"),
            numpy_helper.from_array(rng.standard_normal((10, 10)).astype(np.float32), "v"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.mark.slow
def test_a_gemm_with_a_2d_bias_is_quantized(tmp_path: Path, write_recipe) -> None:
    """The bias becomes [N] before the quantizer sees it (Gemm broadcasts it the same)."""
    _gemm_with_2d_bias(tmp_path / "gemm.onnx")
    recipe = _onnx_recipe(write_recipe, tmp_path, "gemm.onnx")
    result = run_build(load_recipe(recipe), Cache(tmp_path / "cache"), tmp_path / "build", print)
    entry = json.loads(next((tmp_path / "cache" / "quantize").rglob("quantize.json")).read_text())
    assert entry["shape_inference"]["gemm_biases_flattened"] == 1
    assert entry["refused_by_quantizer"] == []
    assert result.metrics["agreement"]["min_sqnr_db"] > 25


def test_a_node_the_quantizer_fails_on_is_kept_float(tmp_path: Path) -> None:
    """Without the bias fix, onnxruntime's quantizer raises on the Gemm (per channel): it is
    kept float, the error recorded, and the rest quantized; past MAX_REFUSED_NODES such nodes
    the next one stops the build, named."""
    _gemm_with_2d_bias(tmp_path / "gemm.onnx")
    refused: list[dict[str, str]] = []
    options = {"quant_format": QuantFormat.QDQ, "per_channel": True}
    _ort_quant.quantize(tmp_path / "gemm.onnx", tmp_path / "q.onnx", _Image, refused, **options)
    assert [(r["node"], r["op"]) for r in refused] == [("classifier", "Gemm")]
    assert refused[0]["error"].startswith("ValueError: The truth value")
    quantized = onnx.load(str(tmp_path / "q.onnx")).graph.node
    writer = {o: n.op_type for n in quantized for o in n.output}
    gemm = next(n for n in quantized if n.op_type == "Gemm")
    matmul = next(n for n in quantized if n.op_type == "MatMul")
    assert writer.get(gemm.input[1]) is None  # the Gemm float, its weight too
    assert writer.get(matmul.input[1]) == "DequantizeLinear"  # the MatMul after it int8
    others = [
        {"node": f"n{k}", "op": "Op", "error": "E"} for k in range(_ort_quant.MAX_REFUSED_NODES)
    ]
    with pytest.raises(ToolCrashed) as info:  # its limit reached: the next one is named
        _ort_quant.quantize(tmp_path / "gemm.onnx", tmp_path / "q.onnx", _Image, others, **options)
    assert "cannot quantize node 'classifier' (Gemm): ValueError" in info.value.message


class _Image:
    """Calibration batches for the Gemm model."""

    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        self.batches = iter(
            [{"image": rng.standard_normal((1, 1, 8, 8)).astype(np.float32)} for _ in range(4)]
        )

    def get_next(self) -> dict | None:
        return next(self.batches, None)


class _Boom:
    """A calibration reader with a bug: the quantizer calls it, the error is edgeflow's."""

    def get_next(self) -> dict | None:
        raise ZeroDivisionError("a bug in the reader")


def test_an_error_in_edgeflows_own_reader_stays_a_bug(tmp_path: Path) -> None:
    _gemm_with_2d_bias(tmp_path / "gemm.onnx")
    with pytest.raises(ZeroDivisionError):
        _ort_quant.quantize(tmp_path / "gemm.onnx", tmp_path / "q.onnx", _Boom, [])


def test_opset_13_and_above_is_left_as_it_is(tmp_path: Path) -> None:
    _gemm_with_2d_bias(tmp_path / "gemm.onnx")
    assert _ort_quant.upgrade_opset(tmp_path / "gemm.onnx", tmp_path / "out.onnx") is None
    assert not (tmp_path / "out.onnx").exists()


def test_a_model_the_version_converter_cannot_move_is_explained(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Upsample", ["x", "s"], ["y"], mode="nearest")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    onnx.save(model, str(tmp_path / "m.onnx"))
    try:
        info = _ort_quant.upgrade_opset(tmp_path / "m.onnx", tmp_path / "out.onnx")
    except ToolCrashed as exc:
        assert "version converter cannot convert this opset-9 model" in exc.message
    else:  # onnx has an adapter (Upsample -> Resize): converted and valid
        assert info == {"from": 9, "to": 13}
        onnx.checker.check_model(onnx.load(str(tmp_path / "out.onnx")))


# Measured on this machine (x86 without VNNI, 360 test samples), int8 on onnxruntime_micro:
# accuracy (top-1 agreement with the float model, max relative output error) per method;
# source accuracy digits_cnn 0.9889, digits_mobilenet 0.9778.
#   digits_cnn        minmax 0.9889 (1.000, 0.035)  entropy 0.9889 (1.000, 0.210)
#                     percentile 0.9889 (1.000, 0.037)
#   digits_mobilenet  minmax 0.9722 (0.994, 0.102)  entropy 0.9750 (0.992, 0.270)
#                     percentile 0.9750 (0.997, 0.067)
# (Before ENTROPY_BINS, entropy gave minmax's scales exactly: 0.9889 and 0.9722.)
@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["digits_cnn", "digits_mobilenet"])
@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_entropy_and_percentile_calibration_build_and_keep_accuracy(
    recipe: str, method: str, tmp_path: Path, shared_cache: Path
) -> None:
    overrides = {"quantization.mode": "int8", "quantization.method": method}
    loaded = load_recipe(find_recipe(recipe), overrides)
    result = run_build(loaded, Cache(shared_cache), tmp_path, print)
    assert result.metrics["verified"] is True
    assert result.metrics["accuracy"]["drop"] <= 0.011  # at most 4 of 360 samples
    assert f"method={method}" in (result.build_dir / "report.md").read_text()
