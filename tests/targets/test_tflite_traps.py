"""Traps of the TFLite runtimes' int8 kernels that edgeflow keeps float
(edgeflow/targets/_tflite_traps.py); here ONE_HOT, whose int8 kernel writes its on/off values
as they are stored while TensorFlow's quantizer stores them on grids of their own.

The model, a byte classifier as file-type detectors are built: int32 bytes [1, 64] of
values 0..15 -> Equal with 0..15 and Cast (onnx2tf makes it a ONE_HOT) -> MatMul + Add ->
Tanh -> ReduceMax over the positions -> MatMul -> 5 logits."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from edgeflow.targets import _tflite_traps
from edgeflow.targets._tflite_graph import tflite_graph
from tests.targets.conftest import needs_tflite

SAMPLES, LENGTH, VALUES = 32, 64, 16


def one_hot_classifier() -> object:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array([1, LENGTH, 1], np.int64), "column"),
        numpy_helper.from_array(np.arange(VALUES, dtype=np.int32).reshape(1, 1, -1), "values"),
        numpy_helper.from_array(rng.normal(size=(VALUES, 8)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(size=(1, 1, 8)).astype(np.float32) * 0.1, "b1"),
        numpy_helper.from_array(rng.normal(size=(8, 5)).astype(np.float32), "w2"),
    ]
    node = helper.make_node
    nodes = [
        node("Reshape", ["bytes", "column"], ["b3"]),
        node("Equal", ["b3", "values"], ["hot"]),
        node("Cast", ["hot"], ["one_hot"], to=TensorProto.FLOAT),
        node("MatMul", ["one_hot", "w1"], ["e"]),
        node("Add", ["e", "b1"], ["eb"]),
        node("Tanh", ["eb"], ["t"]),
        node("ReduceMax", ["t"], ["pooled"], axes=[1], keepdims=0),
        node("MatMul", ["pooled", "w2"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "bytes",
        [helper.make_tensor_value_info("bytes", TensorProto.INT32, [1, LENGTH])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def inputs() -> np.ndarray:
    return np.random.default_rng(1).integers(0, VALUES, (SAMPLES, LENGTH)).astype(np.int32)


RECIPE = """
    source: {kind: onnx, model: model.onnx, inputs: [{name: bytes, shape: [1, 64], dtype: int32}]}
    evaluation: {dataset: data.npz, metric: agreement, outputs: {logits: {kind: classes}}}
    calibration: {dataset: data.npz}
    quantization: {mode: int8}
    target: TARGET
    precheck: {continue_on_failure: true}
    verify: {min_sqnr_db: 25, latency_runs: 1, warmup_runs: 0}
"""


@needs_tflite
def test_tensorflows_int8_one_hot_writes_its_off_value_on_another_grid(tmp_path: Path) -> None:
    """The trap itself: TensorFlow's quantizer alone gives the off value 0.0 a grid of its own
    (zero point 0) where the output's zero point is -128, so LiteRT writes 0.5 for it."""
    import onnx
    import tensorflow as tf
    from tensorflow.lite.python import convert

    from edgeflow.data import Samples
    from edgeflow.schema.sections import Quantization, TensorSpec
    from edgeflow.targets import _onnx2tf, _tflite_quant, load_profile
    from edgeflow.targets.base import ConvertJob

    onnx.save(one_hot_classifier(), str(tmp_path / "model.onnx"))
    job = ConvertJob(
        onnx=tmp_path / "model.onnx",
        out_dir=tmp_path,
        profile=load_profile("tflite"),
        quantization=Quantization(mode="int8"),
        inputs=[TensorSpec(name="bytes", shape=[1, LENGTH], dtype="int32")],
        calibration=Samples({"bytes": inputs()}, None),
    )
    with _onnx2tf.outputs(job, "tflite", _tflite_quant.own_int8) as (out, _):
        float32 = (out / "model_float32.tflite").read_bytes()
        calibrated = _tflite_quant.calibrate(job, out)
    (kept,) = _tflite_traps.kept_float(float32, "tflite")
    assert kept.key == "float_copies" and len(kept.names) == 1
    plain = bytes(
        convert.mlir_quantize(
            calibrated, fully_quantize=True, input_data_type=tf.int8, output_data_type=tf.int8
        )
    )
    assert _tflite_traps.trapped(plain, "tflite") == _tflite_traps.COPIES_WHY
    graph = tflite_graph(plain, "tflite")
    (op,) = [op for op in graph.ops if op.name == "ONE_HOT"]
    output, off = graph.grids[op.outputs[0]], graph.grids[op.inputs[3]]
    assert output is not None and off is not None and output[1] == -128 and off[1] == 0
    fixed = _tflite_quant.quantize(calibrated, True, [], target="tflite")
    assert _tflite_traps.trapped(fixed, "tflite") == ""
    assert "ONE_HOT" in [op.name for op in tflite_graph(fixed, "tflite").ops]


