"""The int8 DIV trap of the TFLite family (edgeflow/targets/_tflite_div.py): a divisor computed
in the graph that rounds to its int8 zero point stops LiteRT's DIV, and the precheck's
warning and the build's float DIV that avoid it.

The model: a normalisation h / (mean(relu(h)) + 1e-5) after a Conv without bias, on inputs of
which every fourth is silent (all zeros): there the divisor is 1e-5, below half a step of its
int8 grid."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from edgeflow.schema.sections import Quantization, TensorSpec
from edgeflow.targets import _onnx2tf, _tflite_div, _tflite_quant, load_profile
from edgeflow.targets.base import ConvertJob
from edgeflow.targets.precheck import check
from tests import needs
from tests.targets.conftest import needs_tflite

SAMPLES = 64
SILENT = np.arange(SAMPLES) % 4 == 0


def normalised(variant: str = "div") -> object:
    """x[1,1,8,8] -> Conv(1->8, no bias) -> h / (mean(relu(h)) + 1e-5) -> Relu -> Conv -> y;
    `reciprocal`: h * Reciprocal(...) instead of the Div; `constant`: h / 4."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(8, 1, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(size=(8, 8, 3, 3)).astype(np.float32) * 0.3, "w2"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        numpy_helper.from_array(np.array(4.0, np.float32), "four"),
    ]
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1]),
        node("Relu", ["h"], ["r"]),
        node("ReduceMean", ["r"], ["m"], axes=[1, 2, 3], keepdims=1),
        node("Add", ["m", "eps"], ["s"]),
    ]
    if variant == "reciprocal":
        nodes += [node("Reciprocal", ["s"], ["inv"]), node("Mul", ["h", "inv"], ["n"])]
    else:
        nodes.append(node("Div", ["h", "four" if variant == "constant" else "s"], ["n"]))
    nodes += [node("Relu", ["n"], ["a"]), node("Conv", ["a", "w2"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes,
        "normalised",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def inputs() -> np.ndarray:
    data = np.random.default_rng(1).normal(size=(SAMPLES, 1, 8, 8)).astype(np.float32)
    data[SILENT] = 0.0
    return data


def _div_findings(model: object, target: str, mode: str) -> list[object]:
    return [f for f in check(model, load_profile(target), mode) if f.reason.startswith("int8:")]


@pytest.mark.parametrize("target", ["tflite", "tflite_micro", "armnn"])
def test_the_precheck_warns_of_a_computed_divisor_in_int8(target: str) -> None:
    (found,) = _div_findings(normalised(), target, "int8")
    assert (found.operator, found.severity, found.count, found.rule) == ("Div", "warning", 1, "")
    assert found.reason.startswith("int8: divides by s, a tensor computed in the graph: ")
    assert "the int8 build keeps the DIV float" in found.reason
    runtime = {"tflite": "stops the run", "tflite_micro": "-89.9", "armnn": "isnan"}[target]
    assert runtime in found.reason
    (recip,) = _div_findings(normalised("reciprocal"), target, "int8")
    assert recip.operator == "Reciprocal"
    # float builds, a constant divisor and the onnxruntime family have no such trap
    assert _div_findings(normalised(), target, "none") == []
    assert _div_findings(normalised("constant"), target, "int8") == []
    assert _div_findings(normalised(), "onnxruntime_micro", "int8") == []


def _job(tmp_path: Path, model: object, mode: str = "int8") -> ConvertJob:
    import onnx

    from edgeflow.data import Samples

    onnx.save(model, str(tmp_path / "model.onnx"))
    return ConvertJob(
        onnx=tmp_path / "model.onnx",
        out_dir=tmp_path,
        profile=load_profile("tflite"),
        quantization=Quantization(mode=mode),  # type: ignore[arg-type]
        inputs=[TensorSpec(name="x", shape=[1, 1, 8, 8])],
        calibration=Samples({"x": inputs()}, None),
    )


def _run(model: bytes) -> np.ndarray:
    """Every sample through LiteRT (NHWC, int8 I/O), dequantized."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=model)
    interp.allocate_tensors()
    (i,), (o,) = interp.get_input_details(), interp.get_output_details()
    outs = []
    for sample in inputs().transpose(0, 2, 3, 1):
        scale, zero = i["quantization"]
        interp.set_tensor(i["index"], np.round(sample[None] / scale + zero).astype(np.int8))
        interp.invoke()
        scale, zero = o["quantization"]
        outs.append((interp.get_tensor(o["index"]).astype(np.float32) - zero) * scale)
    return np.concatenate(outs)


def _sqnr(model: object, out: np.ndarray) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString())  # type: ignore[attr-defined]
    ref = np.concatenate([session.run(None, {"x": s[None]})[0] for s in inputs()])
    ref = ref.transpose(0, 2, 3, 1)
    return float(10 * np.log10(np.sum(ref**2) / np.sum((ref - out) ** 2)))


@needs_tflite
def test_an_int8_div_by_a_computed_divisor_stops_litert_and_its_float_div_runs(
    tmp_path: Path,
) -> None:
    """TensorFlow's quantizer alone makes the DIV int8 and LiteRT stops on a silent frame;
    with the DIV and the ADD of its eps float (what _tflite_quant.quantize keeps), it runs
    at 34.8 dB; with the DIV alone float, 0 / 0 on the silent frames (-6.3 dB)."""
    import tensorflow as tf
    from tensorflow.lite.python import convert

    model = normalised()
    job = _job(tmp_path, model)
    with _onnx2tf.outputs(job, "tflite", _tflite_quant.own_int8) as (out, _):
        float32 = (out / "model_float32.tflite").read_bytes()
        calibrated = _tflite_quant.calibrate(job, out)
        assert _tflite_div.trapped((out / "model_full_integer_quant.tflite").read_bytes()) == 0
    kept = _tflite_div.float_divisions(float32)
    assert len(kept) == 2 and kept[1].endswith("Add")  # the DIV (its Relu fused) and the ADD

    def plain(denylisted: list[str]) -> bytes:
        return bytes(
            convert.mlir_quantize(
                calibrated,
                fully_quantize=True,
                input_data_type=tf.int8,
                output_data_type=tf.int8,
                denylisted_nodes=denylisted or None,
            )
        )

    trapped = plain([])
    assert _tflite_div.trapped(trapped) == 1
    with pytest.raises(RuntimeError, match=r"div\.cc.*data\[i\] != zero_point"):
        _run(trapped)
    assert _sqnr(model, _run(plain(kept[:1]))) == pytest.approx(-6.3, abs=0.5)  # 0 / 0
    fixed = _tflite_quant.quantize(calibrated, True, [])
    assert _tflite_div.trapped(fixed) == 0
    assert _sqnr(model, _run(fixed)) == pytest.approx(34.8, abs=0.3)


@needs_tflite
def test_float_divisions_follow_the_divisor_to_its_eps_and_a_reciprocal_to_its_mul(
    tmp_path: Path,
) -> None:
    """What stays float in a float .tflite: the DIV and the ADD of the eps (not the MEAN nor
    the RELU before it); of a reciprocal (DIV of 1), also the MUL by it, whose int8 range
    would otherwise take 1 / 1e-5 from the silent frames."""
    found = {}
    for variant in ("div", "reciprocal", "constant"):
        job = _job(tmp_path, normalised(variant), "none")
        with _onnx2tf.outputs(job, "tflite") as (out, _):
            found[variant] = _tflite_div.float_divisions(
                (out / "model_float32.tflite").read_bytes()
            )
    assert [n.rsplit("/", 1)[-1] for n in found["div"]][1:] == ["Add"]
    assert len(found["reciprocal"]) == 3 and "Mul" in found["reciprocal"][2]
    assert found["constant"] == []  # onnx2tf makes it a MUL


RECIPE = """
    source: {kind: onnx, model: model.onnx, inputs: [{name: x, shape: [1, 1, 8, 8]}]}
    evaluation: {dataset: data.npz, metric: agreement, outputs: {y: {kind: values}}}
    calibration: {dataset: data.npz}
    quantization: {mode: int8}
    target: TARGET
    verify: {min_sqnr_db: 30, latency_runs: 1, warmup_runs: 0}
"""


@needs_tflite
@pytest.mark.parametrize(
    "target",
    ["tflite", "tflite_micro", pytest.param("armnn", marks=needs.mark("armnn"))],
)
def test_an_int8_build_with_a_computed_divisor_runs_and_verifies(
    target: str, tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: LiteRT stopped ('div.cc:262 data[i] != zero_point'), Arm NN aborted (NaN
    quantized) and TFLite Micro ran (0 / 0 gives its 0); now each verifies (measured
    2026-12: 34.8 dB, 34.8 dB, and 34.8 dB on Arm NN, per-channel convolutions; 34.1 dB with
    per-tensor weights everywhere)."""
    import onnx

    from edgeflow.cli import main

    onnx.save(normalised(), str(tmp_path / "model.onnx"))
    np.savez(tmp_path / "data.npz", x=inputs())
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(RECIPE.replace("TARGET", target)))
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0, capsys.readouterr().err
    build = tmp_path / "b" / "recipe" / f"{target}-int8"
    metrics = json.loads((build / "metrics.json").read_text())
    assert metrics["verified"]
    expected = {"tflite": 34.8, "tflite_micro": 34.8, "armnn": 34.8}[target]
    assert metrics["agreement"]["min_sqnr_db"] == pytest.approx(expected, abs=0.3)
    precheck = json.loads((build / "precheck.json").read_text())
    assert precheck["passed"] and [f["operator"] for f in precheck["findings"]] == ["Div"]
    report = (build / "report.md").read_text()
    assert "2 operators float: each DIV by a computed divisor" in report


KERAS = """
import keras


class Normalise(keras.layers.Layer):
    def call(self, h):
        return h / (keras.ops.mean(keras.ops.relu(h), axis=(1, 2, 3), keepdims=True) + 1e-5)


def build():
    keras.utils.set_random_seed(0)
    image = keras.Input((8, 8, 1), name="image")
    h = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(image)
    h = keras.layers.Activation("relu")(Normalise()(h))
    return keras.Model(image, keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(h))
"""

NATIVE = """
    source: {kind: tensorflow, model: model.py:build, inputs: [{name: image, shape: [1, 8, 8, 1]}]}
    calibration: {dataset: data.npz}
    evaluation: {dataset: data.npz, metric: agreement}
    quantization: {mode: int8}
    target: TARGET
    verify: {min_sqnr_db: 30, latency_runs: 1, warmup_runs: 0}
"""


@needs_tflite
@pytest.mark.parametrize("target", ["tflite", pytest.param("armnn", marks=needs.mark("armnn"))])
def test_tensorflows_own_converter_gets_the_same_float_div(
    target: str, tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same normalisation in Keras, converted natively (convert.via: native): TensorFlow's
    converter writes the int8 DIV (LiteRT stopped, Arm NN aborted); the build quantizes the
    float model again with the DIV and its ADD float: 34.2 dB, 34.1 on Arm NN (2026-12)."""
    from edgeflow.cli import main

    (tmp_path / "model.py").write_text(KERAS, encoding="utf-8")
    np.savez(tmp_path / "data.npz", image=inputs().transpose(0, 2, 3, 1))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(NATIVE.replace("TARGET", target)))
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0, capsys.readouterr().err
    build = tmp_path / "b" / "recipe" / f"{target}-int8"
    metrics = json.loads((build / "metrics.json").read_text())
    expected = {"tflite": 34.2, "armnn": 34.1}[target]
    assert metrics["agreement"]["min_sqnr_db"] == pytest.approx(expected, abs=0.3)
    report = (build / "report.md").read_text()
    assert "2 operators float: each DIV by a computed divisor" in report