@needs_tflite
def test_an_int8_build_keeps_its_one_hot_float_and_verifies(
    tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Measured 2026-12: 42.7 dB, every top-1 kept; with the ONE_HOT int8 as TensorFlow's
    quantizer makes it, 1.6 dB (magika's bytes: top-1 agreement 0.062). TFLite Micro and Arm
    NN have no ONE_HOT."""
    import onnx

    from edgeflow.cli import main

    onnx.save(one_hot_classifier(), str(tmp_path / "model.onnx"))
    np.savez(tmp_path / "data.npz", bytes=inputs())
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(RECIPE.replace("TARGET", "tflite")))
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    code = main(args)
    build = tmp_path / "b" / "recipe" / "tflite-int8"
    metrics = json.loads((build / "metrics.json").read_text())
    assert code == 0, capsys.readouterr().err
    assert metrics["verified"] and metrics["agreement"]["top1"] == 1.0
    assert metrics["agreement"]["min_sqnr_db"] > 30
    report = (build / "report.md").read_text()
    assert "1 ONE_HOT float" in report


def scaled_by_norm() -> object:
    """x [1, 8, 16] -> MatMul -> Tanh -> t * Sqrt(ReduceSum(t * t, last axis)): a square
    root TFLite Micro runs in float32 only (onnx2tf makes t / ReduceL2(t) an RSQRT, which has
    an int8 kernel)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(16, 16)).astype(np.float32) * 0.5, "w"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
    ]
    node = helper.make_node
    nodes = [
        node("MatMul", ["x", "w"], ["h"]),
        node("Tanh", ["h"], ["t"]),
        node("Mul", ["t", "t"], ["squares"]),
        node("ReduceSum", ["squares", "axes"], ["total"], keepdims=1),
        node("Sqrt", ["total"], ["norm"]),
        node("Mul", ["t", "norm"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "scaled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    return model


@needs_tflite
def test_tflite_micro_runs_the_ops_it_has_no_int8_kernel_for_float(
    tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TFLite Micro has float32 SQRT, EXP and LOG but no int8 ones (measured: its builtins
    lists); the int8 build keeps them float and the precheck says so (a warning, where it
    refused the model before)."""
    import onnx

    from edgeflow.cli import main
    from edgeflow.targets import load_profile

    assert {"SQRT", "EXP", "LOG"} <= _tflite_traps.runtime_float_kernels("tflite_micro")
    assert _tflite_traps.runtime_float_kernels("tflite") == frozenset()
    assert load_profile("tflite_micro").operators["Sqrt"].kept_float
    onnx.save(scaled_by_norm(), str(tmp_path / "model.onnx"))
    x = np.random.default_rng(1).normal(size=(SAMPLES, 8, 16)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=x)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        textwrap.dedent(
            """
            source: {kind: onnx, model: model.onnx, inputs: [{name: x, shape: [1, 8, 16]}]}
            evaluation: {dataset: data.npz, metric: agreement, outputs: {y: {kind: embedding}}}
            calibration: {dataset: data.npz}
            quantization: {mode: int8}
            target: tflite_micro
            verify: {min_sqnr_db: 25, latency_runs: 1, warmup_runs: 0}
            """
        )
    )
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    code = main(args)
    out = capsys.readouterr()
    build = tmp_path / "b" / "recipe" / "tflite_micro-int8"
    assert code == 0, out.err
    assert "no int8 SQRT kernel: the int8 build runs it float" in out.out + out.err
    metrics = json.loads((build / "metrics.json").read_text())
    assert metrics["verified"] and metrics["agreement"]["min_sqnr_db"] > 30  # 34.4 measured
    assert metrics["agreement"]["outputs"]["y"]["cosine_min"] > 0.999
    graph = tflite_graph((build / "model.tflite").read_bytes(), "tflite")
    (sqrt,) = [op for op in graph.ops if op.name == "SQRT"]
    assert graph.types[sqrt.outputs[0]] == "FLOAT32"
    assert "has no int8 kernel for SQRT" in (build / "report.md").read_text()
